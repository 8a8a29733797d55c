"""Schema of the weight broadcast (`echo2.broadcast`): mode, chunking, tree shape, timeouts, limits.

One `BroadcastConfig` is shared by the learner (origin), the coordinator (topology) and every
worker (relay and fetch), so all three agree on chunk size, timeouts and limits. Each timeout
says why it has its value; the validators keep the timeouts consistent with each other.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from echo2.config.base import Frozen


class BroadcastConfig(Frozen):
    mode: Literal["pipelined", "one_to_many"] = "pipelined"
    """"pipelined": the learner sends each version once to a few first-hop peers and workers relay
    chunks to each other while still receiving (dissemination ~ one copy's time). "one_to_many":
    the learner serves every worker itself (time grows linearly with the number of workers); kept
    as the baseline to compare against."""
    learner_key_path: str = ""
    """Learner: its Ed25519 private key file (PKCS#8 PEM, see echo2.broadcast.signing); empty: the
    launcher generates one per run in the run dir. Never sent anywhere."""
    learner_public_key: str = ""
    """Workers: the pinned learner public key, 64 hex digits or a file holding them; a manifest
    signed by any other key is refused. Empty: taken from the coordinator at registration, over
    the run's authenticated control channel."""
    wire_dtype: Literal["auto", "bfloat16", "float16", "float32"] = "auto"
    """Floating-point dtype of published versions (integer tensors travel as they are). "auto":
    the dtype the base checkpoint is stored in (bfloat16 for real Qwen3 and Llama checkpoints, as
    `echo2 plan` assumes; float32 when its config names none). Workers cast what they receive
    into their own engine dtype. float32 doubles the bytes per version against bfloat16."""
    chunk_bytes: int = Field(1 << 20, ge=4 << 10, le=64 << 20)
    """Unit of hashing, verification and forwarding. Each relay hop adds about chunk_bytes / b of
    pipeline fill (1 MiB at 100 Mbit/s: 84 ms), and the manifest carries one sha256 per chunk
    (16 GB of weights: 16k hashes, ~1 MB of manifest)."""
    max_first_hop: int = Field(4, ge=1, le=1024)
    """Pipelined mode: the learner feeds at most this many workers directly; the others get the
    version from peers. Fewer means less learner upload, more means a shallower tree."""
    max_fanout: int = Field(8, ge=1, le=1024)
    """Pipelined mode: most children one worker relays to (its uplink divided by the stream rate,
    capped here)."""
    max_depth: int = Field(64, ge=1, le=4096)
    """Pipelined mode: deepest a worker may sit in the tree; beyond it workers are attached to
    shallower nodes even if that oversubscribes their uplink (each hop adds fill and per-hop
    latency)."""
    max_sources: int = Field(4, ge=1, le=64)
    """Sources each worker is given, in order: its parent, then its ancestors, the learner last
    (1: the parent alone). A worker whose source dies or misbehaves resumes from the next one."""
    connect_timeout_s: float = Field(10.0, gt=0)
    """TCP connect to a source. SYN retransmissions come at 1 s and 3 s, so 10 s survives two lost
    SYNs on a lossy WAN path, while a dead host costs a child at most 10 s before it moves on."""
    stall_timeout_s: float = Field(10.0, gt=0)
    """Silence (no byte at all) tolerated from a source. Senders emit a keepalive frame at least
    every keepalive_interval_s, so 10 s is ~10 missed keepalives: beyond TCP loss recovery
    (retransmission backoff 0.2+0.4+0.8+1.6+3.2 s ~ 6 s) yet short next to a transfer
    (16 GB at 1 Gbit/s is 128 s). The sending side uses it too: a child that does not drain a
    write for this long is dropped so it stops holding the sender's uplink."""
    keepalive_interval_s: float = Field(1.0, gt=0)
    """A sender with nothing new to send (it waits on its own upstream) sends a keepalive frame this
    often, so its children can tell a live, waiting relay from a dead one."""
    progress_timeout_s: float = Field(40.0, gt=0)
    """Longest a source may keep a stream alive with keepalives but no new chunk. A live relay
    whose own upstream died recovers within stall_timeout_s + connect_timeout_s plus one chunk
    (~20 s with the defaults); twice that stops failovers from cascading down a chain, while a
    source that only ever sends keepalives (an endless stream) is cut off."""
    min_rate_bytes_per_s: float = Field(125_000.0, gt=0)
    """Slowest acceptable sender (1 Mbit/s). A chunk must arrive within
    stall_timeout_s + chunk_bytes / rate after its frame header, and after progress_timeout_s a
    stream's average rate must stay above it; a fetch lowers it to a quarter of the planned rate
    when the coordinator planned a slower edge (one-to-many to many workers)."""
    rate_floor_bytes_per_s: float = Field(32_000.0, gt=0)
    """The lowest the slow-sender cutoff ever goes (256 kbit/s), whatever a plan says. Plans are
    built from the link speeds workers declare; without a floor, a relay declaring a few bytes
    per second would lower its child's cutoff so far that it could hold the child for hours."""
    announce_wait_s: float = Field(30.0, gt=0)
    """A relay asked for a version it has not been told about yet keeps the child waiting (with
    keepalives) this long: the coordinator sends a version to parents and children at about the
    same time, but a parent's control loop may be a few heartbeats behind."""
    report_check_timeout_s: float = Field(10.0, gt=0)
    """How long the coordinator waits for a reported relay to send it the chunk a bad-peer
    report names (`broadcast.chunk_check`): a relay that does not answer in time confirms
    nothing, against itself or the reporter."""
    report_lifetime_versions: int = Field(8, ge=1)
    """A bad-peer report counts for this many versions from the one it was made for (a report
    for version v, until version v + 8 is published); then the relay is a source again. A relay
    that still sends bad bytes is reported again by its children, which costs them a fail-over
    once in that many versions; a relay that once sent bad bytes (a flipped bit, a lie about it)
    is not cut off for the rest of the run."""
    report_timeout_s: float = Field(5.0, gt=0)
    """Bound on the bad-peer report callback (a control request to the coordinator; a loaded box
    answers within a second or two). A report that fails is logged and counted, never fatal."""
    source_rounds: int = Field(2, ge=1, le=10)
    """Passes over a worker's source list before the fetch fails; a second pass absorbs a source
    that was briefly unreachable (restart, transient network error). Misbehaving sources are
    never retried."""
    retry_backoff_s: float = Field(1.0, ge=0)
    """Pause between passes over the source list."""
    max_payload_bytes: int = Field(64 << 30, ge=1)
    """Largest version a worker accepts (64 GiB: a bf16 32B model); a manifest announcing more is
    refused before a byte is fetched."""
    max_children: int = Field(64, ge=1, le=4096)
    """Concurrent streams one relay or the learner serves; more are answered 503 (the child moves
    to its next source) instead of thinning everyone's share of the uplink."""
    keep_versions: int = Field(2, ge=1, le=16)
    """Completed versions the learner keeps serving (the newest for late joiners, the previous for
    workers still finishing it), and with `deltas` also every version since the newest anchor.
    Workers keep exactly one: the version they hold."""
    deltas: bool = False
    """Publish version v as a lossless delta against v-1 (see echo2.broadcast.delta) instead of
    a full snapshot: at RL learning rates a bf16 delta is a few percent of the full bytes
    (benchmarks/delta_bytes.py). Workers rebuild v from the v-1 they hold and check every tensor
    against the manifest's hashes; a worker without the base gets an anchor plus deltas or waits
    for a fresh anchor, whichever the coordinator finds cheaper. Off: every version is full."""
    delta_codec: Literal["sub-zstd", "xor-zstd"] = "sub-zstd"
    """How a delta encodes bit patterns: their difference ("sub-zstd", measured smaller on bf16)
    or their XOR; both exact."""
    delta_zstd_level: int = Field(3, ge=1, le=19)
    """zstd level of deltas: 3 compresses ~0.5 GB/s per core; higher levels buy ~1% fewer bytes
    at several times the learner's CPU time."""
    anchor_every: int = Field(20, ge=1, le=100_000)
    """With `deltas`: every this many versions the learner also publishes the full version (an
    anchor) next to its delta, so a worker that lacks the base needs at most anchor_every - 1
    deltas after it. Each anchor costs the learner one full hash pass and the origin memory for
    one full version."""
    anchor_when_behind: float = Field(2.0, gt=0)
    """With `deltas`: when the cheapest way for a live worker to reach the newest version (an
    anchor plus deltas, or the deltas after the version it holds) costs more than this many full
    versions, or there is none, the coordinator asks the learner for an anchor with its next
    version (an anchor on demand)."""

    @model_validator(mode="after")
    def _timeouts_consistent(self) -> BroadcastConfig:
        if self.keepalive_interval_s * 2 > self.stall_timeout_s:
            raise ValueError(
                f"keepalive_interval_s ({self.keepalive_interval_s}) must be at most half of "
                f"stall_timeout_s ({self.stall_timeout_s}) or live, waiting relays look dead"
            )
        if self.progress_timeout_s <= self.stall_timeout_s + self.connect_timeout_s:
            raise ValueError(
                f"progress_timeout_s ({self.progress_timeout_s}) must exceed stall_timeout_s + "
                f"connect_timeout_s ({self.stall_timeout_s + self.connect_timeout_s}) so a relay "
                "recovering from its own upstream failure is not abandoned by its children"
            )
        if self.announce_wait_s >= self.progress_timeout_s:
            raise ValueError(
                f"announce_wait_s ({self.announce_wait_s}) must be below progress_timeout_s "
                f"({self.progress_timeout_s}) or children give up on a parent still waiting for its manifest"
            )
        if self.rate_floor_bytes_per_s > self.min_rate_bytes_per_s:
            raise ValueError(
                f"rate_floor_bytes_per_s ({self.rate_floor_bytes_per_s:g}) must be at most min_rate_bytes_per_s "
                f"({self.min_rate_bytes_per_s:g}): the floor is how far a plan may lower the cutoff"
            )
        return self

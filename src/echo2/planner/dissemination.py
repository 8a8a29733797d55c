"""Dissemination latency model (ECHO2.md section 5), the one closed form the planner, the
simulator's sweeps and the broadcast benchmark share: how long until N workers hold a new policy
version, for the learner sending every copy, a pipelined relay chain, a pipelined d-ary relay
tree, and the ideal network.

Units: sizes in bytes, rates in bytes per second (every rate argument says so in its name and is
keyword-only, so a caller still passing bits/s positionally fails loudly instead of being 8x
off), times in seconds. Configs declare links in bits/s (network convention: `*_bps`); convert
with `bytes_per_s(bits_per_s)` at the call. All functions are pure.

Symbols: M snapshot bytes, c chunk bytes, N workers, b_L learner uplink, b worker link (up = down
unless given apart), d tree fan-out, L levels below the learner, h per-hop latency.
    ideal        T = M / b_down
    one-to-many  T = max(N*M / b_L, M / b_down) + h                      linear in N
    tree         each parent splits its uplink among f = min(d, N) children, so an edge runs at
                 r = min(b_up / f, b_down) and the stream at min(b_L / f, r):
                 T = M / min(b_L / f, r) + (L - 1) * c / r + L * h       L = tree_levels(N, d)
    chain        a tree with d = 1: T = M / min(b_L, b) + (N - 1) * c / b + N * h, ~flat in N
The first level's pipeline fill is inside the stream term; each deeper level adds one chunk time
of its edge (ECHO2.md counts c/b per level; a parent interleaving d children takes d*c/b, the
difference is negligible when M/c >> L). Chain and tree assume relays ordered fastest first, so a
worker is never fed faster than its own link and formulas using its rate are upper bounds on its
arrival. `echo2.broadcast.latency.predict_plan_s` evaluates the same model on a concrete plan.
"""

from __future__ import annotations

from typing import Literal

Topology = Literal["one_to_many", "chain", "tree", "ideal"]
TOPOLOGIES: tuple[str, ...] = ("one_to_many", "chain", "tree", "ideal")

BITS_PER_BYTE = 8


def bytes_per_s(bits_per_s: float) -> float:
    """A link declared in bits/s (configs, network convention) as bytes/s (this model)."""
    return bits_per_s / BITS_PER_BYTE


def _check(snapshot_bytes: float, n_workers: int, **rates_bytes_per_s: float) -> None:
    if not snapshot_bytes > 0:
        raise ValueError(f"snapshot_bytes must be > 0 (got {snapshot_bytes!r})")
    if n_workers < 1:
        raise ValueError(f"n_workers must be >= 1 (got {n_workers!r})")
    for name, rate in rates_bytes_per_s.items():
        if not rate > 0:
            raise ValueError(f"{name} must be > 0 bytes/s (got {rate!r})")


def ideal_s(snapshot_bytes: float, *, worker_bytes_per_s: float) -> float:
    """Every worker receives at its full downlink: T = M / b_down."""
    _check(snapshot_bytes, 1, worker_bytes_per_s=worker_bytes_per_s)
    return snapshot_bytes / worker_bytes_per_s


def one_to_many_s(
    snapshot_bytes: float,
    n_workers: int,
    *,
    learner_bytes_per_s: float,
    worker_bytes_per_s: float,
    hop_latency_s: float = 0.0,
) -> float:
    """The learner sends all N copies over its uplink: T = max(N*M / b_L, M / b) + one hop.
    Linear in N; the max covers a learner faster than the N downlinks together."""
    _check(snapshot_bytes, n_workers, learner_bytes_per_s=learner_bytes_per_s, worker_bytes_per_s=worker_bytes_per_s)
    copies_s = n_workers * snapshot_bytes / learner_bytes_per_s
    return max(copies_s, snapshot_bytes / worker_bytes_per_s) + hop_latency_s


def tree_levels(n_workers: int, fanout: int, first_hop: int | None = None) -> int:
    """Depth L of a full relay tree holding n_workers below the learner: the learner feeds
    `first_hop` workers (default `fanout`) and every worker feeds `fanout`, so L is the smallest
    depth with first_hop * (1 + d + ... + d^(L-1)) >= N (a chain, fanout 1, has depth N)."""
    if fanout < 1:
        raise ValueError(f"fanout must be >= 1 (got {fanout!r})")
    level, placed, depth = first_hop or fanout, 0, 0
    while placed < n_workers:
        placed, depth, level = placed + level, depth + 1, level * fanout
    return depth


def tree_s(
    snapshot_bytes: float,
    n_workers: int,
    *,
    learner_bytes_per_s: float,
    worker_upload_bytes_per_s: float,
    chunk_bytes: float,
    fanout: int,
    worker_download_bytes_per_s: float | None = None,
    hop_latency_s: float = 0.0,
) -> float:
    """Pipelined d-ary tree (see the module docstring); the download defaults to the upload."""
    down = worker_upload_bytes_per_s if worker_download_bytes_per_s is None else worker_download_bytes_per_s
    _check(snapshot_bytes, n_workers, learner_bytes_per_s=learner_bytes_per_s,
           worker_upload_bytes_per_s=worker_upload_bytes_per_s, worker_download_bytes_per_s=down)
    if not chunk_bytes > 0:
        raise ValueError(f"chunk_bytes must be > 0 (got {chunk_bytes!r})")
    levels = tree_levels(n_workers, fanout)
    share = min(fanout, n_workers)
    edge = min(worker_upload_bytes_per_s / share, down)
    stream = min(learner_bytes_per_s / share, edge)
    return snapshot_bytes / stream + (levels - 1) * chunk_bytes / edge + levels * hop_latency_s


def chain_s(
    snapshot_bytes: float,
    n_workers: int,
    *,
    learner_bytes_per_s: float,
    worker_bytes_per_s: float,
    chunk_bytes: float,
    hop_latency_s: float = 0.0,
) -> float:
    """Pipelined relay chain (a tree with fanout 1): T = M/min(b_L, b) + (N-1)*c/b + N*hop,
    almost independent of N when M/c >> N."""
    return tree_s(snapshot_bytes, n_workers, learner_bytes_per_s=learner_bytes_per_s,
                  worker_upload_bytes_per_s=worker_bytes_per_s, chunk_bytes=chunk_bytes, fanout=1,
                  hop_latency_s=hop_latency_s)


def dissemination_s(
    topology: str,
    snapshot_bytes: float,
    n_workers: int,
    *,
    learner_bytes_per_s: float,
    worker_bytes_per_s: float,
    chunk_bytes: float = 64 << 20,
    fanout: int = 2,
    hop_latency_s: float = 0.0,
) -> float:
    """Transfer time of one version to N workers with symmetric links under `topology`."""
    rates = {"learner_bytes_per_s": learner_bytes_per_s}
    if topology == "one_to_many":
        return one_to_many_s(snapshot_bytes, n_workers, **rates, worker_bytes_per_s=worker_bytes_per_s,
                             hop_latency_s=hop_latency_s)
    if topology == "chain":
        return chain_s(snapshot_bytes, n_workers, **rates, worker_bytes_per_s=worker_bytes_per_s,
                       chunk_bytes=chunk_bytes, hop_latency_s=hop_latency_s)
    if topology == "tree":
        return tree_s(snapshot_bytes, n_workers, **rates, worker_upload_bytes_per_s=worker_bytes_per_s,
                      chunk_bytes=chunk_bytes, fanout=fanout, hop_latency_s=hop_latency_s)
    if topology == "ideal":
        return ideal_s(snapshot_bytes, worker_bytes_per_s=worker_bytes_per_s) + hop_latency_s
    raise ValueError(f"topology must be one of {', '.join(TOPOLOGIES)} (got {topology!r})")


def leaf_slots(topology: str, n_relays: int, fanout: int = 2) -> float:
    """How many workers that cannot accept connections (behind NAT) the topology can place as
    leaves, given n_relays reachable workers: every parent (the learner or a reachable relay)
    has d child slots and every relay needs one, so leaves <= d*(n_relays + 1) - n_relays.
    A chain (d = 1) takes one, at its tail; one-to-many and ideal take any number."""
    if topology in ("one_to_many", "ideal"):
        return float("inf")
    width = 1 if topology == "chain" else fanout
    return width * (n_relays + 1) - n_relays

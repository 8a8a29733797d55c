"""Keeping a worker's engine on the newest policy version without pausing generation: the
coordinator announces versions (and what to pull next and from where); this fetches them
through the broadcast in the background, rebuilds a delta against the version it holds and
checks every tensor against the manifest's hashes, deserializes off the event loop, and the
worker swaps the staged weights in between two generations, or, with sampling.segment_tokens,
at a segment boundary of a generation in flight (`inflight`)."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from echo2.broadcast.metrics import FetchMetrics
from echo2.broadcast.signing import ManifestRejected
from echo2.broadcast.wire import BroadcastFailed, FetchAborted
from echo2.protocol.broadcast import Assignment
from echo2.protocol.manifest import AdapterSpec, Manifest
from echo2.protocol.messages import VersionInfo
from echo2.report.metrics import MetricsWriter
from echo2.rollout.engine import InFlight
from echo2.rollout.waits import wait_either
from echo2.rollout.weights import WeightReceiver

log = logging.getLogger("echo2.worker")

# pause after a failed fetch (every source failed) when nothing newer is out: short enough to
# catch up within a step or two, long enough not to hammer sources that are restarting
FETCH_RETRY_S = 0.5
# the longest a generation in flight waits for a staged version to be loaded into its engine (a
# swap of SmolLM2-135M takes 0.1-0.3 s on a CPU; a hung load must not hang the lease forever)
SWAP_TIMEOUT_S = 120.0


@dataclass
class Staged:
    info: VersionInfo
    tensors: dict
    fetch: FetchMetrics
    adapter: AdapterSpec | None = None
    """LoRA settings when the version holds adapter weights only."""


class VersionFollower:
    def __init__(self, receiver: WeightReceiver, metrics: MetricsWriter, ask_newest=lambda: None) -> None:
        # ask_newest(): have the coordinator say what to fetch next now (the worker's next
        # heartbeat): after a fetch that was a step on the way to the newest, when every source
        # said the version being fetched is superseded, and when news named a delta against a
        # version this worker does not hold
        self.receiver, self.metrics, self.ask_newest = receiver, metrics, ask_newest
        self.version = -1  # held by the engine
        self.latest: VersionInfo | None = None
        self.target: VersionInfo | None = None
        """What to pull next (the coordinator's `fetch`): `latest`, or a step on the way to it."""
        self.assignment: Assignment | None = None
        self.base: tuple[int, memoryview] | None = None
        """The newest version fetched, as its full payload: what the next delta rebuilds from."""
        self.learner_key = ""
        self.refused_keys: set[str] = set()
        self.staged: Staged | None = None
        self.loading = -1  # being swapped into the engine (no longer staged, not yet `version`)
        self.rejected: set[int] = set()
        # every source said it no longer serves this announcement: not asked again (a republish
        # of the same number, after a learner restart, is a different announcement)
        self.obsolete: VersionInfo | None = None
        self.asked_for: VersionInfo | None = None  # a delta against a version not held, asked about
        self.announced = asyncio.Event()  # a newer version (or a new source for it): fetcher wakes
        self.ready = asyncio.Event()  # a version is staged: the work loop wakes
        self.swap_s: float | None = None
        self.dissemination_s: float | None = None  # last version: publish -> verified + swap

    @property
    def worker_id(self) -> str:
        return self.receiver.worker_id

    def note(self, info: VersionInfo | None, assignment: Assignment | None, learner_key: str,
             fetch: VersionInfo | None = None) -> None:
        """What a coordinator reply said: the newest version, what to pull next (`fetch`, else the
        newest itself) and where from (`assignment`, for that version). The
        first learner key announced is pinned (unless the worker pins one itself): a later,
        different key is refused and reported, and manifests keep being checked against the
        pinned one."""
        if learner_key and self.learner_key and learner_key != self.learner_key:
            if learner_key not in self.refused_keys:
                self.refused_keys.add(learner_key)
                self.metrics.write("learner_key_refused", worker_id=self.worker_id, pinned=self.learner_key[:16],
                                   announced=learner_key[:16])
        else:
            self.learner_key = learner_key or self.learner_key
        if info is None or (self.latest is not None and info.version < self.latest.version):
            return
        target = fetch or info
        if info != self.latest or target != self.target or (assignment is not None and assignment != self.assignment):
            self.latest, self.target = info, target
            self.assignment = assignment if assignment is not None and assignment.version == target.version else None
            self.announced.set()

    def holding(self) -> int:
        """The newest version this worker has: loaded, being loaded, or staged. The fetch loop
        only goes after newer ones (the relay refuses a version it already completed)."""
        return max(self.version, self.loading, self.staged.info.version if self.staged else -1,
                   self.base[0] if self.base else -1)

    def _unusable(self, target: VersionInfo | None, assignment: Assignment | None) -> bool:
        """Nothing to fetch now: no target or source, not newer, refused before, gone from every
        source (until announced anew), or a delta against a version this worker does not hold (a
        plan from before its last fetch)."""
        if (target is None or assignment is None or target.version <= self.holding() or target == self.obsolete
                or target.version in self.rejected):
            return True
        base = target.signed.unverified_manifest().base_version  # routing only; fetch verifies
        if base is not None and base != self.holding():
            # news guessed what this worker holds (the version it was last sent, its fetch
            # perhaps failed): its next heartbeat says, and brings the right step, once per target
            if target is not self.asked_for:
                self.asked_for = target
                self.ask_newest()
            return True
        return False

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            target, assignment = self.target, self.assignment
            if self._unusable(target, assignment):
                await wait_either(self.announced, stop, timeout_s=1.0)
                continue
            assert target is not None and assignment is not None
            staged = await self._fetch(target, assignment)
            if staged is None:
                if self.latest is not None and self.latest.version > target.version:
                    continue  # a newer version is out: go after it now (the failed one is obsolete)
                await wait_either(stop, stop, timeout_s=FETCH_RETRY_S)
            else:
                self.staged = staged
                self.ready.set()
                if self.latest is not None and staged.info.version < self.latest.version:
                    self.ask_newest()  # a step on the way: its heartbeat's reply names the next one

    async def _fetch(self, target: VersionInfo, assignment: Assignment) -> Staged | None:
        try:
            result = await self.receiver.fetch(target, assignment, self.holding(), self.learner_key)
        except ManifestRejected as exc:  # forged, replayed or oversized: never retried
            self.rejected.add(target.version)
            self._failed(target, f"manifest rejected: {exc}")
        except BroadcastFailed as exc:
            self._failed(target, str(exc))
            if exc.obsolete:  # superseded everywhere: wait for the newer announcement, asked for now
                self.obsolete = target
                self.ask_newest()
        except (FetchAborted, ValueError) as exc:
            self._failed(target, str(exc))
        else:
            try:
                payload = await asyncio.to_thread(_rebuild, self.base, result.payload, result.manifest)
                tensors = await asyncio.to_thread(_deserialize, payload)
            except ValueError as exc:  # signed and chunk-verified, yet not what its hashes say: never retried
                self.rejected.add(target.version)
                self._failed(target, f"version refused after reconstruction: {exc}")
                return None
            self.base = (target.version, payload)
            return Staged(target, tensors, result.metrics, result.manifest.adapter)
        return None

    def _failed(self, target: VersionInfo, error: str) -> None:
        self.metrics.write("weights_fetch_failed", worker_id=self.worker_id, version=target.version, error=error[:300])
        log.warning("fetching version %d failed: %s", target.version, error[:300])

    def inflight(self, engine, segment_tokens: int) -> InFlight:
        """What a generation in flight needs to take newer versions at its segment boundaries
        (call on the event loop; the generation thread uses it): whether a newer version is
        staged, and a swap that the event loop performs (`swap_into`, its metrics included)
        while the generation thread waits."""
        loop = asyncio.get_running_loop()

        def pending() -> bool:
            staged = self.staged
            return staged is not None and staged.info.version > self.version

        def swap() -> int:
            asyncio.run_coroutine_threadsafe(self.swap_into(engine), loop).result(timeout=SWAP_TIMEOUT_S)
            return self.version

        return InFlight(segment_tokens=segment_tokens, version=self.version, pending=pending, swap=swap)

    async def swap_into(self, engine) -> None:
        """Load the staged version, if any, into the engine (between generations only)."""
        staged, self.staged = self.staged, None
        if staged is None or staged.info.version <= self.version:
            return
        started, self.loading = time.perf_counter(), staged.info.version
        try:
            if staged.adapter is not None:
                from echo2.config.run import LoraConfig

                lora = LoraConfig(**staged.adapter.model_dump())
                await asyncio.to_thread(engine.load_adapter, staged.tensors, lora)
            else:
                await asyncio.to_thread(engine.load_state_dict, staged.tensors)
        finally:
            self.loading = -1
        self.swap_s = time.perf_counter() - started
        previous, self.version = self.version, staged.info.version
        fetch = staged.fetch.loaded(at=time.time())
        self.dissemination_s = fetch.publish_to_verified_s + self.swap_s
        self.metrics.write(
            "weights_loaded", worker_id=self.worker_id, version=self.version, bytes=fetch.total_bytes,
            swap_s=self.swap_s, fetch_s=fetch.verified_at - fetch.started_at,
            publish_to_verified_s=fetch.publish_to_verified_s,
            publish_to_loaded_s=fetch.publish_to_loaded_s, bytes_by_source=fetch.bytes_by_source,
            resumed_at_chunks=fetch.resumed_at_chunks, bad_peers=fetch.bad_peers,
            bytes_relayed_previous=self.receiver.bytes_relayed(previous) if previous >= 0 else 0,
        )
        sources = ", ".join(f"{source} {n / 1e6:.2f} MB" for source, n in fetch.bytes_by_source.items())
        relayed = f"; relayed {self.receiver.bytes_relayed(previous) / 1e6:.2f} MB of version {previous} to peers" \
            if previous >= 0 and self.receiver.relay is not None else ""
        log.info("loaded version %d: %.2f MB fetched in %.2f s (from %s), swapped in %.2f s, %.2f s after its "
                 "publish%s", self.version, fetch.total_bytes / 1e6, fetch.verified_at - fetch.started_at,
                 sources or "nobody", self.swap_s, fetch.publish_to_loaded_s, relayed)


def _rebuild(base: tuple[int, memoryview] | None, payload: memoryview, manifest: Manifest) -> memoryview:
    """The full payload of a fetched version: a full one as it came (every chunk verified), a
    delta rebuilt from the base and checked tensor by tensor against the manifest."""
    if manifest.base_version is None:
        return payload
    from echo2.broadcast.delta import decode_delta
    from echo2.protocol.manifest import verify_content

    if base is None or base[0] != manifest.base_version:
        raise ValueError(f"version {manifest.version} is a delta against {manifest.base_version}, "
                         f"this worker holds {base[0] if base else 'nothing'}")
    rebuilt = decode_delta(base[1], payload, codec=manifest.codec)
    verify_content(manifest, rebuilt)
    return rebuilt


def _deserialize(payload: memoryview) -> dict:
    """Tensors viewing the verified payload in place (no copy); the swap casts them into the
    engine's own dtype and device."""
    from echo2.models.weights import payload_tensors

    return payload_tensors(payload)

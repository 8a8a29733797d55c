"""Keeping a worker's engine on the newest policy version without pausing generation: the
coordinator announces versions (and where to pull each from); this fetches them through the
broadcast in the background, deserializes them off the event loop, and the worker swaps the
staged weights in between two generations."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from echo2.broadcast.metrics import FetchMetrics
from echo2.broadcast.signing import ManifestRejected
from echo2.broadcast.topology import Assignment
from echo2.broadcast.wire import BroadcastFailed, FetchAborted
from echo2.protocol.messages import VersionInfo
from echo2.report.metrics import MetricsWriter
from echo2.rollout.weights import WeightReceiver

log = logging.getLogger("echo2.worker")

# pause after a failed fetch (every source failed) when nothing newer is out: short enough to
# catch up within a step or two, long enough not to hammer sources that are restarting
FETCH_RETRY_S = 0.5


@dataclass
class Staged:
    info: VersionInfo
    tensors: dict
    fetch: FetchMetrics


class VersionFollower:
    def __init__(self, receiver: WeightReceiver, metrics: MetricsWriter, ask_newest=lambda: None) -> None:
        # ask_newest(): have the coordinator announce its newest version now (the worker's next
        # heartbeat), when every source said the version being fetched is superseded
        self.receiver, self.metrics, self.ask_newest = receiver, metrics, ask_newest
        self.version = -1  # held by the engine
        self.latest: VersionInfo | None = None
        self.assignment: Assignment | None = None
        self.learner_key = ""
        self.refused_keys: set[str] = set()
        self.staged: Staged | None = None
        self.loading = -1  # being swapped into the engine (no longer staged, not yet `version`)
        self.rejected: set[int] = set()
        # every source said it no longer serves this announcement: not asked again (a republish
        # of the same number, after a learner restart, is a different announcement)
        self.obsolete: VersionInfo | None = None
        self.announced = asyncio.Event()  # a newer version (or a new source for it): fetcher wakes
        self.ready = asyncio.Event()  # a version is staged: the work loop wakes
        self.swap_s: float | None = None
        self.dissemination_s: float | None = None  # last version: publish -> verified + swap

    @property
    def worker_id(self) -> str:
        return self.receiver.worker_id

    def note(self, info: VersionInfo | None, assignment: Assignment | None, learner_key: str) -> None:
        """What a coordinator reply said: the newest version and where to pull it from. The
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
        if info != self.latest or (assignment is not None and assignment != self.assignment):
            self.latest = info
            self.assignment = assignment if assignment is not None and assignment.version == info.version else None
            self.announced.set()

    def holding(self) -> int:
        """The newest version this worker has: loaded, being loaded, or staged. The fetch loop
        only goes after newer ones (the relay refuses a version it already completed)."""
        return max(self.version, self.loading, self.staged.info.version if self.staged else -1)

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            target, assignment = self.latest, self.assignment
            if (target is None or assignment is None or target.version <= self.holding() or target == self.obsolete
                    or target.version in self.rejected):
                await wait_either(self.announced, stop, timeout_s=1.0)
                continue
            staged = await self._fetch(target, assignment)
            if staged is None:
                if self.latest is not None and self.latest.version > target.version:
                    continue  # a newer version is out: go after it now (the failed one is obsolete)
                await wait_either(stop, stop, timeout_s=FETCH_RETRY_S)
            else:
                self.staged = staged
                self.ready.set()

    async def _fetch(self, target: VersionInfo, assignment: Assignment) -> Staged | None:
        try:
            result = await self.receiver.fetch(target, assignment, self.holding(), self.learner_key)
            tensors = await asyncio.to_thread(_deserialize, result.payload)
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
            return Staged(target, tensors, result.metrics)
        return None

    def _failed(self, target: VersionInfo, error: str) -> None:
        self.metrics.write("weights_fetch_failed", worker_id=self.worker_id, version=target.version, error=error[:300])
        log.warning("fetching version %d failed: %s", target.version, error[:300])

    async def swap_into(self, engine) -> None:
        """Load the staged version, if any, into the engine (between generations only)."""
        staged, self.staged = self.staged, None
        if staged is None or staged.info.version <= self.version:
            return
        started, self.loading = time.perf_counter(), staged.info.version
        try:
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


async def wait_either(event: asyncio.Event, stop: asyncio.Event, timeout_s: float) -> None:
    """Sleep until `event` or `stop` is set or the timeout passes; consume `event`."""
    waiters = {asyncio.ensure_future(event.wait()), asyncio.ensure_future(stop.wait())}
    _, pending = await asyncio.wait(waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED)
    for waiter in pending:
        waiter.cancel()
    if event is not stop:
        event.clear()


def _deserialize(payload: memoryview) -> dict:
    """Tensors viewing the verified payload in place (no copy); the swap casts them into the
    engine's own dtype and device."""
    from echo2.models.weights import payload_tensors

    return payload_tensors(payload)

"""The coordinator's side of the weight broadcast: for each published version, a relay tree over
the live workers (echo2.broadcast.topology) built from what they declared (link speeds, whether
they accept connections); late joiners get the fastest holders of the version. A worker that
reports a source for sending bad bytes is never sent to it again; the source is dropped for
everyone once `broadcast.reporters_to_suspect` different workers have reported it, so one lying
worker cannot cut an honest relay off."""

from __future__ import annotations

from dataclasses import dataclass

from echo2.broadcast.topology import (
    ORIGIN_ID,
    Assignment,
    BroadcastPlan,
    OriginInfo,
    PeerInfo,
    Source,
    late_joiner_assignment,
    plan_broadcast,
)
from echo2.config.broadcast import BroadcastConfig
from echo2.planner.dissemination import bytes_per_s


@dataclass(frozen=True)
class Peer:
    """What the coordinator knows of one live worker, for the broadcast."""

    worker_id: str
    relay_address: str
    upload_bps: float
    download_bps: float
    version: int
    """Version the worker holds (from its heartbeats)."""


class Dissemination:
    def __init__(self, config: BroadcastConfig, learner_upload_bps: float) -> None:
        self.config = config
        self.learner_upload_bps = learner_upload_bps
        self.plan: BroadcastPlan | None = None
        self.suspects: set[str] = set()
        """Dropped as a source for everyone."""
        self.reporters: dict[str, set[str]] = {}
        """peer id -> the workers that reported it (each avoids it from then on)."""

    def plan_version(self, version: int, origin_url: str, peers: list[Peer]) -> BroadcastPlan:
        """The tree for a newly published version, over the workers live at publish time."""
        self.plan = plan_broadcast(version, self._origin(origin_url), [self._info(p) for p in peers], self.config)
        return self.plan

    def assignment(self, worker_id: str, version: int, origin_url: str, peers: list[Peer]) -> Assignment:
        """Where `worker_id` pulls `version` from: its place in the plan, or, for a worker that
        joined after the plan was made, any holder of the version (the learner last)."""
        if self.plan is not None and self.plan.version == version:
            try:
                return self._without_suspects(self.plan.for_worker(worker_id), origin_url, worker_id)
            except ValueError:
                pass  # not in the plan: a late joiner
        joiner = next((p for p in peers if p.worker_id == worker_id), None)
        if joiner is None:
            raise ValueError(f"worker {worker_id!r} is not live")
        holders = [self._info(p) for p in peers if p.version >= version and not self._avoided(p.worker_id, worker_id)]
        return late_joiner_assignment(version, self._info(joiner), holders, self._origin(origin_url), self.config)

    def report(self, peer_id: str, reporter_id: str) -> str:
        """A worker caught `peer_id` sending bad bytes. The reporter is never sent to it again;
        everyone stops using it once reporters_to_suspect different workers said so. The
        learner's origin is never dropped (a worker's report cannot cut everyone off from the one
        source every version starts at). Returns the effect: "none", "reporter" or "everyone"."""
        if peer_id == ORIGIN_ID or peer_id == reporter_id:
            return "none"
        reporters = self.reporters.setdefault(peer_id, set())
        reporters.add(reporter_id)
        if len(reporters) >= self.config.reporters_to_suspect:
            self.suspects.add(peer_id)
            return "everyone"
        return "reporter"

    def forget(self, worker_id: str) -> None:
        """A worker gone for good: its reports and the reports against it go too."""
        self.reporters.pop(worker_id, None)
        for reporters in self.reporters.values():
            reporters.discard(worker_id)

    def _avoided(self, peer_id: str, for_worker: str) -> bool:
        return peer_id in self.suspects or for_worker in self.reporters.get(peer_id, ())

    def _without_suspects(self, assignment: Assignment, origin_url: str, worker_id: str) -> Assignment:
        sources = [s for s in assignment.sources if not self._avoided(s.peer_id, worker_id)]
        if len(sources) == len(assignment.sources):
            return assignment
        if not sources:  # every source a suspect (max_sources = 1): the learner serves it itself
            sources = [Source(peer_id=ORIGIN_ID, url=origin_url)]
        # validated again (model_copy would not): an assignment never goes out without a source
        return Assignment.model_validate({**assignment.model_dump(), "sources": sources})

    def _origin(self, url: str) -> OriginInfo:
        return OriginInfo(url=url, upload_bytes_per_s=bytes_per_s(self.learner_upload_bps))

    def _info(self, peer: Peer) -> PeerInfo:
        reachable = bool(peer.relay_address) and peer.worker_id not in self.suspects
        return PeerInfo(peer_id=peer.worker_id, url=peer.relay_address if reachable else "",
                        upload_bytes_per_s=bytes_per_s(peer.upload_bps), download_bytes_per_s=bytes_per_s(peer.download_bps),
                        reachable=reachable)

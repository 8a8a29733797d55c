"""The coordinator's state machine, free of HTTP: a facade over its parts, which it builds and
wires to one shared list of events. Every public method either applies a whole change
(persisted before it returns) or raises `RequestError` having changed nothing. The server's
submissions (`submit_scored`, `submit_evaluation_scored`) await their scoring in between: they
are checked, scored while other requests run, then applied in one step that checks the lease
again (and refuses, changing nothing, if it expired meanwhile); only the scoring's cost is
kept either way (over-budget strikes, echo2.coordinator.scoring.limits).

The parts, each owning its data: `registry` (workers, credentials, the join bucket),
`leases_book` (the prompt queue, cursor and live leases), `groups` (the policy core's data plane
over stored groups: admission, stale drops, batches, rejections, compaction), `versions`
(publish checks, the pinned learner key, dissemination), the activation `controller`, the
rollout `audit`, the `evaluation` desk and the scoring `limits`. The transactions that span
them: what workers ask (`worker_desk.py`), a rollout from its lease to the buffer
(`rollouts.py`) and what the learner asks (`learner_desk.py`). `view.py` reads the parts for snapshots and gauges.

Lifecycle of a prompt: queued -> leased to one worker -> (expired: queued again) ->
submitted as a group -> buffered -> trained in exactly one step's batch, or dropped as stale;
or submitted as an uninformative group (all rewards equal) -> done, never trained.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable

from echo2.coordinator.records import events as ev
from echo2.coordinator.parts.audit import AuditLedger
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.desks.evaluation import EvaluationDesk
from echo2.coordinator.parts.groups import Counters, GroupBook
from echo2.coordinator.desks.learner import LearnerDesk
from echo2.coordinator.parts.leases import Lease, LeaseBook
from echo2.coordinator.parts.registry import Registry, WorkerRecord
from echo2.coordinator.desks.rollouts import RolloutIntake
from echo2.coordinator.scoring.jobs import Scoring
from echo2.coordinator.scoring.limits import ScoringLimits
from echo2.coordinator.scoring.scorer import Scorer
from echo2.coordinator.settings import Settings
from echo2.coordinator.records.store import Store
from echo2.coordinator.parts.versions import VersionDesk
from echo2.coordinator.desks.workers import WorkerDesk
from echo2.policy.controller import ActivationController
from echo2.protocol import messages as m
from echo2.protocol.learner_api import AuditReport

__all__ = ["CoordinatorState", "RequestError", "Settings", "WorkerRecord", "Lease"]


class CoordinatorState:
    def __init__(self, settings: Settings, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        s = self.settings = settings
        self.store, self.scorer, self.clock = store, scorer, clock
        self.events: list[ev.Event] = []  # for the server to log and write to metrics.jsonl
        self.controller = ActivationController(s.activation,
                                               batch_rollouts=s.groups_per_step * s.sampling.group_size,
                                               max_staleness=s.max_staleness,
                                               learner_price_per_hour=s.learner_price_per_hour, now=clock(),
                                               catalog=s.activation_catalog,
                                               max_masked_fraction=s.max_masked_fraction)
        for offered in s.offered_workers:
            self.controller.offer(*offered)
        self.versions = VersionDesk(store, s.broadcast, s.learner_upload_bps)
        self.counters = Counters(**store.get_meta("counters", {}))
        self.audit = AuditLedger(s.audit_flags_to_quarantine, store.get_meta("quarantined", {}))
        self.registry = Registry(s.registrations_per_minute, s.worker_timeout_s, clock, self.audit.quarantined)
        self.leases_book = LeaseBook(store, self.registry.workers, clock)
        self.groups = GroupBook(store, self.counters, max_staleness=s.max_staleness, groups_per_step=s.groups_per_step,
                                max_leases_per_worker=s.max_leases_per_worker, fresh_leases=s.fresh_leases,
                                current_version=self.versions.current,
                                max_worker_share=s.activation.max_worker_share,
                                max_masked_fraction=s.max_masked_fraction,
                                segment_swaps=s.sampling.segment_tokens > 0)
        self.limits = ScoringLimits(strikes=s.scoring.strikes, window_s=s.scoring.strike_window_s, events=self.events,
                                    clock=clock)
        self.evaluation = self._evaluation_desk() if s.eval_on_workers else None
        parts = dict(registry=self.registry, leases_book=self.leases_book, groups=self.groups, versions=self.versions,
                     controller=self.controller, evaluation=self.evaluation, store=store, events=self.events,
                     clock=clock)
        self.intake = RolloutIntake(registry=self.registry, leases=self.leases_book, groups=self.groups,
                                    versions=self.versions, controller=self.controller, scorer=scorer,
                                    sampling=s.sampling, store=store, limits=self.limits, events=self.events,
                                    clock=clock, rules=s.rewards)
        self.worker_desk = WorkerDesk(**parts, settings=s, scorer=scorer, counters=self.counters)
        self.learner_desk = LearnerDesk(**parts, audit=self.audit, worker_desk=self.worker_desk)

    def _evaluation_desk(self) -> EvaluationDesk:
        s = self.settings
        desk = EvaluationDesk(self.scorer, self.store, self.events, limits=self.limits, eval_every=s.eval_every,
                              final_version=s.final_version, problems_per_lease=s.eval_problems_per_lease,
                              max_new_tokens=s.sampling.max_new_tokens)
        if self.latest is not None:
            desk.published(self.latest.version)
        return desk

    def take_events(self) -> list[ev.Event]:
        """The events since the last call, oldest first (the parts share the list: emptied in place)."""
        taken = list(self.events)
        self.events.clear()
        return taken

    # ---- read-only views of the parts ----
    @property
    def workers(self) -> dict[str, WorkerRecord]:
        return self.registry.workers

    @property
    def leases(self) -> dict[str, Lease]:
        return self.leases_book.leases

    @property
    def buffer(self) -> list[m.TrainGroup]:
        return self.groups.buffer

    @property
    def latest(self) -> m.VersionInfo | None:
        return self.versions.latest

    @property
    def current_version(self) -> int:
        return self.versions.current

    @property
    def public_key_hex(self) -> str:
        return self.versions.public_key_hex

    @property
    def learner_step(self) -> int:
        return self.groups.plane.learner_step

    @property
    def steps_taken(self) -> int:
        """Steps whose batch was assigned (the next batch is for this step)."""
        return self.groups.plane.steps_taken

    # ---- workers (worker_desk.py) ----
    def register(self, req: m.RegisterRequest, source: str = "") -> m.RegisterResponse:
        return self.worker_desk.register(req, source)

    def take_join_token(self, source: str) -> None:
        self.registry.take_join_token(source)

    def worker_for_credential(self, credential: str) -> str | None:
        return self.registry.worker_for_credential(credential)

    def leave(self, req: m.LeaveRequest) -> None:
        self.worker_desk.leave(req)

    def heartbeat(self, req: m.Heartbeat) -> m.HeartbeatResponse:
        return self.worker_desk.heartbeat(req)

    def heartbeat_reply(self, req: m.Heartbeat) -> m.HeartbeatResponse:
        return self.worker_desk.heartbeat_reply(req)

    def bad_peer(self, req: m.BadPeerRequest) -> None:
        self.worker_desk.bad_peer(req)

    def lease(self, req: m.LeaseRequest) -> m.LeaseResponse:
        return self.worker_desk.lease(req)

    def sweep(self) -> None:
        self.worker_desk.sweep()

    def excuse_stall(self, stall_s: float) -> None:
        self.worker_desk.excuse_stall(stall_s)

    def control(self, trigger: str = "") -> None:
        self.worker_desk.control(trigger)

    # ---- rollouts and evaluations (scored inline here; the server's *_scored, off its loop) ----
    def submit(self, req: m.RolloutSubmission) -> m.SubmitResponse:
        return self.intake.submit(req)

    async def submit_scored(self, req: m.RolloutSubmission, scoring: Scoring) -> m.SubmitResponse:
        return await self.intake.submit_scored(req, scoring)

    def submit_evaluation(self, req: m.EvalSubmission) -> m.EvalAck:
        """A worker's greedy completions for its evaluation lease, scored here (never trained)."""
        return self._evaluation_for(req).submit(req, self.clock)

    async def submit_evaluation_scored(self, req: m.EvalSubmission, scoring: Scoring) -> m.EvalAck:
        return await self._evaluation_for(req).submit_scored(req, scoring, self.clock)

    def _evaluation_for(self, req: m.EvalSubmission) -> EvaluationDesk:
        self.registry.live(req.worker_id)
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where); no evaluation leases")
        return self.evaluation

    def evaluation_result(self, version: int) -> m.EvaluationResult:
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where)")
        return self.evaluation.result(version)

    # ---- the learner (learner_desk.py) ----
    def publish(self, info: m.VersionInfo, public_key_hex: str) -> bool:
        return self.learner_desk.publish(info, public_key_hex)

    def observe_step_time(self, step_time_s: float) -> None:
        self.learner_desk.observe_step_time(step_time_s)

    def checkpointed(self, durable_step: int, step: int) -> None:
        self.learner_desk.checkpointed(durable_step, step)

    def take_batch(self, step: int) -> list[m.TrainGroup] | None:
        return self.learner_desk.take_batch(step)

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: Iterable[str] = ()) -> int:
        return self.learner_desk.reject_batch(step, reason, requeue_lease_ids)

    def record_audit(self, report: AuditReport) -> list[str]:
        return self.learner_desk.record_audit(report)

"""The coordinator's state machine, free of HTTP: a facade over its parts that owns the
transactions and the events. Every public method either applies a whole change (persisted
before it returns) or raises `RequestError` having changed nothing.

The parts, each owning its data: `registry` (workers, credentials, the join bucket), `leases`
(the prompt queue, cursor and live leases), `groups` (the policy core's data plane over stored
groups: admission, stale drops, batches, rejections, compaction), `versions` (publish checks,
the pinned learner key, dissemination), the activation `controller`, the rollout `audit` and
the evaluation desk. `view.py` reads it for snapshots and gauges.

Lifecycle of a prompt: queued -> leased to one worker -> (expired: queued again) ->
submitted as a group -> buffered -> trained in exactly one step's batch, or dropped as stale.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable

from echo2.coordinator import events as ev
from echo2.coordinator.audit import AuditLedger
from echo2.coordinator.errors import RequestError
from echo2.coordinator.evaluation_desk import EvaluationDesk
from echo2.coordinator.groups import Counters, GroupBook
from echo2.coordinator.leases import Lease, LeaseBook
from echo2.coordinator.registry import Registry, WorkerRecord
from echo2.coordinator.rollouts import RolloutIntake
from echo2.coordinator.scoring import Scorer
from echo2.coordinator.settings import Settings
from echo2.coordinator.store import Store
from echo2.coordinator.versions import VersionDesk
from echo2.policy import staleness
from echo2.policy.controller import ActivationController
from echo2.protocol.learner_api import AuditReport
from echo2.protocol.messages import (
    BadPeerRequest,
    EvalAck,
    EvalSubmission,
    EvaluationResult,
    Heartbeat,
    HeartbeatResponse,
    LeaseRequest,
    LeaseResponse,
    LeaveRequest,
    RegisterRequest,
    RegisterResponse,
    RolloutSubmission,
    SubmitResponse,
    Task,
    TrainGroup,
    VersionInfo,
)

__all__ = ["CoordinatorState", "RequestError", "Settings", "WorkerRecord", "Lease"]


class CoordinatorState:
    def __init__(self, settings: Settings, store: Store, scorer: Scorer, clock: Callable[[], float] = time.monotonic):
        s = self.settings = settings
        self.store, self.scorer, self.clock = store, scorer, clock
        self.events: list[ev.Event] = []  # for the server to log and write to metrics.jsonl
        self.controller = ActivationController(s.activation,
                                               batch_rollouts=s.groups_per_step * s.sampling.group_size,
                                               max_staleness=s.max_staleness,
                                               learner_price_per_hour=s.learner_price_per_hour, now=clock())
        self.versions = VersionDesk(store, s.broadcast, s.learner_upload_bps)
        self.counters = Counters(**store.get_meta("counters", {}))
        self.audit = AuditLedger(s.audit_flags_to_quarantine, store.get_meta("quarantined", {}))
        self.registry = Registry(s.registrations_per_minute, s.worker_timeout_s, clock, self.audit.quarantined)
        self.leases_book = LeaseBook(store, self.registry.workers, clock)
        self.groups = GroupBook(store, self.counters, max_staleness=s.max_staleness, groups_per_step=s.groups_per_step,
                                max_leases_per_worker=s.max_leases_per_worker, fresh_leases=s.fresh_leases,
                                current_version=self.versions.current)
        self.intake = RolloutIntake(registry=self.registry, leases=self.leases_book, groups=self.groups,
                                    versions=self.versions, controller=self.controller, scorer=scorer,
                                    sampling=s.sampling, store=store, events=self.events, clock=clock)
        self.evaluation: EvaluationDesk | None = None
        if s.eval_on_workers:
            self.evaluation = EvaluationDesk(scorer, store, self.events, eval_every=s.eval_every,
                                             final_version=s.final_version,
                                             problems_per_lease=s.eval_problems_per_lease,
                                             max_new_tokens=s.sampling.max_new_tokens)
            if self.latest is not None:
                self.evaluation.published(self.latest.version)

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
    def buffer(self) -> list[TrainGroup]:
        return self.groups.buffer

    @property
    def latest(self) -> VersionInfo | None:
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

    # ---- workers ----
    def register(self, req: RegisterRequest, source: str = "") -> RegisterResponse:
        """Join the run (with the join token). Issues the credential every later call of this
        worker must carry; only an evicted or departed worker's id can register again (its old
        credential and leases are void). `source`, the caller's address, is rate-limited."""
        self.registry.take_join_token(source)
        record, credential, old = self.registry.admit(req)
        if old is not None:
            self._release_leases(record.worker_id, reason="reregistered")
        self.controller.join(record.worker_id, req.price_per_hour)
        self.events.append(ev.WorkerRegistered(worker_id=record.worker_id, engine=req.engine,
                                               price_per_hour=req.price_per_hour, relay_address=req.relay_address,
                                               source=source))
        s = self.settings
        return RegisterResponse(
            worker_id=record.worker_id, heartbeat_interval_s=s.heartbeat_interval_s, max_staleness=s.max_staleness,
            sampling=s.sampling, model_source=s.model_source, broadcast=s.broadcast,
            learner_public_key=self.public_key_hex, credential=credential, task=self.scorer.task_config(),
            lora=s.lora,
        )

    def take_join_token(self, source: str) -> None:
        self.registry.take_join_token(source)

    def worker_for_credential(self, credential: str) -> str | None:
        return self.registry.worker_for_credential(credential)

    def leave(self, req: LeaveRequest) -> None:
        """A worker shutting down cleanly: its leases go back at once, no timeout needed. With a
        releasable provider an idle worker leaving was released: it stays a candidate the
        controller may choose again (an active one leaving is a departure, as always)."""
        record = self.registry.live(req.worker_id)
        fleet_release = self.settings.activation.provider != "static" and not self.controller.is_active(req.worker_id)
        record.alive = False
        (self.controller.release if fleet_release else self.controller.vanish)(req.worker_id)
        released = self._release_leases(req.worker_id, reason="worker_left")
        self.events.append(ev.WorkerLeft(worker_id=req.worker_id, leases_requeued=released, released=fleet_release))
        self.control(trigger=f"{req.worker_id} left")

    def heartbeat(self, req: Heartbeat) -> HeartbeatResponse:
        record = self.registry.live(req.worker_id)
        self.versions.check(req.version, "heartbeat.version")
        held = req.version if req.base_version is None else req.base_version
        self.versions.check(held, "heartbeat.base_version")
        record.version = req.version
        if req.swap_s is not None:
            self.controller.observe_swap(req.swap_s)
        record.claimed_rollouts, record.claimed_busy_s = req.rollouts_total, req.busy_s_total
        record.claimed_bytes_relayed = req.bytes_relayed_total
        if req.dissemination_s is not None:
            record.claimed_dissemination_s = req.dissemination_s
        self.controller.observe_latencies(req.worker_id, req.dissemination_s, req.generation_s)
        return self.heartbeat_reply(req)

    def heartbeat_reply(self, req: Heartbeat) -> HeartbeatResponse:
        """What a heartbeat is told: the newest version, what to pull next and from where, and
        whether to work (asked again, unchanged, while the beat is held for news)."""
        held = req.version if req.base_version is None else req.base_version
        fetch = self.versions.next_fetch(req.worker_id, held, self.registry.peers())
        return HeartbeatResponse(latest=self.latest.model_copy(update={"full": None}) if self.latest else None,
                                 fetch=fetch[0] if fetch else None, assignment=fetch[1] if fetch else None,
                                 active=self.controller.is_active(req.worker_id),
                                 learner_public_key=self.public_key_hex)

    def bad_peer(self, req: BadPeerRequest) -> None:
        """A worker caught a source sending bytes that fail verification: never use it again."""
        self.registry.live(req.report.reporter_id)
        effect = self.versions.dissemination.report(req.report.peer_id, req.report.reporter_id)
        report = req.report.model_dump(exclude={"kind"})
        self.events.append(ev.BadPeer(**report, took_effect=effect != "none", avoided_by=effect))

    # ---- leases ----
    def lease(self, req: LeaseRequest) -> LeaseResponse:
        """Work for a worker: the run's exact evaluations (versions 0 and last) first, then
        rollouts, then, when it gets none, a due evaluation; a worker serving an evaluation gets
        its next lease until it is done."""
        record = self.registry.live(req.worker_id)
        if self.latest is not None:
            self.versions.check(req.version, "lease.version")
        record.version = req.version
        evaluation = self._evaluation_first(record, req.version)
        if evaluation is not None:
            return evaluation
        if not self.controller.is_active(record.worker_id):
            return self._spare_or_refused(record, req.version, 1.0, "inactive: idle until activated")
        mine = len(self.leases_book.held_by(record.worker_id))
        grant = self.groups.plane.grant(req.version, req.max_tasks, leased=len(self.leases), held_by_worker=mine)
        if grant.count == 0:
            return self._spare_or_refused(record, req.version, grant.retry_after_s, grant.reason)
        leases = self.leases_book.issue(record, req.version, grant.count)
        tasks = [Task(lease_id=lease.lease_id, prompt_ids=self.scorer.prompt_ids(lease.prompt_index),
                      sampling=self.settings.sampling, episode_seed=self.scorer.episode_seed(lease.prompt_index))
                 for lease in leases]
        return LeaseResponse(tasks=tasks)

    def _evaluation_first(self, record: WorkerRecord, version: int) -> LeaseResponse | None:
        if self.evaluation is None:
            return None
        return self.evaluation.first_reply(record.worker_id, version, self.clock())

    def _spare_or_refused(self, record: WorkerRecord, version: int, retry_after_s: float, reason: str) -> LeaseResponse:
        """A due evaluation for a worker that gets no rollouts, else the refusal."""
        spare = self.evaluation.spare_reply(record.worker_id, version, self.clock()) \
            if self.evaluation is not None else None
        return spare or LeaseResponse(tasks=[], retry_after_s=retry_after_s, reason=reason)

    def _release_leases(self, worker_id: str, reason: str) -> int:
        mine = self.leases_book.held_by(worker_id)
        self._requeue(mine, reason)
        return len(mine)

    def _requeue(self, leases: list[Lease], reason: str) -> None:
        with self.store.tx():
            self.leases_book.requeue(leases)
            self.counters.leases_expired += len(leases)
            self.counters.save(self.store)
        self.events += [ev.LeaseRequeued(worker_id=lease.worker_id, reason=reason, prompt_index=lease.prompt_index)
                        for lease in leases]

    def sweep(self) -> None:
        """Expire silent workers (all their leases go back) and leases held too long."""
        now = self.clock()
        lost = self.registry.silent(now)
        for worker_id in lost:
            self.controller.vanish(worker_id)
            self.counters.workers_lost += 1
            released = self._release_leases(worker_id, reason="worker_timeout")
            self.events.append(ev.WorkerLost(worker_id=worker_id, leases_requeued=released))
        overdue = self.leases_book.overdue(now, self.settings.lease_timeout_s)
        if overdue:
            self._requeue(overdue, reason="lease_timeout")
        if lost:  # a preempted worker: re-plan now, not at the next control period
            self.control(trigger=f"lost {', '.join(lost)}")
        if self.evaluation is not None:
            self.evaluation.sweep(self.registry.alive_versions(), self.settings.lease_timeout_s, now)
        for worker_id in self.registry.forget(now, self.settings.forget_workers_after_s, self.controller.costless):
            self.controller.forget(worker_id)
            self.versions.dissemination.forget(worker_id)

    def control(self, trigger: str = "") -> None:
        """Re-decide which workers are active; record the decision when the set changes, or
        always when something happened (`trigger`, e.g. a worker vanished)."""
        decision = self.controller.decide(self.clock())
        self.groups.plane.window.set_floor(self.controller.s_min())
        if decision.changed or trigger:
            self.events.append(ev.Activation(
                active=sorted(decision.active), reason=decision.reason, trigger=trigger, changed=decision.changed,
                required_rps=decision.required_rps if decision.required_rps != float("inf") else None,
                estimates_rps=decision.estimates,
            ))

    # ---- rollouts and evaluations ----
    def submit(self, req: RolloutSubmission) -> SubmitResponse:
        return self.intake.submit(req)

    def submit_evaluation(self, req: EvalSubmission) -> EvalAck:
        """A worker's greedy completions for its evaluation lease, scored here (never trained)."""
        self.registry.live(req.worker_id)
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where); no evaluation leases")
        return self.evaluation.submit_checked(req, self.clock())

    def evaluation_result(self, version: int) -> EvaluationResult:
        if self.evaluation is None:
            raise RequestError(409, "this run evaluates on the learner ([evaluation] where)")
        return self.evaluation.result(version)

    # ---- learner ----
    def publish(self, info: VersionInfo, public_key_hex: str) -> bool:
        """Accept a version from the learner (`VersionDesk.publish` says which). Returns whether
        the learner should make its next version an anchor."""
        event, anchor_wanted = self.versions.publish(info, public_key_hex, self.registry.peers())
        if isinstance(event, ev.VersionPublished):
            self.groups.plane.publish(info.version)
            if self.evaluation is not None:
                self.evaluation.published(info.version)
        self.events.append(event)
        return anchor_wanted

    def observe_step_time(self, step_time_s: float) -> None:
        """The learner's busy time per step (train + publish), reported with its batch requests."""
        self.controller.observe_step_time(step_time_s)
        self.groups.plane.step_time_s = self.controller.step_time_s.value

    def checkpointed(self, durable_step: int, step: int) -> None:
        """The learner's checkpoint of `durable_step` is on disk and it asks for `step`: batches
        and groups it can never ask for again are deleted (`GroupBook.compact`)."""
        deleted = self.groups.compact(durable_step, step)
        if deleted is not None:
            self.events.append(ev.GroupsCompacted(durable_step=durable_step, groups_deleted=deleted,
                                                  store_bytes=self.store.size_bytes()))

    def take_batch(self, step: int) -> list[TrainGroup] | None:
        """The batch for learner step `step`, or None while not enough admissible groups exist.
        Asking again for an assigned step returns the same batch (exact learner resume)."""
        recorded = self.groups.recorded_batch(step)
        if recorded is not None:
            return recorded
        stale = self.groups.advance(step)
        for group in stale:
            self.controller.observe_outcome(group.worker_id, admitted=False)
        if stale:
            self.events.append(ev.GroupsDropped(reason="stale", step=step, prompt_indices=[g.prompt_index for g in stale]))
        batch = self.groups.take(step, now_s=self.clock())
        if batch is not None:
            hist = Counter(staleness(step, g.version) for g in batch)
            self.events.append(ev.BatchAssigned(
                step=step, staleness_hist={str(k): v for k, v in sorted(hist.items())}, max_staleness_seen=max(hist),
                lease_window_steps=self.groups.plane.window.steps, buffered=len(self.buffer), leased=len(self.leases),
            ))
        return batch

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: Iterable[str] = ()) -> int:
        """The learner skipped `step` without training (`GroupBook.reject`): its groups retire,
        except `requeue_lease_ids` (nothing wrong with them); those that failed the audit have
        their prompts redone. Only the newest assigned step can be rejected."""
        if self.groups.already_rejected(step):
            return 0
        with self.store.tx():
            outcome = self.groups.reject(step, requeue_lease_ids, self.audit.failed_groups, self.audit.quarantined)
            self.leases_book.redo([g.prompt_index for g in outcome.redo])
        redone = {g.lease_id for g in outcome.redo}
        self.events.append(ev.BatchRejected(
            step=step, groups=len(outcome.retired), requeued=len(outcome.kept), prompts_redone=len(outcome.redo),
            reason=reason[:500], retired_prompt_indices=[g.prompt_index for g in outcome.retired if g.lease_id not in redone],
        ))
        return len(outcome.retired)

    # ---- rollout audit ----
    def record_audit(self, report: AuditReport) -> list[str]:
        """The learner's verdicts on a step's groups; quarantines workers whose groups failed
        `audit_flags_to_quarantine` times. Returns the workers quarantined now."""
        newly = self.audit.record(report)
        for worker_id, reason in newly.items():
            self._quarantine(worker_id, reason)
        return sorted(newly)

    def _quarantine(self, worker_id: str, reason: str) -> None:
        """Cut a worker off for good: its id refused from now on (also after a restart), its
        buffered groups dropped and their prompts redone by others, its leases handed back."""
        with self.store.tx():
            self.store.set_meta("quarantined", self.audit.quarantined)
            mine = self.groups.drop_worker(worker_id)
            self.leases_book.redo([g.prompt_index for g in mine])
        released = self._release_leases(worker_id, reason="worker_quarantined")
        record = self.workers.get(worker_id)
        if record is not None:
            record.alive = False
        self.controller.vanish(worker_id)
        self.events.append(ev.WorkerQuarantined(worker_id=worker_id, reason=reason, groups_dropped=len(mine),
                                                leases_requeued=released))
        self.control(trigger=f"{worker_id} quarantined")

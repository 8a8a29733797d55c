"""What the learner asks of the coordinator, as whole transactions over its parts: publishing a
version, reporting its step time and durable checkpoint, taking a step's batch (stale groups
dropped first), handing a batch back, and the rollout audit's verdicts, which may quarantine a
worker. Every method applies a whole change or raises `RequestError` having changed nothing."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from typing import TYPE_CHECKING

from echo2.coordinator.parts import Parts
from echo2.coordinator.records import events as ev
from echo2.policy import staleness
from echo2.protocol.broadcast import BroadcastPlan
from echo2.protocol.learner_api import AuditReport
from echo2.protocol.messages import TrainGroup, VersionInfo

if TYPE_CHECKING:
    from echo2.coordinator.desks.evaluation import EvaluationDesk
    from echo2.coordinator.desks.fleet import FleetDesk



class LearnerDesk:
    def __init__(self, state: Parts, *, fleet: FleetDesk, evaluation: EvaluationDesk | None) -> None:
        self.groups, self.versions, self.controller, self.evaluation = (state.groups, state.versions, state.controller,
                                                                        evaluation)
        self.leases_book, self.audit, self.registry = state.leases_book, state.audit, state.registry
        self.fleet, self.store, self.events, self.clock = fleet, state.store, state.events, state.clock

    def publish(self, info: VersionInfo, public_key_hex: str, *, plan: bool = True) -> bool:
        """Accept a version from the learner (`VersionDesk.accept` says which) and, unless `plan`
        is False (the server plans it on a thread, then calls `adopt_plan`), plan its relay tree.
        Returns whether the learner should make its next version an anchor."""
        replayed, anchor_wanted = self.versions.accept(info, public_key_hex)
        if replayed is not None:
            self.events.append(replayed)
            return anchor_wanted
        self.groups.published(info.version)
        if self.evaluation is not None:
            self.evaluation.published(info.version)
        if plan:
            self.adopt_plan(self.versions.dissemination.plan_version(info.version, info.origin_url,
                                                                     self.registry.peers()))
        return anchor_wanted

    def unplanned(self) -> VersionInfo | None:
        """The newest version while its relay tree is still to be planned."""
        return self.versions.latest if self.versions.unplanned is not None else None

    def adopt_plan(self, plan: BroadcastPlan) -> None:
        """The newest version's tree, planned: from now on workers are sent to their places in it."""
        if self.versions.unplanned is not None and self.versions.current == plan.version:
            self.events.append(self.versions.planned(plan))

    def observe_step_time(self, step_time_s: float) -> None:
        """The learner's busy time per step (train + publish), reported with its batch requests."""
        self.controller.observe_step_time(step_time_s)
        self.groups.observe_step_time(self.controller.step_time_s.value)

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
        # a group that expires in the buffer was on time when it came: the fleet made more than
        # the learner took (or the batch share cap held it back), so its worker's admitted share
        # is not charged, as in the simulator's data plane (charging it read a fast worker's
        # surplus as lateness, and the controller then credited it a tenth of its rate)
        stale = self.groups.advance(step)
        if stale:
            self.events.append(ev.GroupsDropped(reason="stale", step=step,
                                                prompt_indices=[g.prompt_index for g in stale],
                                                straddling=sum(any(c.token_versions for c in g.completions)
                                                               for g in stale)))
        batch = self.groups.take(step, now_s=self.clock(), producing=self.leases_book.holders())
        if batch is not None:
            hist = Counter(staleness(step, g.version) for g in batch)
            largest = Counter(g.worker_id for g in batch).most_common(1)[0][1]
            since = self.groups.take_since_batch()
            self.events.append(ev.BatchAssigned(
                step=step, staleness_hist={str(k): v for k, v in sorted(hist.items())}, max_staleness_seen=max(hist),
                lease_window_steps=self.groups.window_steps, buffered=len(self.groups.buffer),
                leased=len(self.leases_book.leases), max_worker_share=round(largest / len(batch), 4),
                dropped_uninformative=since.dropped_uninformative, completions_truncated=since.completions_truncated,
            ))
        return batch

    def reject_batch(self, step: int, reason: str, requeue_lease_ids: Iterable[str] = ()) -> int:
        """The learner skipped `step` without training (`GroupBook.reject`): its groups retire,
        except `requeue_lease_ids` (nothing wrong with them); those that failed the audit have
        their prompts redone. Only the newest assigned step can be rejected."""
        if self.groups.already_rejected(step):
            return 0
        with self.store.tx():
            outcome = self.groups.reject(step, requeue_lease_ids, self.audit.redone_groups(), self.audit.quarantined)
            self.leases_book.redo([g.prompt_index for g in outcome.redo])
        redone = {g.lease_id for g in outcome.redo}
        self.events.append(ev.BatchRejected(
            step=step, groups=len(outcome.retired), requeued=len(outcome.kept), prompts_redone=len(outcome.redo),
            reason=reason[:500],
            retired_prompt_indices=[g.prompt_index for g in outcome.retired if g.lease_id not in redone],
        ))
        return len(outcome.retired)

    def record_audit(self, report: AuditReport) -> list[str]:
        """The learner's verdicts on a step's groups: each worker's record bounds and discounts the
        rate the controller credits it with (at most its rate when it delivered its newest group
        that passed, `policy.credit`), and workers whose groups failed `audit_flags_to_quarantine`
        times are quarantined. Returns the workers quarantined now."""
        newly = self.audit.record(report)
        newest_passed = self._newest_passed_seqs(report)
        for worker_id in {verdict.worker_id for verdict in report.groups}:  # credit only for checked work
            stats = self.audit.workers[worker_id]
            self.controller.observe_audit(worker_id, audited=stats.audited, failed=stats.failed,
                                          newest_passed_seq=newest_passed.get(worker_id))
        for worker_id, reason in newly.items():
            self._quarantine(worker_id, reason)
        return sorted(newly)

    def _newest_passed_seqs(self, report: AuditReport) -> dict[str, int]:
        """Per worker, the sequence number of its newest group this report passed (the buffer
        order: what the controller's rate notes are keyed by)."""
        passed = [v for v in report.groups if not v.failed]
        seqs = self.groups.seqs_of(v.lease_id for v in passed)
        newest: dict[str, int] = {}
        for verdict in passed:
            seq = seqs.get(verdict.lease_id)
            if seq is not None:
                newest[verdict.worker_id] = max(seq, newest.get(verdict.worker_id, seq))
        return newest

    def _quarantine(self, worker_id: str, reason: str) -> None:
        """Cut a worker off for good: its id refused from now on (also after a restart), its
        buffered groups dropped and their prompts redone by others, its leases handed back."""
        with self.store.tx():
            self.store.set_meta("quarantined", self.audit.quarantined)
            mine = self.groups.drop_worker(worker_id)
            self.leases_book.redo([g.prompt_index for g in mine])
        released = self.fleet.release_leases(worker_id, reason="worker_quarantined")
        record = self.registry.workers.get(worker_id)
        if record is not None and record.alive:
            self.registry.depart(record)
        self.controller.vanish(worker_id)
        self.events.append(ev.WorkerQuarantined(worker_id=worker_id, reason=reason, groups_dropped=len(mine),
                                                leases_requeued=released))
        self.fleet.control(trigger=f"{worker_id} quarantined")

"""Submitted groups, from admission to their one batch: the policy core's data plane
(`echo2.policy.DataPlane`, which the simulator drives too) over stored `TrainGroup`s, with
every change written through to the store and counted. The staleness rules themselves are
the data plane's; this class adds persistence, batch replay for an exact learner resume, the
learner's rejections and checkpoint compaction.

`add`, `count_stale_submission`, `count_scored`, `reject` and `drop_worker` write inside the caller's
transaction (the lease or prompt changes that go with them share it); `advance`, `take` and
`compact` are transactions of their own."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass

from echo2.config.run import RunConfig
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.records.store import GroupState, Store
from echo2.policy import DataPlane
from echo2.policy.dataplane import LeaseGrant
from echo2.policy.outcome import SubmissionOutcome
from echo2.policy.trust import LeaseTrust
from echo2.protocol.messages import TrainGroup
from echo2.protocol.token_versions import tokens_by_version


@dataclass
class Counters:
    accepted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    leases_expired: int = 0
    workers_lost: int = 0
    rejected_by_learner: int = 0
    """Groups of batches the learner could not train on (non-finite loss or gradient, or a
    failed rollout audit)."""
    dropped_quarantined: int = 0
    """Buffered groups of workers quarantined by the rollout audit (their prompts are redone)."""
    scored: int = 0
    """Groups scored while admissible under S, each then checked for being uninformative
    (accepted + dropped_uninformative; stale ones count in dropped_stale)."""
    dropped_uninformative: int = 0
    """Scored groups whose rewards all equal each other (grpo.drop_uninformative_groups): never
    sent to the learner, their prompts done (`policy.rewards`)."""
    completions_truncated: int = 0
    """Completions of scored groups cut off at sampling.max_new_tokens without an EOS."""
    uninformative_audited: int = 0
    """Uninformative groups sent to the learner anyway, weightless, for the rollout audit
    (audit.uninformative_fraction); counted in accepted, not in dropped_uninformative."""

    def save(self, store: Store) -> None:
        store.set_meta("counters", asdict(self))


@dataclass
class SinceBatch:
    """Tallies since the previous batch was assigned (its batch_assigned record carries them)."""

    dropped_uninformative: int = 0
    completions_truncated: int = 0


@dataclass(frozen=True)
class Rejection:
    """What became of a rejected step's groups."""

    retired: list[TrainGroup]
    """Not trained and never again (a poisoned group would poison every batch it joined)."""
    kept: list[TrainGroup]
    """Back at the head of the buffer: nothing was wrong with them."""
    redo: list[TrainGroup]
    """Retired ones that failed the audit (or whose worker is quarantined): prompts redone."""


def _version(group: TrainGroup) -> int:
    return group.version


def _worker(group: TrainGroup) -> str:
    return group.worker_id


def _tokens(group: TrainGroup) -> dict[int, int]:
    return tokens_by_version(group.completions, group.version)


class GroupBook:
    def __init__(self, store: Store, counters: Counters, cfg: RunConfig, *, current_version: int,
                 clock: Callable[[], float]) -> None:
        """The data plane under the run's [train] bounds (S, the per-token bound, fresh leases),
        its batch (grpo.prompts_per_step), the lease cap per worker and the share cap, with
        each worker's delivery measured on `clock`."""
        self.store, self.counters = store, counters
        # steps before the learner's newest checkpoint have no batch left (see `compact`)
        self.durable_step: int = store.get_meta("durable_step", 0)
        self.plane: DataPlane[TrainGroup] = DataPlane(
            cfg.train.max_staleness, cfg.grpo.prompts_per_step, _version,
            max_leases_per_worker=cfg.coordinator.max_leases_per_worker,
            buffer=store.groups_in_state(GroupState.BUFFERED), learner_step=store.get_meta("learner_step", 0),
            steps_taken=max(store.last_batch_step() + 1, self.durable_step), current_version=current_version,
            fresh_leases=cfg.train.fresh_leases, worker_of=_worker, max_worker_share=cfg.activation.max_worker_share,
            tokens_of=_tokens, max_masked_fraction=cfg.train.max_masked_fraction,
            segment_swaps=cfg.sampling.segment_tokens > 0, trust=LeaseTrust(clock, cfg.coordinator.lease_timeout_s),
        )
        self.seq = store.max_seq() + 1
        self.since_batch = SinceBatch()
        """What the step's batch_assigned record reports (in memory: a restarted coordinator's
        first one counts from its start; the counters hold the durable totals)."""
        self.dropped_in_a_row = 0
        """Uninformative groups dropped since the last one admitted (the stall guard's count)."""

    @property
    def buffer(self) -> list[TrainGroup]:
        """Admitted groups waiting for a batch, oldest first."""
        return self.plane.buffer

    # ---- the data plane's rules, as the desks ask them ----
    @property
    def learner_step(self) -> int:
        """The step the learner asked for last."""
        return self.plane.learner_step

    @property
    def steps_taken(self) -> int:
        """Steps whose batch was assigned (the next batch is for this step)."""
        return self.plane.steps_taken

    @property
    def groups_per_step(self) -> int:
        return self.plane.groups_per_step

    @property
    def window_steps(self) -> int:
        """How many steps ahead of the learner groups are leased now (policy.window)."""
        return self.plane.window.steps

    @property
    def trust(self) -> LeaseTrust:
        """What each worker has earned: its lease allowance and deadline (policy.trust)."""
        return self.plane.trust

    def may_lease(self, worker_version: int) -> bool:
        return self.plane.may_lease(worker_version)

    def admits(self, group: TrainGroup) -> bool:
        """Admissible at the learner's current step (t - v <= S, or its stale tokens few enough)."""
        return self.plane.admits(group)

    def grant(self, worker_id: str, worker_version: int, wanted: int, *, leased: int, held_by_worker: int,
              held_by_new: int) -> LeaseGrant:
        return self.plane.grant(worker_version, wanted, leased=leased, held_by_worker=held_by_worker,
                                worker_id=worker_id, held_by_new=held_by_new)

    def published(self, version: int) -> None:
        self.plane.publish(version)

    def observe_step_time(self, step_time_s: float) -> None:
        self.plane.step_time_s = step_time_s

    def observe_submission(self, outcome: SubmissionOutcome) -> None:
        self.plane.observe_submission(outcome)

    def set_window_floor(self, s_min: int | None) -> None:
        """The measured S_min: the lease window never shrinks below it."""
        self.plane.window.set_floor(s_min)

    def add(self, group: TrainGroup) -> int:
        """An admitted group into the buffer (its lease closes in the same transaction); returns
        its sequence number, the buffer order."""
        seq = self.seq
        self.store.add_group(group, seq)
        self.seq += 1
        self.plane.add(group)
        self.counters.accepted += 1
        self.counters.save(self.store)
        return seq

    def seqs_of(self, lease_ids: Iterable[str]) -> dict[str, int]:
        """The sequence numbers of these stored groups (those not stored left out)."""
        return self.store.group_seqs(lease_ids)

    def count_stale_submission(self) -> None:
        self.counters.dropped_stale += 1
        self.counters.save(self.store)

    def count_scored(self, *, fresh: bool, uninformative: bool, truncated: int) -> None:
        """A scored group's tallies (saved with the caller's next write, in its transaction):
        `fresh`, admissible under S; `uninformative` and dropped for it; `truncated` completions."""
        self.counters.scored += fresh
        self.counters.dropped_uninformative += uninformative
        self.counters.completions_truncated += truncated
        self.since_batch.dropped_uninformative += uninformative
        self.since_batch.completions_truncated += truncated
        self.counters.save(self.store)

    def recorded_batch(self, step: int) -> list[TrainGroup] | None:
        """Step `step`'s batch when it was assigned already (asked again: the same batch, for an
        exact learner resume); refused for steps no batch can be given for."""
        recorded = self.store.batch(step)
        if recorded is not None:
            return recorded
        if step < self.durable_step:
            raise RequestError(409, f"step {step}'s batch was deleted once the learner checkpointed step "
                                    f"{self.durable_step}; resume the learner from that checkpoint or a newer one")
        if step < self.plane.steps_taken - 1:
            raise RequestError(409, f"step {step} was never assigned a batch; the learner is at an unknown step")
        return None

    def advance(self, step: int) -> list[TrainGroup]:
        """The learner is at `step`: buffered groups too stale for it are dropped (returned)."""
        if step != self.plane.learner_step:
            self.store.set_meta("learner_step", step)
        stale = self.plane.advance(step)
        if stale:
            with self.store.tx():
                self.store.set_group_state([g.lease_id for g in stale], GroupState.DROPPED, step)
                self.counters.dropped_stale += len(stale)
                self.counters.save(self.store)
        return stale

    def take(self, step: int, now_s: float, producing: Iterable[str] = ()) -> list[TrainGroup] | None:
        """A new batch for `step`, recorded with its groups marked trained; None while too few
        admissible groups are buffered (or, for a while, too few beside one worker's share:
        `producing`, the workers holding leases, may still send theirs)."""
        batch = self.plane.take_batch(step, now_s=now_s, producing=producing)
        if batch is None:
            return None
        ids = [g.lease_id for g in batch]
        with self.store.tx():
            self.store.set_group_state(ids, GroupState.TRAINED, step)
            self.store.save_batch(step, ids)
            self.counters.trained += len(batch)
            self.counters.save(self.store)
        return batch

    def take_since_batch(self) -> SinceBatch:
        """The tallies since the previous batch, started over (a new batch was assigned)."""
        taken, self.since_batch = self.since_batch, SinceBatch()
        return taken

    def already_rejected(self, step: int) -> bool:
        """A retried rejection whose first answer was lost."""
        return (step == self.plane.steps_taken and self.store.batch(step) is None
                and self.store.has_groups(GroupState.REJECTED, step))

    def reject(self, step: int, requeue_lease_ids: Iterable[str], failed: set[str],
               quarantined: dict[str, str]) -> Rejection:
        """Retire step `step`'s batch (inside a transaction): groups in `requeue_lease_ids` go back
        to the head of the buffer unless they failed the audit or were held out (`failed` group
        ids: their prompts are redone) or their worker is `quarantined`; the step gets a fresh
        batch when asked again."""
        if step != self.plane.steps_taken - 1:
            raise RequestError(409, f"step {step} cannot be rejected: the newest assigned batch is step "
                                    f"{self.plane.steps_taken - 1}")
        groups = self.store.batch(step) or []
        wanted = set(requeue_lease_ids)
        kept = [g for g in groups
                if g.lease_id in wanted and g.worker_id not in quarantined and g.lease_id not in failed]
        kept_ids = {g.lease_id for g in kept}
        retired = [g for g in groups if g.lease_id not in kept_ids]
        redo = [g for g in retired if g.lease_id in failed or g.worker_id in quarantined]
        self.store.set_group_state([g.lease_id for g in retired], GroupState.REJECTED, step)
        self.store.set_group_state(list(kept_ids), GroupState.BUFFERED, None)
        self.store.delete_batch(step)
        self.counters.trained -= len(groups)
        self.counters.rejected_by_learner += len(retired)
        self.counters.save(self.store)
        self.plane.requeue_front(kept)  # the batch took the oldest groups: they stay the oldest
        self.plane.steps_taken = step
        return Rejection(retired, kept, redo)

    def drop_worker(self, worker_id: str) -> list[TrainGroup]:
        """A quarantined worker's buffered groups, dropped (inside a transaction)."""
        mine = [g for g in self.buffer if g.worker_id == worker_id]
        self.store.set_group_state([g.lease_id for g in mine], GroupState.QUARANTINED, self.plane.learner_step)
        self.counters.dropped_quarantined += len(mine)
        self.counters.save(self.store)
        self.plane.remove(lambda g: g.worker_id != worker_id)
        return mine

    def compact(self, durable_step: int, step: int) -> int | None:
        """The learner's checkpoint of `durable_step` is on disk, and it asks for `step` now: it
        resumes from that checkpoint or a newer one, never an older one, so the batches of
        earlier steps and their groups are deleted and the space returned. What resume needs
        stays: the batches of steps >= durable_step (a learner killed before its next
        checkpoint replays them exactly) and every buffered group. Returns the groups deleted;
        None when `durable_step` is no newer than the last one."""
        steps_taken = self.plane.steps_taken
        if durable_step > min(step, steps_taken):
            raise RequestError(422, f"durable_step={durable_step} is ahead of what the learner was given (step={step}, "
                                    f"batches assigned up to step {steps_taken - 1}): it can only have "
                                    "checkpointed steps it trained")
        if durable_step <= self.durable_step:
            return None
        with self.store.tx():
            deleted = self.store.compact(durable_step)
            self.store.set_meta("durable_step", durable_step)
        self.store.reclaim()
        self.durable_step = durable_step
        return deleted

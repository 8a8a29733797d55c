"""A worker's submitted group, from its lease to the buffer: the lease and version checked, the
completions validated against the sampling settings (`check`, on the event loop), rewards
computed here, never taken from the worker (by the scoring pool, off the loop, or inline in
`submit`), then in one transaction (`apply`, the lease checked again) the worker's measured
throughput updated and the group admitted under the staleness bound or dropped as stale."""

from __future__ import annotations

import time
from collections.abc import Callable

from echo2.coordinator import events as ev
from echo2.coordinator.errors import RequestError
from echo2.coordinator.groups import GroupBook
from echo2.coordinator.leases import Lease, LeaseBook
from echo2.coordinator.registry import Registry, WorkerRecord
from echo2.coordinator.score_jobs import Mismatch, Outcome, Scoring, inline_outcomes, rollout_jobs
from echo2.coordinator.score_limits import ScoringLimits
from echo2.coordinator.scoring import Scorer
from echo2.coordinator.store import Store
from echo2.coordinator.validation import check_submission
from echo2.coordinator.versions import VersionDesk
from echo2.policy.controller import ActivationController
from echo2.protocol.messages import RolloutSubmission, SamplingParams, SubmitResponse, TrainGroup


class RolloutIntake:
    def __init__(self, *, registry: Registry, leases: LeaseBook, groups: GroupBook, versions: VersionDesk,
                 controller: ActivationController, scorer: Scorer, sampling: SamplingParams, store: Store,
                 limits: ScoringLimits, events: list[ev.Event], clock: Callable[[], float]) -> None:
        self.registry, self.leases, self.groups, self.versions = registry, leases, groups, versions
        self.controller, self.scorer, self.sampling, self.store = controller, scorer, sampling, store
        self.limits, self.events, self.clock = limits, events, clock

    def submit(self, req: RolloutSubmission) -> SubmitResponse:
        """The whole submission with its group scored here and now (tests and tools that drive
        the state machine directly; the server scores off its event loop, `submit_scored`)."""
        lease = self.check(req)
        started = time.perf_counter()
        outcomes = inline_outcomes(self.scorer, rollout_jobs(lease.prompt_index, req.completions))
        return self.apply(req, lease, outcomes, time.perf_counter() - started)

    async def submit_scored(self, req: RolloutSubmission, scoring: Scoring) -> SubmitResponse:
        """The server's path: checked on the event loop, scored by `scoring` (the coordinator's
        pool of processes) while the loop serves other requests, then applied whole."""
        lease = self.check(req)
        with self.limits.scoring(req.worker_id):
            started = time.perf_counter()
            outcomes = await scoring.score(rollout_jobs(lease.prompt_index, req.completions),
                                           give_up_after=self.limits.strikes_left(req.worker_id))
        return self.apply(req, lease, outcomes, time.perf_counter() - started)

    def check(self, req: RolloutSubmission) -> Lease:
        """What is checked before any scoring (cheap, changes nothing): the worker, its lease,
        the version, the completions against the sampling settings, the scoring limits."""
        self.registry.live(req.worker_id)
        lease = self._held(req)
        self.versions.check(req.version, "rollout.version")
        if req.version < lease.version:
            raise RequestError(422, f"rollout.version={req.version} is older than the lease's version {lease.version}")
        problem = check_submission(req, self.sampling, self.scorer.vocab_size, self.scorer.max_episode_tokens)
        if problem:
            raise RequestError(422, problem)
        self.limits.admit(req.worker_id)
        return lease

    def _held(self, req: RolloutSubmission) -> Lease:
        lease = self.leases.of(req.lease_id, req.worker_id)
        if lease is None:
            raise RequestError(409, f"lease {req.lease_id!r} is not held by {req.worker_id!r} (expired, re-leased or "
                                    "never leased)")
        return lease

    def apply(self, req: RolloutSubmission, lease: Lease, outcomes: list[Outcome], scoring_s: float) -> SubmitResponse:
        """The scored group, applied whole. The lease is checked again: it may have expired (and
        its prompt gone to another worker) while the group was scored, and then nothing is
        applied (409, as for any lease no longer held)."""
        rewards = self._rewards(lease, req, outcomes, scoring_s)
        record = self.registry.live(req.worker_id)
        self._held(req)  # lease ids are never reused: still held is still this lease
        record.rollouts += len(req.completions)
        tokens = sum(len(c.token_ids) for c in req.completions)
        record.tokens += tokens
        record.gen_time_s += req.gen_time_s
        self.controller.observe_tokens(req.worker_id, tokens, req.gen_time_s)
        fresh = self.groups.plane.admits(req.version)
        self.controller.observe_outcome(req.worker_id, admitted=fresh)
        self.groups.plane.trust.submitted(req.worker_id, self.clock() - lease.leased_at, accepted=fresh)
        with self.store.tx():
            if fresh:
                self.groups.add(TrainGroup(lease_id=lease.lease_id, prompt_index=lease.prompt_index,
                                           prompt_ids=self.scorer.prompt_ids(lease.prompt_index), version=req.version,
                                           worker_id=req.worker_id, rewards=rewards, completions=req.completions,
                                           sampling_seed=self._seed(record, lease)))
            else:
                self.groups.count_stale_submission()
            self.leases.close(lease)
        self._measure(record)
        if fresh:
            return SubmitResponse(accepted=True, rewards=rewards)
        step = self.groups.plane.learner_step
        self.events.append(ev.GroupsDropped(reason="stale", step=step, prompt_indices=[lease.prompt_index]))
        return SubmitResponse(accepted=False, rewards=rewards,
                              reason=f"stale: step {step} - version {req.version} > S")

    def _rewards(self, lease: Lease, req: RolloutSubmission, outcomes: list[Outcome], scoring_s: float) -> list[float]:
        """Computed here, never taken from the worker (a completion cut off over its budget scores
        0 and counts against the worker); a multi-turn transcript that its seed and its own
        actions do not reproduce is refused whole (and recorded: an honest worker never sends
        one)."""
        rewards = self.limits.values(req.worker_id, "rollout", req.lease_id, outcomes)
        for index, outcome in enumerate(outcomes):
            if isinstance(outcome, Mismatch):
                reason = f"rollout.completions[{index}] does not replay: {outcome.reason}"
                self.events.append(ev.ReplayRefused(worker_id=req.worker_id, lease_id=req.lease_id,
                                                    prompt_index=lease.prompt_index, reason=reason[:500]))
                raise RequestError(422, f"{reason}; the group is refused")
        if self.scorer.max_episode_tokens is not None:  # what verifying the episodes cost us
            self.events.append(ev.EpisodesReplayed(worker_id=req.worker_id, episodes=len(rewards), replay_s=scoring_s))
        return rewards

    def _seed(self, record: WorkerRecord, lease: Lease) -> int | None:
        """The seed its tokens were drawn with, for the audit to check: seeded workers only (a
        multi-turn group's actions are drawn with it too, turn after turn)."""
        return self.leases.seed_of(lease.lease_id) if record.sampler == "seeded" else None

    def _measure(self, record: WorkerRecord) -> None:
        """Throughput as the coordinator sees it: validated rollouts per second of holding
        leases or being too stale to get any. A worker's own figures (heartbeats) never steer activation: one claiming 10^6
        rollouts/s once had the honest workers switched off."""
        self.controller.observe_busy(record.worker_id, *record.work_counters(self.clock()))

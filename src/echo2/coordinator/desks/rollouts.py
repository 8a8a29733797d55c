"""A worker's submitted group, from its lease to the buffer: the lease and version checked, the
completions validated against the sampling settings (`check`, on the event loop), rewards
computed here, never taken from the worker (by the scoring pool, off the loop, or inline in
`submit`) and shaped by length (`policy.rewards`: grpo.overlong_buffer_tokens), then in one
transaction (`apply`, the lease checked again) the worker's measured throughput updated and the
group admitted under the staleness bound, dropped as stale, or dropped as uninformative (all its
rewards equal: grpo.drop_uninformative_groups; its prompt is done, and the lease window refills
the batch with other prompts, since a dropped group is neither leased nor buffered)."""

from __future__ import annotations

import random
import time

from echo2.config.task import trusted_workers_only
from echo2.coordinator.parts import Parts
from echo2.coordinator.parts.leases import Lease
from echo2.coordinator.parts.registry import WorkerRecord
from echo2.coordinator.records import events as ev
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import Mismatch, Outcome, Scoring, inline_outcomes, rollout_jobs
from echo2.coordinator.scoring.validation import check_submission
from echo2.policy.dataplane import segment_seconds
from echo2.policy.outcome import SubmissionOutcome
from echo2.policy.rewards import RewardRules, is_uninformative, truncated
from echo2.protocol.messages import RolloutSubmission, SamplingParams, SubmitResponse, TrainGroup


class RolloutIntake:
    def __init__(self, state: Parts) -> None:
        """Checks against the run's [sampling], rewards shaped by [grpo] (`RewardRules`)."""
        self.registry, self.leases, self.groups, self.versions = (state.registry, state.leases_book, state.groups,
                                                                  state.versions)
        self.controller, self.scorer, self.audit = state.controller, state.scorer, state.audit
        self.store, self.limits = state.store, state.limits
        self.events, self.clock = state.events, state.clock
        self.sampling = SamplingParams.of(state.cfg.sampling)
        self.rules = RewardRules.from_config(state.cfg.grpo, state.cfg.audit)
        # only a worker-trusted environment's replay takes the worker's tool answers
        self.takes_tool_answers = trusted_workers_only(state.cfg.task)
        self._draws = random.SystemRandom()  # which dropped groups the audit sees: unpredictable
        counters = self.groups.counters  # a restarted coordinator plans with the share it measured before
        self.controller.observe_uninformative(counters.dropped_uninformative, counters.scored)

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
        problem = check_submission(req, self.sampling, self.scorer.vocab_size, self.scorer.max_episode_tokens,
                                   newest_version=self.versions.current, tool_answers=self.takes_tool_answers)
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
        applied (409, as for any lease no longer held).

        A group dropped as uninformative is delivered work: the worker's rate, its admitted
        share and its lease trust count it as they count a buffered group (it did the work, and
        dropping it is our choice). So that such work is checked too, a sample of these groups
        (every one of a worker not yet audited 4 times, then audit.uninformative_fraction) is
        buffered instead: the learner weighs it nothing and its rollout audit checks it, so a
        worker whose groups all score alike (one returning its greedy choice G times) is caught
        like any other."""
        rewards = self._rewards(lease, req, outcomes, scoring_s)
        record = self.registry.live(req.worker_id)
        self._held(req)  # lease ids are never reused: still held is still this lease
        tokens = sum(len(c.token_ids) for c in req.completions)
        record.rollouts += len(req.completions)
        record.tokens += tokens
        record.gen_time_s += req.gen_time_s
        group = TrainGroup(lease_id=lease.lease_id, prompt_index=lease.prompt_index,
                           prompt_ids=self.scorer.prompt_ids(lease.prompt_index), version=req.version,
                           worker_id=req.worker_id, rewards=rewards, completions=req.completions,
                           sampling_seed=self._seed(record, lease), audit=self.audit.audit_mode(req.worker_id))
        fresh = self.groups.admits(group)
        uninformative = fresh and self._drops(rewards, req.worker_id)
        group_seq = None
        with self.store.tx():
            self.groups.count_scored(fresh=fresh, uninformative=uninformative, truncated=self._truncated(req))
            # an uninformative one is counted only: its closed lease marks the prompt done
            if fresh and not uninformative:
                group_seq = self.groups.add(group)
            elif not fresh:
                self.groups.count_stale_submission()
            self.leases.close(lease)
        outcome = self._outcome(req, record, lease, tokens=tokens, admitted=fresh, group_seq=group_seq)
        self.controller.observe_submission(outcome)
        self.groups.observe_submission(outcome)
        return self._reply(req, lease, rewards, fresh=fresh, uninformative=uninformative)

    def _outcome(self, req: RolloutSubmission, record: WorkerRecord, lease: Lease, *, tokens: int,
                 admitted: bool, group_seq: int | None) -> SubmissionOutcome:
        """What the applied group teaches activation and the data plane. Throughput is as the
        coordinator sees it: validated rollouts per second of holding leases or being too stale
        to get any; a worker's own figures (heartbeats) never steer activation."""
        now = self.clock()
        held_s = now - lease.leased_at
        segment_s = None
        if self.sampling.segment_tokens > 0:  # how far ahead swapping workers may lease (DataPlane.ahead_steps)
            longest = max(len(c.token_ids) for c in req.completions)
            segment_s = segment_seconds(held_s, self.sampling.segment_tokens, longest)
        counters = self.groups.counters
        return SubmissionOutcome(req.worker_id, admitted, held_s, tokens, req.gen_time_s,
                                 *record.work_counters(now), segment_s=segment_s,
                                 dropped_uninformative_total=counters.dropped_uninformative,
                                 scored_total=counters.scored, group_seq=group_seq)

    def _drops(self, rewards: list[float], worker_id: str) -> bool:
        """Dynamic sampling with its stall guard (policy.rewards.STALL_GUARD_BATCHES: a long run
        of dropped groups lets the next one through, and says so once per streak) and the
        audit's sample of what it drops (RewardRules.audit_keeps)."""
        dropped = self.rules.drops(rewards, dropped_in_a_row=self.groups.dropped_in_a_row,
                                   groups_per_step=self.groups.groups_per_step)
        view = self.controller.workers.get(worker_id)
        audited = dropped and self.rules.audit_keeps(worker_audited=view.audited if view else 0,
                                                     draw=self._draws.random())
        if audited:  # buffered: the audit sees it, the learner weighs it nothing
            self.groups.counters.uninformative_audited += 1
            dropped = False
        elif is_uninformative(rewards) and self.rules.drop_uninformative_groups and not dropped:
            self.events.append(ev.UninformativeStreak(step=self.groups.learner_step,
                                                      dropped_in_a_row=self.groups.dropped_in_a_row))
        self.groups.dropped_in_a_row = self.groups.dropped_in_a_row + 1 if dropped else 0
        return dropped

    def _reply(self, req: RolloutSubmission, lease: Lease, rewards: list[float], *, fresh: bool,
               uninformative: bool) -> SubmitResponse:
        """The worker's answer, and the event of a dropped group (where its prompt went)."""
        step = self.groups.learner_step
        if uninformative:
            self.events.append(ev.GroupsDropped(reason="uninformative", step=step, prompt_indices=[lease.prompt_index]))
            return SubmitResponse(accepted=True, rewards=rewards,
                                  reason="uninformative: every reward equal, not trained")
        if fresh:
            return SubmitResponse(accepted=True, rewards=rewards)
        straddled = any(c.token_versions for c in req.completions)
        self.events.append(ev.GroupsDropped(reason="stale", step=step, prompt_indices=[lease.prompt_index],
                                            straddling=int(straddled)))
        why = "too many of its tokens older than S" if straddled else f"step {step} - version {req.version} > S"
        return SubmitResponse(accepted=False, rewards=rewards, reason=f"stale: {why}")

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
            return rewards  # an episode's length is its turns', not one completion's: no overlong shaping
        return self.rules.shaped(rewards, [len(c.token_ids) for c in req.completions],
                                 max_new_tokens=self.sampling.max_new_tokens)

    def _truncated(self, req: RolloutSubmission) -> int:
        """Completions cut off at the length cap (single-turn: an episode ends by its rules)."""
        if self.scorer.max_episode_tokens is not None:
            return 0
        return sum(truncated(c.token_ids, max_new_tokens=self.sampling.max_new_tokens, eos_ids=self.scorer.eos_ids)
                   for c in req.completions)

    def _seed(self, record: WorkerRecord, lease: Lease) -> int | None:
        """The seed its tokens were drawn with, for the audit to check: seeded workers only (a
        multi-turn group's actions are drawn with it too, turn after turn)."""
        return self.leases.seed_of(lease.lease_id) if record.sampler == "seeded" else None

"""What a scored group's rewards become before it may reach the learner: the one place the two
rules live that the coordinator applies after scoring (`coordinator.rollouts`) and the planner
and simulator model (`planner.capacity`, `sim.dataplane`).

1. Overlong shaping (DAPO, arXiv 2503.14476, eq. 13: the soft overlong punishment). With
   L = sampling.max_new_tokens and a buffer of Lb tokens (grpo.overlong_buffer_tokens), a
   completion of n tokens gets a penalty added to its task reward:

       0                              if n <= L - Lb
       -(n - (L - Lb)) / Lb * penalty  if L - Lb < n <= L

   so it grows linearly to -penalty (grpo.overlong_penalty) at the length cap. Completions
   never exceed L here (the coordinator refuses longer ones), so the paper's third case
   (|y| > L_max: -1) cannot occur; a completion cut off at L gets the whole penalty.
2. Dynamic sampling (DAPO's, at the coordinator): a group whose rewards all equal each other
   has zero spread, so its group-normalised advantages (r - mean) / (std + eps) are all zero
   (`learner.grpo.group_advantages`) and it teaches nothing; with
   grpo.drop_uninformative_groups it is counted and never sent to the learner. Its prompt
   counts as done, and the lease window refills the batch with other prompts.

Pure functions over plain numbers, no I/O: the shaped rewards are what the uninformative check
sees, so a group whose completions all scored 1 but ran to different lengths still teaches.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass

from echo2.config.audit import AuditConfig
from echo2.config.grpo import GRPOConfig


def overlong_penalty(length_tokens: int, *, max_new_tokens: int, buffer_tokens: int, penalty: float) -> float:
    """The penalty (<= 0) of a completion of `length_tokens` (rule 1); 0 with no buffer."""
    if buffer_tokens <= 0:
        return 0.0
    if not 0 < buffer_tokens < max_new_tokens:
        raise ValueError(f"grpo.overlong_buffer_tokens={buffer_tokens} must be below sampling.max_new_tokens="
                         f"{max_new_tokens}: lower the buffer or raise max_new_tokens")
    over_tokens = length_tokens - (max_new_tokens - buffer_tokens)
    if over_tokens <= 0:
        return 0.0
    return -min(over_tokens, buffer_tokens) / buffer_tokens * penalty


def is_uninformative(rewards: Sequence[float]) -> bool:
    """Every reward of the group equal (rule 2). Exactly equal, not nearly: the learner gives
    zero advantage only to a group whose spread is exactly 0; a tiny spread is normalised up
    by its own std into full-sized advantages."""
    return len(rewards) > 0 and max(rewards) == min(rewards)


@dataclass(frozen=True)
class RewardRules:
    """The run's reward rules, from [grpo] and [audit] (`from_config`)."""

    overlong_buffer_tokens: int = 0
    """0: no shaping."""
    overlong_penalty: float = 1.0
    drop_uninformative_groups: bool = True
    audit_fraction: float = 0.0
    """Share of the uninformative groups of an audited worker sent to the learner anyway, for
    the rollout audit only (audit.uninformative_fraction; 0: none)."""
    audited_before_dropping: int = 0
    """Every uninformative group of a worker with fewer audited groups than this is sent to the
    learner for the audit (AUDITED_BEFORE_DROPPING when the audit is on)."""

    @classmethod
    def from_config(cls, grpo: GRPOConfig, audit: AuditConfig) -> RewardRules:
        """Overlong shaping and dynamic sampling as configured; the audit's sample of dropped
        groups only while the rollout audit runs."""
        return cls(overlong_buffer_tokens=grpo.overlong_buffer_tokens, overlong_penalty=grpo.overlong_penalty,
                   drop_uninformative_groups=grpo.drop_uninformative_groups,
                   audit_fraction=audit.uninformative_fraction if audit.enabled else 0.0,
                   audited_before_dropping=AUDITED_BEFORE_DROPPING if audit.enabled else 0)

    def shaped(self, rewards: Sequence[float], lengths_tokens: Sequence[int], *, max_new_tokens: int) -> list[float]:
        """Task rewards plus each completion's overlong penalty (rule 1), L = `max_new_tokens`."""
        if len(rewards) != len(lengths_tokens):
            raise ValueError(f"{len(rewards)} rewards for {len(lengths_tokens)} completions")
        return [reward + overlong_penalty(n, max_new_tokens=max_new_tokens, buffer_tokens=self.overlong_buffer_tokens,
                                          penalty=self.overlong_penalty)
                for reward, n in zip(rewards, lengths_tokens, strict=True)]

    def drops(self, rewards: Sequence[float], *, dropped_in_a_row: int = 0, groups_per_step: int = 0) -> bool:
        """Whether a scored group with these (shaped) rewards stays away from the learner: it is
        uninformative and fewer than STALL_GUARD_BATCHES batches' worth of groups
        (`groups_per_step` each; 0: no guard) were dropped in a row before it."""
        if not (self.drop_uninformative_groups and is_uninformative(rewards)):
            return False
        return groups_per_step <= 0 or dropped_in_a_row < STALL_GUARD_BATCHES * groups_per_step


    def audit_keeps(self, *, worker_audited: int, draw: float) -> bool:
        """Whether an uninformative group goes to the learner after all, weightless (the learner
        gives it no weight: `learner.step`), so the rollout audit sees it: a worker whose
        groups all score alike (a greedy "chooser" returns G equal completions) would otherwise
        never be audited, and would be credited and paid for work no one checks. Every one until
        the worker has `audited_before_dropping` audited groups, then `audit_fraction` of them
        (`draw`: uniform in [0, 1), from a stream workers cannot predict)."""
        return worker_audited < self.audited_before_dropping or draw < self.audit_fraction


AUDITED_BEFORE_DROPPING = 4
"""Audited groups a worker needs before its uninformative groups may go unseen: a new worker's
first ones all reach the audit (flags_to_quarantine failures quarantine it)."""

STALL_GUARD_BATCHES = 4
"""A model that solves every prompt's completions all or none of the time (an untrained one, a
task too hard or too easy) makes every group uninformative: dropped, they would leave the
learner waiting for a batch forever. After this many batches' worth of groups dropped in a row
the next uninformative group is admitted (zero advantage: the step moves nothing but the run
goes on, evaluates and says why), and the streak starts again."""


def truncated(token_ids: Sequence[int], *, max_new_tokens: int, eos_ids: frozenset[int]) -> bool:
    """A completion cut off by the length cap: it used all max_new_tokens and its last token is
    no end of sequence (workers keep the EOS they stopped at, `models.generation`)."""
    return len(token_ids) >= max_new_tokens and (not token_ids or token_ids[-1] not in eos_ids)


MIN_GROUPS_MEASURED = 20
"""Scored groups before the measured uninformative share replaces the prior: the first few
groups of a run swing it from 0 to 1."""
MAX_UNINFORMATIVE_SHARE = 0.95
"""The largest share planned for (workload.uninformative_share's bound): the fleet needed is
1 / (1 - d) times the batch's, 20x here."""


RECENT_GROUPS = 200
"""Scored groups d is measured over once a run has scored this many: d rises as the policy
learns (more of its groups are all right), and the share over the whole run lags it, so the
fleet was sized for an earlier, weaker policy and the learner waited (fleet_ssh seed 1: d went
from about 0.2 to 0.5 while held-out accuracy rose from 0.82 to 0.93)."""


class UninformativeShare:
    """d as a run measures it: groups dropped as uninformative over groups scored, over about
    the last RECENT_GROUPS scored (all of them before that), the prior until MIN_GROUPS_MEASURED
    are scored, capped at MAX_UNINFORMATIVE_SHARE. Fed the running totals."""

    def __init__(self) -> None:
        self.marks: deque[tuple[int, int]] = deque()
        """(scored, dropped) totals as observed, oldest first: the first is where the window starts."""

    def observe(self, dropped_groups: int, scored_groups: int, *, prior: float = 0.0) -> float:
        if scored_groups < MIN_GROUPS_MEASURED:
            return prior
        if self.marks and scored_groups < self.marks[-1][0]:  # counters that began again
            self.marks.clear()
        self.marks.append((scored_groups, dropped_groups))
        while len(self.marks) > 1 and scored_groups - self.marks[1][0] >= RECENT_GROUPS:
            self.marks.popleft()
        start_scored, start_dropped = self.marks[0] if scored_groups - self.marks[0][0] >= RECENT_GROUPS else (0, 0)
        return min(MAX_UNINFORMATIVE_SHARE, (dropped_groups - start_dropped) / (scored_groups - start_scored))

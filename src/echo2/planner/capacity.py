"""Overlap-based capacity model (ECHO2.md section 4): how much rollout throughput keeps the
learner busy, the smallest staleness bound that hides dissemination and generation, and the
learner utilization a given worker set buys.

Symbols: B rollouts per learner step, T_train learner seconds per step, S staleness bound,
T_dis dissemination latency (publish -> worker holds and has loaded the version), T_gen time
for a worker to finish one rollout group, T_stall per-version time a worker cannot generate,
r_i a worker's throughput in rollouts/s, d the share of scored groups dropped as uninformative
(all rewards equal: `policy.rewards`), which the fleet must generate on top of B. With segment
swaps (in-flight weight updates, sampling.segment_tokens): T_seg one segment's generation time
(the swap granularity) and f the share of a group's tokens that may be too stale
(train.max_masked_fraction). Pure functions, no state, no I/O: the coordinator's controller, the
simulator and `echo2 plan` share them.
"""

from __future__ import annotations

import math

# Float sums like 0.1 + 0.2 must not push an exact multiple of T_train one S too high.
_REL_EPS = 1e-9


def _check_positive(name: str, value: float) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0 (got {value!r})")


def _check_non_negative(name: str, value: float) -> None:
    if not value >= 0:
        raise ValueError(f"{name} must be >= 0 (got {value!r})")


def rollouts_generated_per_step(batch_rollouts: int, uninformative_share: float = 0.0) -> float:
    """B / (1 - d): rollouts the fleet generates per learner step when a share d of the scored
    groups is dropped as uninformative and the batch is refilled with other prompts until it
    holds B rollouts of informative groups (each draw is informative with probability 1 - d, so
    the expected draws per kept group are 1 / (1 - d)). The one place d enters the model: every
    rate and utilization below goes through it."""
    _check_positive("batch_rollouts", batch_rollouts)
    if not 0 <= uninformative_share < 1:
        raise ValueError(f"uninformative_share must be in [0, 1) (got {uninformative_share!r}): it is the share of "
                         "scored groups dropped, and at 1 no batch ever fills")
    return batch_rollouts / (1.0 - uninformative_share)


def base_throughput_rps(batch_rollouts: int, step_time_s: float, *, uninformative_share: float = 0.0) -> float:
    """Rate condition: the learner never waits for data iff R >= B / ((1 - d) T_train)."""
    _check_positive("step_time_s", step_time_s)
    return rollouts_generated_per_step(batch_rollouts, uninformative_share) / step_time_s


def required_throughput_rps(
    *,
    batch_rollouts: int,
    step_time_s: float,
    staleness: int,
    stall_s: float = 0.0,
    swap_interval_s: float | None = None,
    uninformative_share: float = 0.0,
) -> float:
    """R_required = (B / ((1 - d) T_train)) * I / (I - T_stall): a worker swaps in a version every I
    seconds and loses T_stall of each interval, so the fleet must be that much faster. Workers
    swap every version they receive (I = max(T_train, round period): `tail.swap_interval_s`);
    without I, once per window of S steps (I = S*T_train, a worker that refreshes only when
    refused). math.inf when I <= T_stall (no fleet size helps), and with S = 0."""
    _check_non_negative("staleness", staleness)
    _check_non_negative("stall_s", stall_s)
    window_s = staleness * step_time_s
    interval_s = window_s if swap_interval_s is None else swap_interval_s
    base = base_throughput_rps(batch_rollouts, step_time_s, uninformative_share=uninformative_share)
    if window_s == 0 or interval_s <= stall_s:
        return math.inf
    return base * interval_s / (interval_s - stall_s)


def _steps_at_least(ratio: float) -> int:
    """The smallest S >= ratio (float sums like 0.1 + 0.2 must not push an exact multiple up)."""
    return max(0, math.ceil(ratio * (1 - _REL_EPS)))


def _steps_above(ratio: float) -> int:
    """The smallest S > ratio (an exact multiple, or one float sums fall just short of, is not)."""
    return max(0, math.floor(ratio * (1 + _REL_EPS)) + 1)


def swapped_lateness_s(generation_s: float, *, segment_s: float, max_masked_fraction: float) -> float:
    """T_seg + (1 - f) T_gen: the part of a generation that counts against the window when the
    worker swaps newer versions in at segment boundaries (the rule `min_staleness` and
    `masked_token_share` apply).

    Derivation. Without swaps every token of a group carries the version it started with, which
    was T_dis old at the start: at training, T_gen later, it is (T_dis + T_gen) / T_train steps
    old. With swaps a token sampled tau seconds into the generation comes from a version at most
    T_dis + T_seg old at tau (the newest one held, swapped in at the next segment boundary; the
    swap's own stall is T_load, part of T_dis), so at training it is
    (T_gen - tau + T_dis + T_seg) / T_train steps old. With tokens spread evenly over T_gen the
    share older than S is (T_gen + T_dis + T_seg - S*T_train) / T_gen, and the group is trained
    iff that share is below f (policy.admission.admits_tokens): iff
    T_dis + T_seg + (1 - f) T_gen < S*T_train."""
    _check_non_negative("generation_s", generation_s)
    _check_non_negative("segment_s", segment_s)
    if not 0 < max_masked_fraction <= 1:
        raise ValueError(f"max_masked_fraction must be in (0, 1] (got {max_masked_fraction!r}): it bounds the "
                         "share of a group's tokens too stale to train (train.max_masked_fraction)")
    return segment_s + (1.0 - max_masked_fraction) * generation_s


def swap_ahead_steps(generation_s: float, step_time_s: float, *, segment_s: float | None,
                     max_masked_fraction: float) -> int:
    """Steps past S a worker may lease ahead when it swaps versions in mid-generation: the largest
    k with k*T_train + T_seg < f*T_gen. The lease rule (`admission.lease_capacity`) has a group
    leased under version v trained by step v + S; trained at v + S + k instead, its tokens older
    than S are those sampled before version v + k went in, at most k*T_train + T_seg of its
    T_gen seconds, a share below f. Without this the window of S steps caps the groups in
    flight at S*B, so by Little's law S*T_train must still cover T_gen, and a fleet whose
    generations outlast S steps leaves the learner waiting even though swaps keep its tokens
    fresh enough. 0 without swaps."""
    if segment_s is None or generation_s == 0:
        return 0
    _check_positive("step_time_s", step_time_s)
    fresh_s = generation_s - swapped_lateness_s(generation_s, segment_s=segment_s,
                                                max_masked_fraction=max_masked_fraction)  # f T_gen - T_seg
    return max(0, _steps_above(fresh_s / step_time_s) - 1) if fresh_s > 0 else 0


def min_staleness(dissemination_s: float, generation_s: float, step_time_s: float, *,
                  swapped_s: float | None = None) -> int:
    """S_min = ceil((T_dis + T_gen) / T_train): the overlap condition T_dis + T_gen <= S*T_train.
    Below S_min a worker's freshest rollouts are already too stale when they land.

    With segment swaps, `swapped_s` = `swapped_lateness_s` (T_seg + (1 - f) T_gen, or the
    planner's quantile of it): also the smallest S with T_dis + swapped_s < S*T_train (strictly:
    at equality a share f of the tokens is masked, and the rule wants less); the smaller of the
    two, since a swap only ever makes tokens fresher. Never below ceil(T_dis / T_train)."""
    _check_non_negative("dissemination_s", dissemination_s)
    _check_non_negative("generation_s", generation_s)
    _check_positive("step_time_s", step_time_s)
    unswapped = _steps_at_least((dissemination_s + generation_s) / step_time_s)
    if swapped_s is None or generation_s == 0:
        return unswapped
    _check_non_negative("swapped_s", swapped_s)
    return min(unswapped, _steps_above((dissemination_s + swapped_s) / step_time_s))


def overlap_holds(dissemination_s: float, generation_s: float, staleness: int, step_time_s: float, *,
                  swapped_s: float | None = None) -> bool:
    """True iff the window of S steps hides both latencies: T_dis + T_gen <= S*T_train, or, with
    segment swaps (`swapped_s`, see `min_staleness`), T_dis + swapped_s < S*T_train."""
    return staleness >= min_staleness(dissemination_s, generation_s, step_time_s, swapped_s=swapped_s)


def masked_token_share(staleness: int, step_time_s: float, *, dissemination_s: float, generation_s: float,
                       segment_s: float | None = None) -> float:
    """Expected share of a group's tokens older than S when it is trained: generated, masked out
    of the loss (`swapped_lateness_s` derives it). Without swaps (`segment_s` None) a group is one
    version, so 0 (the overlap holds) or 1; with them (T_gen + T_dis + T_seg - S*T_train) / T_gen
    clipped to [0, 1], and 0 whenever the group would be fresh enough unswapped."""
    _check_non_negative("staleness", staleness)
    _check_positive("step_time_s", step_time_s)
    window_s = staleness * step_time_s
    if dissemination_s + generation_s <= window_s * (1 + _REL_EPS):
        return 0.0
    if segment_s is None or generation_s == 0:
        return 1.0
    late_s = swapped_lateness_s(generation_s, segment_s=segment_s, max_masked_fraction=1.0) + dissemination_s
    return min(1.0, max(0.0, (late_s + generation_s - window_s) / generation_s))


def effective_throughput_rps(
    throughput_rps: float,
    staleness: int,
    step_time_s: float,
    *,
    dissemination_s: float = 0.0,
    generation_s: float = 0.0,
    stall_s: float = 0.0,
    swap_interval_s: float | None = None,
    swapped_s: float | None = None,
) -> float:
    """Admissible rollouts/s one worker delivers: r * (1 - T_stall / I), I the seconds between
    its swaps (default one per window, S*T_train; see `required_throughput_rps`), and 0 when
    the overlap condition fails for it (everything it produces arrives older than S; with
    segment swaps, `swapped_s` as in `min_staleness`). With one T_stall and I for all workers,
    sum of these >= B/T_train is exactly R >= R_required."""
    _check_non_negative("throughput_rps", throughput_rps)
    if not overlap_holds(dissemination_s, generation_s, staleness, step_time_s, swapped_s=swapped_s):
        return 0.0
    window_s = staleness * step_time_s
    interval_s = window_s if swap_interval_s is None else swap_interval_s
    if window_s == 0 or interval_s <= stall_s:
        return 0.0
    return throughput_rps * (1.0 - stall_s / interval_s)


def learner_utilization(admissible_rps: float, batch_rollouts: int, step_time_s: float, *,
                        uninformative_share: float = 0.0) -> float:
    """U = min(1, R * (1 - d) * T_train / B) with R the admissible throughput
    (effective_throughput_rps summed): a starved learner waits B / ((1 - d) R) per step instead
    of T_train."""
    _check_non_negative("admissible_rps", admissible_rps)
    needed_rps = base_throughput_rps(batch_rollouts, step_time_s, uninformative_share=uninformative_share)
    return min(1.0, admissible_rps / needed_rps)


def step_wall_s(admissible_rps: float, batch_rollouts: int, step_time_s: float, *,
                uninformative_share: float = 0.0) -> float:
    """Wall time of one learner step: max(T_train, B / ((1 - d) R)); math.inf with no admissible data."""
    utilization = learner_utilization(admissible_rps, batch_rollouts, step_time_s,
                                      uninformative_share=uninformative_share)
    return step_time_s / utilization if utilization > 0 else math.inf

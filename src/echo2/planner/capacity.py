"""Overlap-based capacity model (ECHO2.md section 4): how much rollout throughput keeps the
learner busy, the smallest staleness bound that hides dissemination and generation, and the
learner utilization a given worker set buys.

Symbols: B rollouts per learner step, T_train learner seconds per step, S staleness bound,
T_dis dissemination latency (publish -> worker holds and has loaded the version), T_gen time
for a worker to finish one rollout group, T_stall per-version time a worker cannot generate,
r_i a worker's throughput in rollouts/s, d the share of scored groups dropped as uninformative
(all rewards equal: `policy.rewards`), which the fleet must generate on top of B. Pure functions, no state, no I/O: the coordinator's
controller, the simulator and `echo2 plan` share them.
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


def min_staleness(dissemination_s: float, generation_s: float, step_time_s: float) -> int:
    """S_min = ceil((T_dis + T_gen) / T_train): the overlap condition T_dis + T_gen <= S*T_train.
    Below S_min a worker's freshest rollouts are already too stale when they land."""
    _check_non_negative("dissemination_s", dissemination_s)
    _check_non_negative("generation_s", generation_s)
    _check_positive("step_time_s", step_time_s)
    ratio = (dissemination_s + generation_s) / step_time_s
    return max(0, math.ceil(ratio * (1 - _REL_EPS)))


def overlap_holds(dissemination_s: float, generation_s: float, staleness: int, step_time_s: float) -> bool:
    """True iff T_dis + T_gen <= S*T_train (the pipeline hides both latencies)."""
    return staleness >= min_staleness(dissemination_s, generation_s, step_time_s)


def effective_throughput_rps(
    throughput_rps: float,
    staleness: int,
    step_time_s: float,
    *,
    dissemination_s: float = 0.0,
    generation_s: float = 0.0,
    stall_s: float = 0.0,
    swap_interval_s: float | None = None,
) -> float:
    """Admissible rollouts/s one worker delivers: r * (1 - T_stall / I), I the seconds between
    its swaps (default one per window, S*T_train; see `required_throughput_rps`), and 0 when
    the overlap condition fails for it (everything it produces arrives older than S). With one
    T_stall and I for all workers, sum of these >= B/T_train is exactly R >= R_required."""
    _check_non_negative("throughput_rps", throughput_rps)
    if not overlap_holds(dissemination_s, generation_s, staleness, step_time_s):
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

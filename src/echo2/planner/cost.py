"""Cost per learner step and per accepted rollout, for an echo2 fleet and for the centralized
baseline that generates rollouts on the learner's own GPUs (co-located, synchronous: verl-style
generate-then-train). Cost is price x wall time for every rented machine, learner included.
"""

from __future__ import annotations

import math

SECONDS_PER_HOUR = 3600.0


def cost_per_step(price_per_hour: float, step_wall_s: float) -> float:
    """$ per learner step: everything rented ($/h) times the step's wall time."""
    if price_per_hour < 0 or step_wall_s < 0:
        raise ValueError("price_per_hour and step_wall_s must be >= 0")
    return price_per_hour * step_wall_s / SECONDS_PER_HOUR


def cost_per_rollout(step_cost: float, batch_rollouts: int) -> float:
    """$ per accepted rollout: each step trains on exactly B admitted rollouts."""
    if batch_rollouts <= 0:
        raise ValueError(f"batch_rollouts must be > 0 (got {batch_rollouts!r})")
    return step_cost / batch_rollouts


def centralized_step_s(
    step_time_s: float, batch_rollouts: float, learner_rollouts_per_s: float, generation_s: float
) -> float:
    """Synchronous baseline step: generate the whole batch, then train. Generation lasts at
    least B / r_L (throughput) and at least T_gen (the slowest group must finish):
    T_central = T_train + max(B / r_L, T_gen); with uninformative groups dropped and refilled,
    `batch_rollouts` is what it generates, B / (1 - d)."""
    if not learner_rollouts_per_s > 0:
        raise ValueError(f"learner rollouts_per_s must be > 0 (got {learner_rollouts_per_s!r})")
    return step_time_s + max(batch_rollouts / learner_rollouts_per_s, generation_s)


def saving_fraction(cost: float, baseline_cost: float) -> float:
    """1 - cost / baseline: 0.35 means 35% cheaper than the baseline (negative: dearer)."""
    if not baseline_cost > 0 or math.isinf(baseline_cost):
        raise ValueError(f"baseline_cost must be finite and > 0 (got {baseline_cost!r})")
    return 1.0 - cost / baseline_cost

"""Calibration terms of the capacity model: what the overlap condition and the stall fraction
look like once the fleet's latencies are distributions rather than means, once workers swap
in every version they receive, and once spot workers are preempted.

- Round period P: a shared broadcast (chain, tree, one-to-many) carries one version at a time,
  so a new version waits while the last one is still streaming. When P exceeds the learner
  step, versions are skipped and the version a worker needs lands up to P after it was
  published (uniformly: rounds run back to back, publishes come every step).
- Swap interval: a worker swaps in every version it receives, one per max(T_train, P); each
  swap stalls its generations for T_load.
- Tail: the overlap condition asks that the p-quantile of (wait + generation) plus the
  transfer to the slowest chain position fit the window S * T_train. The wait is the round's
  plus the spread of a step's leases (a fleet sized at the learner's rate hands a step's
  groups out over a whole step); generation times are gamma-distributed with the workload's
  spread, as the simulator draws them. Groups later than the window are dropped as stale: a
  class delivers only the on-time fraction of what it generates.
- Preemption: a preempted worker is replaced, and the replacement delivers nothing until it
  has the weights; a class keeps uptime / (uptime + rejoin) of its throughput.

Pure functions, no state, no I/O; units in the names (bytes, bits/s, seconds).
"""

from __future__ import annotations

import math
from functools import lru_cache

import numpy as np
from scipy.special import gammainc, gammaincinv

from echo2.planner.dissemination import BITS_PER_BYTE

_WAIT_GRID = 48
"""Points of the uniform wait averaged over in the (wait + generation) distribution."""


def round_period_s(
    topology: str,
    *,
    snapshot_bytes: float,
    n_workers: int,
    learner_bps: float,
    slowest_bps: float,
    fanout: int = 2,
) -> float:
    """Seconds a shared network is busy with one version, with `slowest_bps` the slowest link
    in the round: a pipelined chain or tree streams at its slowest link (a relay's upload is
    split over its f = min(d, N) children), the learner's uplink carries all N copies in
    one-to-many. In the ideal network every worker has its own downlink: P is its own transfer."""
    bits = snapshot_bytes * BITS_PER_BYTE
    if topology == "one_to_many":
        return max(n_workers * bits / learner_bps, bits / slowest_bps)
    if topology == "ideal":
        return bits / slowest_bps
    share = 1 if topology == "chain" else min(fanout, max(1, n_workers))
    return share * bits / min(learner_bps, slowest_bps)


def swap_interval_s(step_time_s: float, period_s: float) -> float:
    """Seconds between two versions reaching a worker: every step, or every round when the
    network cannot carry one version per step (the newest is sent, the rest skipped)."""
    return max(step_time_s, period_s)


def max_wait_s(step_time_s: float, period_s: float) -> float:
    """Upper end of the uniform wait between a version's publish and the round that carries it
    (or a newer one): 0 when the network is free at every publish."""
    return period_s if period_s > step_time_s else 0.0


def gamma_quantile(mean_s: float, cv: float, percentile: float) -> float:
    """p-quantile of a gamma time with this mean and coefficient of variation (cv 0: the mean)."""
    if cv == 0 or mean_s == 0:
        return mean_s
    shape = 1.0 / cv**2
    return float(gammaincinv(shape, percentile)) * mean_s / shape


def _waits(round_wait_s: float, lease_spread_s: float) -> np.ndarray:
    """Grid over W = Uniform(0, round_wait_s) + Uniform(0, lease_spread_s) (midpoints)."""
    def grid(width_s: float) -> np.ndarray:
        n = _WAIT_GRID if width_s > 0 else 1
        return (np.arange(n) + 0.5) * width_s / n

    return (grid(round_wait_s)[:, None] + grid(lease_spread_s)[None, :]).ravel()


@lru_cache(maxsize=65536)
def wait_plus_generation_cdf(
    x_s: float, *, round_wait_s: float, lease_spread_s: float, generation_s: float, cv: float
) -> float:
    """P(W + G <= x): W the wait for the round that carries a new enough version (uniform up to
    round_wait_s) plus when in the step's leasing the group is handed out (uniform up to
    lease_spread_s: a fleet sized at the learner's rate leases a step's groups over a whole
    step), G one group's gamma-distributed generation time (mean generation_s, cv)."""
    waits = _waits(round_wait_s, lease_spread_s)
    if cv == 0 or generation_s == 0:
        return float(np.mean(waits + generation_s <= x_s))
    shape = 1.0 / cv**2
    return float(np.mean(gammainc(shape, np.maximum(x_s - waits, 0.0) * shape / generation_s)))


@lru_cache(maxsize=4096)
def wait_plus_generation_s(
    *, round_wait_s: float, lease_spread_s: float, generation_s: float, cv: float, percentile: float
) -> float:
    """The p-quantile of W + G (see `wait_plus_generation_cdf`): the sum's quantile, not the sum
    of quantiles, since the tails rarely meet."""
    low, high = 0.0, gamma_quantile(generation_s, cv, percentile) + round_wait_s + lease_spread_s
    for _ in range(50):  # bisection to well under a millisecond
        mid = (low + high) / 2
        if wait_plus_generation_cdf(mid, round_wait_s=round_wait_s, lease_spread_s=lease_spread_s,
                                    generation_s=generation_s, cv=cv) < percentile:
            low = mid
        else:
            high = mid
    return high


def availability(mean_uptime_s: float | None, rejoin_s: float) -> float:
    """Fraction of its throughput a preempted-and-replaced class keeps: uptime over uptime plus
    the time a replacement needs before it delivers again (1 when never preempted)."""
    if mean_uptime_s is None or math.isinf(mean_uptime_s):
        return 1.0
    return mean_uptime_s / (mean_uptime_s + rejoin_s)

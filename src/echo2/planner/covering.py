"""The covering problem behind cost-aware activation, shared by the exact solver
(activation.py) and the greedy (greedy.py): offers, the chosen activation, the problem in array
form, the covering tolerance, the LP bound and the solver call. scipy is imported lazily so that
importing this module stays cheap for the simulator.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

# Throughputs are measured floats and HiGHS works to ~1e-7: a cover short by less than this
# (relative, or 1e-6 rollouts/s absolute) counts as meeting the requirement.
_COVER_RTOL = 1e-7
_COVER_ATOL_RPS = 1e-6
MILP_TIME_LIMIT_S = 5.0
"""Safety net for pathological instances; the best solution found so far is used with its gap."""


@dataclass(frozen=True)
class Offer:
    """One activation candidate: a worker (count 1) or a class of identical workers."""

    id: str
    price_per_hour: float
    rollouts_per_s: float
    count: int = 1
    available: bool = True
    relay: bool = True
    """Reachable: accepts incoming connections, so it can forward weights to peers."""


@dataclass(frozen=True)
class Activation:
    """The chosen units per offer id, what they cost and deliver, and how far from optimal."""

    counts: dict[str, int]
    price_per_hour: float
    rollouts_per_s: float
    required_rps: float
    feasible: bool
    method: str
    """"milp" (exact), "greedy" or "none" (nothing needed)."""
    lower_bound_per_hour: float
    """LP-relaxation (or MILP dual) bound: no feasible set is cheaper."""
    reason: str = ""
    """Why no set was found (empty when feasible)."""

    @property
    def gap(self) -> float:
        """(price - bound) / bound: an upper bound on the relative distance to the optimum."""
        if not self.feasible:
            return math.inf
        if self.price_per_hour <= self.lower_bound_per_hour * (1 + 1e-9):
            return 0.0  # equal up to float rounding of the solver's objective
        return (self.price_per_hour - self.lower_bound_per_hour) / max(self.lower_bound_per_hour, 1e-12)

    @property
    def n_workers(self) -> int:
        return sum(self.counts.values())


@dataclass(frozen=True)
class CoverProblem:
    ids: list[str]
    price: np.ndarray
    rate: np.ndarray
    upper: np.ndarray
    relay: np.ndarray
    required_rps: float
    max_workers: int | None
    leaf_fanout: int | None


def cover_problem(
    offers: Sequence[Offer], required_rps: float, max_workers: int | None, leaf_fanout: int | None
) -> CoverProblem:
    ids = [o.id for o in offers]
    if len(set(ids)) != len(ids):
        raise ValueError("offer ids must be unique")
    for o in offers:
        if o.price_per_hour < 0 or o.rollouts_per_s < 0 or o.count < 0:
            raise ValueError(f"offer {o.id!r}: price_per_hour, rollouts_per_s and count must be >= 0")
    if leaf_fanout is not None and leaf_fanout < 1:
        raise ValueError(f"leaf_fanout must be >= 1 or None (got {leaf_fanout!r})")
    upper = np.array([o.count if o.available else 0 for o in offers], dtype=float)
    return CoverProblem(
        ids=ids,
        price=np.array([o.price_per_hour for o in offers], dtype=float),
        rate=np.array([o.rollouts_per_s for o in offers], dtype=float),
        upper=upper,
        relay=np.array([o.relay for o in offers], dtype=bool),
        required_rps=float(required_rps),
        max_workers=max_workers,
        leaf_fanout=leaf_fanout,
    )


def cover_floor_rps(required_rps: float) -> float:
    """The least throughput accepted as meeting `required_rps` (float noise removed)."""
    return required_rps - max(_COVER_RTOL * abs(required_rps), _COVER_ATOL_RPS)


def covers(rollouts_per_s: float, required_rps: float) -> bool:
    """Throughput meets the requirement, up to float noise."""
    return rollouts_per_s >= cover_floor_rps(required_rps)


def _constraint_rows(prob: CoverProblem) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rows, lower, upper = [prob.rate], [cover_floor_rps(prob.required_rps)], [np.inf]
    if prob.max_workers is not None:
        rows.append(np.ones_like(prob.rate))
        lower.append(-np.inf)
        upper.append(float(prob.max_workers))
    if prob.leaf_fanout is not None:
        d = prob.leaf_fanout
        rows.append(np.where(prob.relay, -(d - 1.0), 1.0))
        lower.append(-np.inf)
        upper.append(float(d))
    return np.vstack(rows), np.array(lower), np.array(upper)


def solve(prob: CoverProblem, integral: bool):
    from scipy.optimize import Bounds, LinearConstraint, milp

    matrix, lower, upper = _constraint_rows(prob)
    return milp(
        c=prob.price,
        constraints=LinearConstraint(matrix, lower, upper),
        bounds=Bounds(np.zeros_like(prob.upper), prob.upper),
        integrality=np.full(len(prob.ids), 1 if integral else 0),
        options={"time_limit": MILP_TIME_LIMIT_S, "mip_rel_gap": 0.0},
    )


def lp_lower_bound(prob: CoverProblem) -> float:
    """Cost of the LP relaxation (fractional workers): a lower bound on every integer set."""
    if prob.required_rps <= 0:
        return 0.0
    if prob.max_workers is None and prob.leaf_fanout is None:
        return _fractional_cover_cost(prob)
    result = solve(prob, integral=False)
    return float(result.fun) if result.status == 0 else math.inf


def _fractional_cover_cost(prob: CoverProblem) -> float:
    """The LP of a single covering constraint with bounds, solved exactly by filling in order
    of price per throughput (O(n log n); HiGHS needs ~1 s at 10,000 entries)."""
    useful = np.flatnonzero((prob.rate > 0) & (prob.upper > 0))
    order = useful[np.argsort(prob.price[useful] / prob.rate[useful], kind="stable")]
    supplied = np.cumsum(prob.rate[order] * prob.upper[order])
    need = cover_floor_rps(prob.required_rps)
    if need <= 0:
        return 0.0
    last = int(np.searchsorted(supplied, need))
    if last >= len(order):
        return math.inf
    full = order[:last]
    before = supplied[last - 1] if last else 0.0
    j = order[last]
    return float(prob.price[full] @ prob.upper[full] + prob.price[j] * (need - before) / prob.rate[j])


def activation_of(prob: CoverProblem, x: np.ndarray, method: str, bound: float) -> Activation:
    units = np.rint(x).astype(int)
    counts = {i: int(n) for i, n in zip(prob.ids, units, strict=True) if n > 0}
    rate = float(prob.rate @ units)
    return Activation(
        counts=counts,
        price_per_hour=float(prob.price @ units),
        rollouts_per_s=rate,
        required_rps=prob.required_rps,
        feasible=covers(rate, prob.required_rps),
        method=method,
        lower_bound_per_hour=bound,
    )


def infeasible(prob: CoverProblem, method: str, reason: str) -> Activation:
    return Activation({}, 0.0, 0.0, prob.required_rps, False, method, math.inf, reason)


def why_infeasible(prob: CoverProblem) -> str:
    total = float(prob.rate @ prob.upper)
    if not covers(total, prob.required_rps):
        return f"all available offers together give {total:.4g} rollouts/s, {prob.required_rps:.4g} needed"
    if prob.max_workers is not None:
        return f"no set of at most {prob.max_workers} workers gives {prob.required_rps:.4g} rollouts/s"
    return "too few reachable relays to place the workers behind NAT as leaves"

"""Cost-aware activation (ECHO2.md section 6): the cheapest set of rollout workers whose
throughput meets a requirement, as a covering knapsack.

    minimize  sum p_i x_i   subject to  sum r_i x_i >= R,  0 <= x_i <= count_i (integer)
    optional: sum x_i <= max_workers
              leaves - (d-1) * relays <= d   (NAT'd workers need reachable parents)

One entry is a catalog class (count > 1, used by `echo2 plan`) or one live worker (count 1,
used every control period by the coordinator with measured throughputs). Exact with
scipy.optimize.milp up to `exact_max_entries`; beyond that a price-per-throughput greedy
with a reported optimality gap against the LP relaxation (greedy.py). The problem both solve
is covering.py's.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from echo2.planner.covering import (
    Activation,
    Offer,
    activation_of,
    cover_problem,
    infeasible,
    solve,
    why_infeasible,
)
from echo2.planner.greedy import activate_greedy

EXACT_MAX_ENTRIES = 400
"""Above this many entries `activate` switches to the greedy (HiGHS stays well under a second
up to here on one core; benchmarks/planner.py times both)."""


def activate_exact(
    offers: Sequence[Offer],
    required_rps: float,
    *,
    max_workers: int | None = None,
    leaf_fanout: int | None = None,
) -> Activation:
    """Optimal set by integer programming (HiGHS branch and bound via scipy.optimize.milp)."""
    prob = cover_problem(offers, required_rps, max_workers, leaf_fanout)
    if prob.required_rps <= 0:
        return activation_of(prob, np.zeros(len(offers)), "none", 0.0)
    result = solve(prob, integral=True)
    if result.x is None:
        return infeasible(prob, "milp", why_infeasible(prob))
    bound = float(result.fun)
    dual_bound = getattr(result, "mip_dual_bound", None)
    if result.status != 0 and dual_bound is not None:
        bound = min(bound, float(dual_bound))  # time limit hit: keep the incumbent, report its gap
    return activation_of(prob, result.x, "milp", bound)


def activate(
    offers: Sequence[Offer],
    required_rps: float,
    *,
    max_workers: int | None = None,
    leaf_fanout: int | None = None,
    exact_max_entries: int = EXACT_MAX_ENTRIES,
) -> Activation:
    """The activation rule: exact up to `exact_max_entries` offers, greedy beyond (with gap).
    Called by `echo2 plan` with classes and by the coordinator with live workers."""
    if len(offers) <= exact_max_entries:
        return activate_exact(offers, required_rps, max_workers=max_workers, leaf_fanout=leaf_fanout)
    return activate_greedy(offers, required_rps, max_workers=max_workers, leaf_fanout=leaf_fanout)

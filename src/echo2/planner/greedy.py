"""Greedy activation for catalogs too large for the integer program: take workers in order of
price per throughput (p_i / r_i) without overshooting, and at every step also consider
finishing with the single cheapest worker that covers what is left (the classic 2-approximation
for covering knapsack); then drop units that are not needed. The optimality gap is reported
against the LP relaxation, so callers see how much a better solver could save at most.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from echo2.planner.covering import (
    Activation,
    CoverProblem,
    Offer,
    activation_of,
    cover_floor_rps,
    cover_problem,
    covers,
    infeasible,
    lp_lower_bound,
    why_infeasible,
)


class _State:
    """Units taken so far, their throughput, and the NAT leaf slots they open (d - 1 per relay)."""

    def __init__(self, prob: CoverProblem):
        self.prob = prob
        self.taken = np.zeros(len(prob.ids))
        self.remaining = prob.upper.copy()
        self.covered_rps = 0.0
        self.relays = 0.0
        self.leaves = 0.0

    def leaf_slots(self) -> float:
        d = self.prob.leaf_fanout
        return math.inf if d is None else d * (self.relays + 1) - self.relays - self.leaves

    def take(self, j: int, units: float) -> None:
        if units <= 0:
            return
        self.taken[j] += units
        self.remaining[j] -= units
        self.covered_rps += units * self.prob.rate[j]
        if self.prob.relay[j]:
            self.relays += units
        else:
            self.leaves += units

    def units_without_overshoot(self, j: int) -> float:
        residual = cover_floor_rps(self.prob.required_rps) - self.covered_rps
        return min(self.remaining[j], max(0.0, math.floor(residual / self.prob.rate[j])))


def _ratio_order(prob: CoverProblem) -> list[int]:
    useful = [j for j in range(len(prob.ids)) if prob.rate[j] > 0 and prob.upper[j] > 0]
    return sorted(useful, key=lambda j: (prob.price[j] / prob.rate[j], -prob.rate[j]))


class _Best:
    def __init__(self, max_workers: int | None):
        self.x: np.ndarray | None = None
        self.cost = math.inf
        self.max_workers = max_workers

    def offer(self, prob: CoverProblem, x: np.ndarray) -> None:
        cost = float(prob.price @ x)
        fits = self.max_workers is None or x.sum() <= self.max_workers
        if fits and cost < self.cost and covers(float(prob.rate @ x), prob.required_rps):
            self.x, self.cost = x.copy(), cost


def _offer_completion(state: _State, best: _Best) -> None:
    """Candidate: what is taken plus the cheapest single unit covering the remainder."""
    prob = state.prob
    residual = cover_floor_rps(prob.required_rps) - state.covered_rps
    ok = (state.remaining > 0) & (prob.rate >= residual)
    if state.leaf_slots() < 1:
        ok &= prob.relay
    if ok.any():
        j = int(np.argmin(np.where(ok, prob.price, np.inf)))
        x = state.taken.copy()
        x[j] += 1
        best.offer(prob, x)


def _sweep(state: _State, best: _Best, order: list[int]) -> None:
    prob = state.prob
    deferred: list[int] = []  # NAT entries held back for lack of leaf slots
    changed = True
    for j in order:
        if changed:  # the completion candidate only moves when the cover does
            _offer_completion(state, best)
        wanted = state.units_without_overshoot(j)
        units = wanted if prob.relay[j] else min(wanted, max(0.0, state.leaf_slots()))
        state.take(j, units)
        changed = units > 0
        if units < wanted:
            deferred.append(j)
        if prob.relay[j] and units > 0 and deferred:
            deferred = _retry(state, deferred)
        if covers(state.covered_rps, prob.required_rps):
            best.offer(prob, state.taken)
            return
    _offer_completion(state, best)


def _retry(state: _State, deferred: list[int]) -> list[int]:
    """New relays opened leaf slots: give them to held-back NAT entries (better ratios first)."""
    still = []
    for i in deferred:
        wanted = state.units_without_overshoot(i)
        units = min(wanted, max(0.0, state.leaf_slots()))
        state.take(i, units)
        if units < wanted:
            still.append(i)
    return still


def _fill(prob: CoverProblem, best: _Best, order: list[int]) -> None:
    """Fallback when leaf slots blocked the sweep: the most throughput the NAT rule allows,
    every relay (each opens d - 1 slots) then NAT workers fastest first; pruning trims it.
    Finds a cover whenever one exists (max_workers aside)."""
    state = _State(prob)
    for j in sorted(order, key=lambda j: (not prob.relay[j], -prob.rate[j])):
        units = state.remaining[j] if prob.relay[j] else min(state.remaining[j], max(0.0, state.leaf_slots()))
        state.take(j, units)
    best.offer(prob, state.taken)


def _valid(prob: CoverProblem, x: np.ndarray) -> bool:
    if not covers(float(prob.rate @ x), prob.required_rps):
        return False
    if prob.leaf_fanout is None:
        return True
    d = prob.leaf_fanout
    return x[~prob.relay].sum() - (d - 1) * x[prob.relay].sum() <= d


def _prune(prob: CoverProblem, x: np.ndarray) -> np.ndarray:
    """Drop units, most expensive first, while the set stays valid."""
    x = x.copy()
    for j in sorted(range(len(x)), key=lambda j: -prob.price[j]):
        while x[j] > 0:
            x[j] -= 1
            if not _valid(prob, x):
                x[j] += 1
                break
    return x


def activate_greedy(
    offers: Sequence[Offer],
    required_rps: float,
    *,
    max_workers: int | None = None,
    leaf_fanout: int | None = None,
) -> Activation:
    """Heuristic activation, O(n^2) vectorized; `lower_bound_per_hour` is the LP bound."""
    prob = cover_problem(offers, required_rps, max_workers, leaf_fanout)
    if prob.required_rps <= 0:
        return activation_of(prob, np.zeros(len(offers)), "none", 0.0)
    order = _ratio_order(prob)
    best = _Best(max_workers)
    _sweep(_State(prob), best, order)
    if best.x is None:
        _fill(prob, best, order)
    if best.x is None:
        return infeasible(prob, "greedy", why_infeasible(prob))
    return activation_of(prob, _prune(prob, best.x), "greedy", lp_lower_bound(prob))

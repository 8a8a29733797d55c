"""Hysteresis for the online activation controller: re-running the activation rule every
control period would churn workers on every small throughput wobble, and each switch costs a
cold start (weights download, engine warm-up). Keep the current set unless it no longer meets
the requirement or the new proposal is cheaper by more than a margin. Pure function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from echo2.planner.covering import Activation, Offer, covers


@dataclass(frozen=True)
class Decision:
    counts: dict[str, int]
    """The set to run: the kept current set (minus workers gone unavailable) or the proposal."""
    switched: bool
    reason: str


def fleet_totals(counts: Mapping[str, int], offers: Sequence[Offer]) -> tuple[dict[str, int], float, float]:
    """The part of `counts` still backed by available offers, its $/h and its rollouts/s."""
    by_id = {o.id: o for o in offers}
    live: dict[str, int] = {}
    for worker_id, units in counts.items():
        offer = by_id.get(worker_id)
        if offer is not None and offer.available and units > 0:
            live[worker_id] = min(units, offer.count)
    price = sum(by_id[i].price_per_hour * n for i, n in live.items())
    rate = sum(by_id[i].rollouts_per_s * n for i, n in live.items())
    return live, price, rate


def keep_or_switch(
    current: Mapping[str, int],
    proposal: Activation,
    offers: Sequence[Offer],
    *,
    required_rps: float,
    margin: float = 0.1,
) -> Decision:
    """Switch to `proposal` iff the current set (re-measured with `offers`) misses
    `required_rps` and the proposal meets it, or the proposal costs less than
    (1 - margin) x the current price. Otherwise keep the current set."""
    if not 0 <= margin < 1:
        raise ValueError(f"margin must be in [0, 1) (got {margin!r}); 0.1 keeps sets within 10% of optimal")
    live, price, rate = fleet_totals(current, offers)
    if not covers(rate, required_rps):
        if proposal.feasible:
            return Decision(
                dict(proposal.counts), True, f"current set gives {rate:.4g} of {required_rps:.4g} rollouts/s"
            )
        return Decision(live, False, "current set falls short but no feasible proposal exists")
    if proposal.feasible and proposal.price_per_hour < (1 - margin) * price:
        saving = 1 - proposal.price_per_hour / price
        return Decision(
            dict(proposal.counts), True, f"proposal is {saving:.0%} cheaper (margin {margin:.0%})"
        )
    return Decision(live, False, "current set meets the requirement within the price margin")

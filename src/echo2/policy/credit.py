"""What the activation controller credits a worker with: only checked work, and never all of the
demand while others could share it. The controller (`policy.controller`) prices each worker at
its measured admissible rate; these rules discount and bound that rate before the planner's
covering rule sees it.

A worker that returns groups without generating them is measured at whatever rate it likes:
credited with that rate, it alone covers the demand, and every honest worker is told
"inactive" at the next decision. Two rules answer it:

- audit credit: the rollout audit (the learner recomputes log-probs and reports verdicts to
  `record_audit`) scales a worker's rate by passed / (passed + `FAILED_AUDIT_WEIGHT` x failed):
  groups not yet audited count as admitted and not failed, one failure in a hundred costs 9%,
  a worker whose audited groups all failed is credited nothing. The record stays with the id
  across registrations.
- share cap: while two or more measured workers are live, no offer is credited with more than
  activation.max_worker_share of the throughput the controller sizes for, so no single worker
  covers the demand and at least two stay active (the batch share cap of `policy.trust` says
  the same from the data side: one worker cannot fill more of a batch either).
"""

from __future__ import annotations

from dataclasses import replace

from echo2.planner import Offer

FAILED_AUDIT_WEIGHT = 10.0


def audit_credit(audited: int, failed: int) -> float:
    """Share of a worker's measured rate that counts, from its audit record."""
    if failed <= 0:
        return 1.0
    passed = max(0, audited - failed)
    return passed / (passed + FAILED_AUDIT_WEIGHT * failed)


def capped_offers(offers: list[Offer], *, max_share: float, target_rps: float, live_measured: int) -> list[Offer]:
    """`offers` with no rate above `max_share` x `target_rps` while `live_measured` >= 2 (one
    live measured worker alone, or a cap of 1, bounds nothing)."""
    if live_measured < 2 or max_share >= 1.0:
        return offers
    bound = max_share * target_rps
    return [replace(o, rollouts_per_s=min(o.rollouts_per_s, bound)) for o in offers]

"""What the activation controller credits a worker with: only checked work, and never all of the
demand while others could share it. The controller (`policy.controller`) prices each worker at
its measured admissible rate; these rules discount and bound that rate before the planner's
covering rule sees it.

A worker that returns groups without generating them is measured at whatever rate it likes:
credited with that rate, it alone covers the demand, and every honest worker is told
"inactive" at the next decision. Two rules answer it:

- checked first: while the run audits, a worker's rate counts only once `MIN_PASSED_AUDITS` of
  its groups have passed the audit (`checked`). Until then it is on probation like a worker not
  yet measured: it may run in a probation slot, and it covers no demand, so a rate it reached
  by returning groups it never generated releases no honest machine. (Measured at 794
  rollouts/s before any of its groups was audited, such a worker once switched off 2 of 4
  honest ones.) The simulator models no audit, and a run with the audit off trusts rates as
  measured: both pass 0.
- audit credit: the rollout audit (the learner recomputes log-probs and reports verdicts to
  `record_audit`) scales a worker's rate by passed / (passed + `FAILED_AUDIT_WEIGHT` x failed):
  one failure in a hundred costs 9%, a worker whose audited groups all failed is credited
  nothing. The record stays with the id across registrations.
- share cap: while two or more measured workers are live, no offer is credited with more than
  activation.max_worker_share of the throughput the controller sizes for, so no single worker
  covers the demand and at least two stay active (the batch share cap of `policy.trust` says
  the same from the data side: one worker cannot fill more of a batch either).
"""

from __future__ import annotations

from dataclasses import replace

from echo2.planner import Offer
from echo2.policy.worker_view import WorkerView

FAILED_AUDIT_WEIGHT = 10.0
MIN_PASSED_AUDITS = 2
"""Passed audits before a worker's measured rate counts (the audit checks a keyed share of the
groups, so an honest worker reaches it within its first few trained groups)."""


def checked(view: WorkerView, min_samples: int, min_passed_audits: int) -> bool:
    """Measured: `min_samples` rate samples, and `min_passed_audits` groups passed by the audit."""
    return (view.rollouts_per_s.samples >= min_samples
            and view.audited - view.audit_failed >= min_passed_audits)


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

"""What the activation controller credits a worker with: only checked work, and never all of the
demand while others could share it. The controller (`policy.controller`) prices each worker at
its measured admissible rate; these rules discount and bound that rate before the planner's
covering rule sees it.

A worker that returns groups without generating them is measured at whatever rate it likes:
credited with that rate, it alone covers the demand, and every honest worker is told
"inactive" at the next decision (under the ssh or skypilot provider: its machine released).
The rate is measured on every group the coordinator accepts, while the audit checks a sample of
the groups the learner trains, some steps later. So the rate is credited only as far as the
audit has caught up with it:

- checked first: while the run audits, a worker's rate counts only once `MIN_PASSED_AUDITS` of
  its groups have passed the audit (`checked`). Until then it is on probation like a worker not
  yet measured: it may run in a probation slot, and it covers no demand, so a rate it reached
  by returning groups it never generated releases no honest machine. (Measured at 794
  rollouts/s before any of its groups was audited, such a worker once switched off 2 of 4
  honest ones.)
- checked rate: after that, its credited rate is at most the rate it was measured at when it
  delivered the newest of its groups the audit has passed (`note_rate` at each of its buffered
  groups, `note_checked` at each report, groups matched by their place in the run's buffer,
  the store's sequence number; `checked_rps`): what it did since, which the audit has not yet
  sampled, adds nothing until groups of it pass. A worker that passes its first audits and then
  floods the run with groups it never generated keeps the rate it had when it was checked; an
  honest one is credited its measured rate as of a group trained and audited a step or two ago
  (each step the audit checks the groups it trains: all of the newest version where the wire
  is the learner's own dtype, `audit.recompute_fraction` of the rest). A worker mixing
  generated and fabricated groups is credited what it was measured at when a generated one
  passed, until its fabricated ones are audited: that is left to the next rule.
- audit credit: the rollout audit (the learner recomputes log-probs and reports verdicts to
  `record_audit`) scales a worker's rate by passed / (passed + `FAILED_AUDIT_WEIGHT` x failed):
  one failure in a hundred costs 9%, a worker whose audited groups all failed is credited
  nothing. The record stays with the id across registrations.
- share cap: while two or more measured workers are live, no offer is credited with more than
  activation.max_worker_share of the throughput the controller sizes for, so no single worker
  covers the demand and at least two stay active (the batch share cap of `policy.trust` says
  the same from the data side: one worker cannot fill more of a batch either).

The simulator models no audit, and a run with the audit off trusts rates as measured: both pass
`min_passed_audits` 0, and then no rate is noted.
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
    """Measured: `min_samples` rate samples and, while the run audits, `min_passed_audits` groups
    passed by the audit and the rate it had when they were generated (`note_checked`)."""
    return (view.rollouts_per_s.samples >= min_samples
            and view.audited - view.audit_failed >= min_passed_audits
            and (min_passed_audits == 0 or view.checked_rps is not None))


def note_rate(view: WorkerView, group_seq: int) -> None:
    """One of its groups was buffered as the run's `group_seq`-th: its measured rate now is what
    the audit vouches for if that group passes (none yet measured: nothing to vouch for). The
    oldest notes go first beyond the deque's bound (`worker_view.MAX_RATE_NOTES`)."""
    if view.rollouts_per_s.samples:
        view.rate_notes.append((group_seq, view.rollouts_per_s.value))


def note_checked(view: WorkerView, newest_passed_seq: int) -> None:
    """The audit has passed its group buffered as the run's `newest_passed_seq`-th: from now on
    its rate is credited up to what it was when it delivered that group. Notes older than that
    one are dropped (no later verdict needs them); none left at or before it (a group buffered
    before its first rate sample, or a note dropped past the bound): its checked rate stays."""
    if view.checked_seq is not None and newest_passed_seq <= view.checked_seq:
        return
    view.checked_seq = newest_passed_seq
    notes = view.rate_notes
    while len(notes) > 1 and notes[1][0] <= newest_passed_seq:
        notes.popleft()
    if notes and notes[0][0] <= newest_passed_seq:
        view.checked_rps = notes[0][1]


def checked_rps(view: WorkerView) -> float:
    """Its measured rate, bounded by its checked rate where the run audits (`note_checked`)."""
    measured = view.rollouts_per_s.value
    return measured if view.checked_rps is None else min(measured, view.checked_rps)


def credited_rps(view: WorkerView) -> float:
    """What a measured worker's rate counts for: its checked rate, times the share of its groups
    admitted rather than dropped as stale, times its audit credit."""
    admitted = (view.admitted.value if view.admitted.samples else 1.0) * audit_credit(view.audited, view.audit_failed)
    return checked_rps(view) * admitted


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

"""What an activation decision needs of the worker views, in one pass over them: the measured
candidates (the offers), the live workers still on probation and the measured set running now;
and which of those on probation get its slots.

The activation controller (`policy.controller`) decides every control period (2 s) and at once
when a worker is lost, over every worker it knows: 10,000 of them at scale, a handful measured.
So it makes one pass in registration order, and keeps a bounded heap for the few probation
slots, rather than a pass per question and a sort of every unmeasured worker
(benchmarks/policy_scale.py times decisions at that scale).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass, field
from operator import itemgetter

from echo2.config.activation import ActivationConfig
from echo2.planner import Offer
from echo2.policy.credit import checked
from echo2.policy.worker_view import ControlDecision, WorkerView


@dataclass
class Census:
    measured: list[tuple[str, WorkerView]] = field(default_factory=list)
    """Candidates (live or released) with enough rate samples, by id: one offer each."""
    probation: list[str] = field(default_factory=list)
    """Candidates (live, or released: offered by a provider before any ran) not yet measured, in
    registration order (the tie-break among them)."""
    current: dict[str, int] = field(default_factory=dict)
    """Measured candidates active now, in registration order (the set hysteresis keeps)."""


def take_census(workers: dict[str, WorkerView], min_samples: int, min_passed_audits: int = 0) -> Census:
    """`workers` sorted into a decision's parts; measured means `min_samples` rate samples and
    `min_passed_audits` of its groups passed by the audit (policy.credit.checked)."""
    census = Census()
    for worker_id, view in workers.items():
        measured = checked(view, min_samples, min_passed_audits)
        if measured and (view.alive or view.released):
            census.measured.append((worker_id, view))
            if view.active:
                census.current[worker_id] = 1
        elif view.alive or view.released:  # released: its provider starts it when given a slot
            census.probation.append(worker_id)
    census.measured.sort(key=itemgetter(0))
    return census


def probation_trial(workers: dict[str, WorkerView], probation: list[str], slots: int, *,
                    timeout_s: float) -> set[str]:
    """The `slots` workers of `probation` (in registration order) that run now: those holding a
    slot keep it until their `timeout_s` on probation is used up; then the least time on
    probation first (so one that never leases gives its slot up to the others), then the
    oldest registration. heapq.nsmallest is sorted(...)[:slots], ties in input order included.
    A worker given a slot holds it from then, also while its machine is acquired and boots
    (probation time counts from its registration): when holding needed probation time already
    spent, a booting worker lost its slot at the next decision to one with none, which was
    acquired and lost it in turn, so no offered worker was ever measured."""

    def order(worker_id: str) -> tuple[bool, float]:
        view = workers[worker_id]
        holding = view.active and view.probation_s < timeout_s
        return (not holding, view.probation_s)

    return set(heapq.nsmallest(slots, probation, key=order))


def untried(workers: dict[str, WorkerView], probation: list[str], cfg: ActivationConfig) -> list[str]:
    """The workers of `probation` that have not used up cfg.probation_timeout_s on it. While the
    measured set covers demand, only these get slots: once every offered worker had used its
    probation unmeasured (a fleet far larger than the lease window keeps busy), rotating the
    least-tried into a slot at each decision acquired a machine every control period and
    measured none."""
    return [w for w in probation if workers[w].probation_s < cfg.probation_timeout_s]


def window_decision(workers: dict[str, WorkerView], measured: list[str], probation: list[str], required_rps: float,
                    *, cap: int | None, timeout_s: float) -> ControlDecision:
    """The controller off, or demand or rates not yet known: every worker, but at most `cap`
    (twice the groups a full lease window holds: as many workers as can hold work at once, and
    as many again ready to take the room one frees; 10,000 of them asking for work together
    swamp the coordinator). The measured go first, then those on probation in
    `probation_trial`'s order. `cap` None: every worker."""
    everyone = len(measured) + len(probation)
    if cap is None or everyone <= cap:
        active = set(measured) | set(probation)
    else:
        active = set(sorted(measured)[:cap])
        active |= probation_trial(workers, probation, cap - len(active), timeout_s=timeout_s)
    left = everyone - len(active)
    waiting = f" ({left} waiting: twice a full lease window, {cap} groups, run)" if left else ""
    return ControlDecision(active, required_rps,
                           f"controller off, demand not yet known or no rate measured: run all{waiting}", False)


def unmeasured_to_cover(offers: list[Offer], required_rps: float) -> int:
    """Probation slots for a measured set short of demand: the workers not yet measured needed
    beside `offers` to cover `required_rps`, if they are as fast as the measured average."""
    measured_rps = sum(o.rollouts_per_s for o in offers)
    mean_rps = measured_rps / len(offers)
    return math.ceil((required_rps - measured_rps) / mean_rps) if mean_rps > 0 else len(offers)

"""What the activation controller knows of each worker, and the decision it returns. Plain data:
the controller (`policy.controller`) updates these from the coordinator's observations and the
planned cover (`policy.planned`) reads them; and the small rules over them both use."""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field

from echo2.planner import Offer

MAX_RATE_NOTES = 1024
"""Rate notes kept per worker (`WorkerView.rate_notes`), one per buffered group since its newest
passed one: far more than one worker's groups wait in the buffer for a step's audit, and a
bound on what a worker the audit never passes makes the coordinator keep."""


class Ewma:
    def __init__(self, alpha: float) -> None:
        self.alpha, self.value, self.samples = alpha, math.nan, 0

    def add(self, sample: float) -> None:
        self.value = sample if self.samples == 0 else self.alpha * sample + (1 - self.alpha) * self.value
        self.samples += 1


@dataclass
class WorkerView:
    """What the controller knows of one worker."""

    price_per_hour: float
    alive: bool
    active: bool
    rollouts_per_s: Ewma
    """Validated rollouts per second of working time: holding leases, or idle because its
    weights are too stale to be given any (a slow link costs the worker, not the run)."""
    tokens_per_s: Ewma
    dissemination_s: Ewma
    generation_s: Ewma
    admitted: Ewma
    """Share of its groups admitted (1) rather than dropped as stale (0)."""
    worker_class: str | None = None
    """Its declared class in the activation catalog (a claim: it buys a prior, see
    `policy.planned`), or None."""
    released: bool = False
    """Handed back to its fleet provider while idle (or offered and never acquired): bills
    nothing, and stays a candidate the controller may choose (the provider then acquires it)."""
    active_s: float = 0.0
    idle_s: float = 0.0
    """Rented but not active: billed, since a rented machine costs the same idle."""
    released_s: float = 0.0
    probation_s: float = 0.0
    """Time active while unmeasured: probation slots go to those with the least."""
    audited: int = 0
    audit_failed: int = 0
    """Its groups the rollout audit checked, and failed (`policy.credit.audit_credit`)."""
    rate_notes: deque[tuple[int, float]] = field(default_factory=lambda: deque(maxlen=MAX_RATE_NOTES))
    """While the run audits: (the run's sequence number of a group of it just buffered, its
    measured rate then), oldest first (`policy.credit.note_rate`)."""
    checked_seq: int | None = None
    checked_rps: float | None = None
    """The sequence number of its newest group the audit passed, and its rate when it delivered
    it: the most its rate is credited with (`policy.credit.checked_rps`; None: nothing checked
    yet, or the run does not audit)."""
    admitted_n: int = 0
    outcomes_n: int = 0
    """Its groups admitted, of all it delivered (the long-run share the planned cover uses)."""
    losses: int = 0
    """Times it vanished while registered (preempted, crashed): with active_s + idle_s, its
    measured uptime."""
    busy_s_total: float = 0.0
    stale_s_total: float = 0.0
    """Lease-holding seconds and seconds refused as too stale, as last reported."""
    cost: float = 0.0
    last_counters: tuple[int, float] = (0, 0.0)
    """(rollouts, working seconds) at the last rate sample."""

    def stale_share(self) -> float:
        """Share of its working time it could not work because its weights were too stale."""
        total_s = self.busy_s_total + self.stale_s_total
        return self.stale_s_total / total_s if total_s > 0 else 0.0


@dataclass
class ControlDecision:
    active: set[str]
    required_rps: float
    reason: str
    changed: bool
    estimates: dict[str, float] = field(default_factory=dict)
    covered: bool = True
    """False: the measured workers fall short of the demand (the unmeasured are its hope)."""


def natural_key(worker_id: str) -> tuple[int, str]:
    """w2 before w10: ids in the order workers were numbered."""
    return len(worker_id), worker_id


NEGLIGIBLE_RATE_SHARE = 0.05
"""A measured worker credited less than this share of the median credited rate delivers next
to nothing (its EWMA decays toward 0 while it is too stale to lease)."""


def delivering(offers: list[Offer]) -> set[str]:
    rates = sorted(o.rollouts_per_s for o in offers)
    median = rates[len(rates) // 2]
    return {o.id for o in offers if o.rollouts_per_s > NEGLIGIBLE_RATE_SHARE * median} or {o.id for o in offers}


def candidate(view: WorkerView) -> bool:
    """Live, or released and so acquirable again; a crashed or departed worker is neither."""
    return view.alive or view.released


def value_or_zero(ewma: Ewma) -> float:
    return ewma.value if ewma.samples else 0.0

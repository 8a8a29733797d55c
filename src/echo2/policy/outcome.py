"""What one scored rollout group teaches the rules that learn from it, as one record: the
activation controller (the worker's measured rate, its admitted share, token speed, segment
times, the run's uninformative share) and the data plane (the worker's lease trust, the
generation times that set how far ahead swapping workers lease). The coordinator's intake
builds it once per applied group, and each rule takes it once
(`ActivationController.observe_submission`, `DataPlane.observe_submission`)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class SubmissionOutcome:
    worker_id: str
    admitted: bool
    """Admissible under S when it arrived (buffered, or dropped as uninformative): delivered work."""
    held_s: float
    """Lease to submission, on the coordinator's clock."""
    tokens: int
    gen_time_s: float
    """What the worker says generating took (its token speed; nothing is billed on it)."""
    rollouts_total: int
    busy_s_total: float
    stale_s_total: float
    """The worker's work counters after this group: validated rollouts, seconds holding leases,
    seconds active but too stale to lease (what its measured rate is taken over)."""
    segment_s: float | None
    """Seconds between the generation's swap points (sampling.segment_tokens; None: off)."""
    dropped_uninformative_total: int
    scored_total: int
    """The run's groups dropped as uninformative, of those scored."""
    group_seq: int | None = None
    """Its place in the run's buffer order (the store's sequence number) if it was buffered;
    None: stale, or dropped as uninformative. The audit's verdicts name groups by it, so the
    controller credits the rate the worker had when it delivered the newest one that passed."""

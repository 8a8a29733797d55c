"""How far ahead workers may generate: S bounds staleness, it is not a target. With workers faster
than the learner, a window of S steps fills with groups that wait S steps to train (most trained
groups are then S versions old). The lease window is the fewest steps of outstanding groups that
keep the learner from waiting: `steps` of P groups may be leased or buffered ahead of the batch
in training (`admission.lease_capacity` with it in place of S), so groups train at the lowest
staleness the fleet allows.

The capacity model gives its floor: below S_min = ceil((T_dis + T_gen) / T_train) the freshest
groups land too late whatever the fleet (ECHO2.md section 4), so the window never goes below the
S_min measured from the fleet's latencies (S until they are measured). Above the floor it is
measured, not predicted: it starts at S, grows by a step at once whenever the learner waited for
a batch, and shrinks by a step after a run of batches in a row that were ready when asked for:
`CALM_STEPS` at first, twice as many after each wait (up to `MAX_CALM_STEPS`), so a window that
is one step too small is tried ever more rarely instead of costing a wait (and learner
utilization) every few steps. The coordinator and the simulator both feed it: the learner's
waits through `DataPlane.take_batch`, the floor from the activation controller's `s_min` at each
decision.
"""

from __future__ import annotations

# a wait shorter than this share of a step (or than MIN_WAIT_S) is the batch request's own round
# trip, not the learner starving
WAIT_SHARE = 0.05
MIN_WAIT_S = 0.02
CALM_STEPS = 3
MAX_CALM_STEPS = 64


class LeaseWindow:
    def __init__(self, max_staleness: int, adaptive: bool = True) -> None:
        self.max_staleness, self.adaptive = max_staleness, adaptive
        self.steps = max_staleness
        """Steps of P groups that may be outstanding ahead of the batch in training (<= S)."""
        self.floor = max_staleness
        """The fewest steps the window may shrink to: the measured S_min (S until known)."""
        self.calm = 0
        self.calm_needed = CALM_STEPS
        """Ready batches in a row before the window shrinks a step (doubles after each wait)."""

    def set_floor(self, s_min: int | None) -> None:
        """The capacity model's S_min from measured latencies (None: not measured yet)."""
        if not self.adaptive:
            return
        self.floor = max(min(1, self.max_staleness), min(self.max_staleness, s_min if s_min is not None
                                                         else self.max_staleness))
        self.steps = max(self.steps, self.floor)

    def observe(self, wait_s: float, step_time_s: float | None) -> None:
        """The learner's wait for the batch it just got, and its recent step time (None: not
        known yet)."""
        if not self.adaptive or self.max_staleness == 0:
            return
        if wait_s > max(MIN_WAIT_S, WAIT_SHARE * (step_time_s or 0.0)):
            self.steps, self.calm = min(self.max_staleness, self.steps + 1), 0
            self.calm_needed = min(MAX_CALM_STEPS, 2 * self.calm_needed)
            return
        self.calm += 1
        if self.calm >= self.calm_needed:
            self.steps, self.calm = max(self.floor, 1, self.steps - 1), 0

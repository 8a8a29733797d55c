"""The coordinator's data plane as the simulator runs it: the policy core
(`echo2.policy.DataPlane`, the object `CoordinatorState` drives) over light bookkeeping: prompts
are counts and a buffered group is just its version. Only the accounting is the simulator's
(counters, the staleness histogram, waking refused workers when room opens).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from echo2.policy import DataPlane, staleness


@dataclass
class DataCounters:
    leased: int = 0
    """Groups handed out in leases (each group is one prompt x G completions)."""
    accepted: int = 0
    trained: int = 0
    dropped_stale: int = 0
    """Rejected at submission or dropped from the buffer: older than S when they would train."""
    requeued: int = 0
    """Leases returned to the queue because their worker was preempted."""
    staleness_hist: Counter[int] = field(default_factory=Counter)
    """Staleness (t - v) of every trained group."""


def _version(group: int) -> int:
    return group


class SimDataPlane:
    def __init__(self, max_staleness: int, groups_per_step: int, max_leases_per_worker: int = 0,
                 fresh_leases: bool = False) -> None:
        self.core: DataPlane[int] = DataPlane(
            max_staleness, groups_per_step, _version, max_leases_per_worker=max_leases_per_worker,
            fresh_leases=fresh_leases,
        )
        self.in_leases = 0
        self.counters = DataCounters()
        self.on_room: Callable[[], None] = lambda: None
        """Called when lease room opens without a version change (drops, requeued leases), so
        workers refused for a full window can ask again."""

    @property
    def current_version(self) -> int:
        return self.core.current_version

    @property
    def outstanding(self) -> int:
        return self.in_leases + len(self.core.buffer)

    def may_lease(self, worker_version: int) -> bool:
        return self.core.may_lease(worker_version)

    def lease(self, worker_version: int, wanted: int, held_by_worker: int = 0) -> int:
        """Groups granted to a worker holding `worker_version` (0: refused or window full)."""
        granted = self.core.grant(worker_version, wanted, leased=self.in_leases, held_by_worker=held_by_worker).count
        self.in_leases += granted
        self.counters.leased += granted
        return granted

    def release(self, groups: int) -> None:
        """A preempted worker's leases come back (their prompts go to the next lease)."""
        self.in_leases -= groups
        self.counters.requeued += groups
        self.on_room()

    def submit(self, version: int, groups: int) -> int:
        """Groups of one lease arrive; returns how many were dropped as stale."""
        self.in_leases -= groups
        if self.core.admits(version):
            for _ in range(groups):
                self.core.add(version)
            self.counters.accepted += groups
            return 0
        self.counters.dropped_stale += groups
        self.on_room()
        return groups

    def publish(self, version: int) -> None:
        self.core.publish(version)

    def take_batch(self, step: int, now_s: float | None = None) -> list[int] | None:
        """Versions of the batch for `step`, or None while fewer than P admissible groups wait.
        `now_s`: the simulated clock (the learner's wait sets the lease window, as in the
        coordinator)."""
        dropped = self.core.advance(step)
        if dropped:
            self.counters.dropped_stale += len(dropped)
            self.on_room()
        window = self.core.window.steps
        batch = self.core.take_batch(step, now_s)
        if self.core.window.steps > window:
            self.on_room()  # the learner waited: the window grew, refused workers may lease now
        if batch is not None:
            self.counters.trained += len(batch)
            self.counters.staleness_hist.update(staleness(step, v) for v in batch)
        return batch

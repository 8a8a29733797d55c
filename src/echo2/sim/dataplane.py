"""The coordinator's data plane as the simulator runs it: leases, the rollout buffer, staleness
admission and batches. The rules are the coordinator's own (`echo2.coordinator.admission`,
imported, not copied); only the bookkeeping is lighter: prompts are counts and a buffered
group is just its version.

Mirrors `CoordinatorState`: a lease is refused while the worker is more than S versions behind
(`worker_may_lease`) and limited by `lease_capacity` (outstanding = leased + buffered); a
submitted group is buffered iff `is_admissible(learner_step, version, S)`; when the learner asks
for step t, buffered groups older than S are dropped, then the oldest B groups form the batch.
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field

from echo2.coordinator.admission import is_admissible, lease_capacity, staleness, worker_may_lease


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


class DataPlane:
    def __init__(self, max_staleness: int, groups_per_step: int) -> None:
        self.max_staleness = max_staleness
        self.groups_per_step = groups_per_step
        self.current_version = -1
        self.learner_step = 0
        self.steps_taken = 0
        self.in_leases = 0
        self.buffer: deque[int] = deque()  # versions of accepted groups, oldest submission first
        self.counters = DataCounters()
        self.on_room: Callable[[], None] = lambda: None
        """Called when lease room opens without a version change (drops, requeued leases), so
        workers refused for a full window can ask again."""

    @property
    def outstanding(self) -> int:
        return self.in_leases + len(self.buffer)

    def may_lease(self, worker_version: int) -> bool:
        return (
            self.current_version >= 0
            and worker_version >= 0
            and worker_may_lease(self.current_version, worker_version, self.max_staleness)
        )

    def lease(self, worker_version: int, wanted: int) -> int:
        """Groups granted to a worker holding `worker_version` (0: refused or window full)."""
        if not self.may_lease(worker_version):
            return 0
        room = lease_capacity(
            self.max_staleness, self.groups_per_step, worker_version, self.steps_taken, self.outstanding
        )
        granted = min(room, wanted)
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
        if is_admissible(self.learner_step, version, self.max_staleness):
            self.buffer.extend([version] * groups)
            self.counters.accepted += groups
            return 0
        self.counters.dropped_stale += groups
        self.on_room()
        return groups

    def publish(self, version: int) -> None:
        self.current_version = max(self.current_version, version)

    def take_batch(self, step: int) -> list[int] | None:
        """Versions of the batch for `step`, or None while fewer than B admissible groups wait."""
        self._advance(step)
        need = self.groups_per_step
        if len(self.buffer) < need:
            return None
        batch = [self.buffer.popleft() for _ in range(need)]
        self.steps_taken = max(self.steps_taken, step + 1)
        self.counters.trained += need
        self.counters.staleness_hist.update(staleness(step, v) for v in batch)
        return batch

    def _advance(self, step: int) -> int:
        """Move to `step` and drop buffered groups that became too stale; returns how many."""
        if step == self.learner_step and step > 0:
            return 0  # re-asking for the same step: nothing new can have aged
        self.learner_step = step
        S = self.max_staleness
        fresh = [v for v in self.buffer if is_admissible(step, v, S)]
        dropped = len(self.buffer) - len(fresh)
        if dropped:
            self.buffer = deque(fresh)
            self.counters.dropped_stale += dropped
            self.on_room()
        return dropped

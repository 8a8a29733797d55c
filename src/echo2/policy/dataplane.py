"""The data plane on plain data: how the staleness rules of `admission` combine into leases,
admission at submission, the drop of stale groups and the batches. The coordinator drives it
under SQLite and HTTP (`CoordinatorState`), the simulator drives it with counts and versions
(`echo2.sim.dataplane`); neither restates a rule.

Symbols: learner step t, staleness bound S, prompt groups per step P (grpo.prompts_per_step;
B = P x group_size is rollouts, as in the planner). A group is anything the caller
keeps (a stored record, or just its version); `version_of` reads its policy version.

- lease: refused before the first version and while the worker is more than S versions behind;
  otherwise up to `lease_capacity` groups, where outstanding = leased + buffered, and at most
  `max_leases_per_worker` held by one worker;
- submit: a group is buffered iff it is admissible at the current learner step;
- advance(t): the learner asks for step t: buffered groups older than S are dropped;
- take_batch(t): the oldest P buffered groups (submission order) form step t's batch; the
  learner's wait for it sets how far ahead workers may generate (`policy.window`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Generic, TypeVar

from echo2.policy.admission import is_admissible, lease_capacity, worker_may_lease
from echo2.policy.window import LeaseWindow

G = TypeVar("G")

# retry_after_s of each refusal: what a refused worker waits before asking again. No version yet
# takes a learner start (seconds); a stale worker needs one swap; the window opens when the
# learner takes its next batch, the fastest of the three.
NO_VERSION_RETRY_S = 0.5
STALE_RETRY_S = 0.2
OWN_CAP_RETRY_S = 0.2
WINDOW_RETRY_S = 0.1


@dataclass(frozen=True)
class LeaseGrant:
    """How many groups a lease may carry; when none, why and when to ask again."""

    count: int
    retry_after_s: float = 0.0
    reason: str = ""


class DataPlane(Generic[G]):
    def __init__(
        self,
        max_staleness: int,
        groups_per_step: int,
        version_of: Callable[[G], int],
        *,
        max_leases_per_worker: int = 0,
        buffer: Iterable[G] = (),
        learner_step: int = 0,
        steps_taken: int = 0,
        current_version: int = -1,
        fresh_leases: bool = False,
    ) -> None:
        """`max_leases_per_worker` 0: P (a worker may hold one step's worth). `fresh_leases`:
        lease only as far ahead as keeps the learner from waiting (`policy.window`); else the
        whole window of S steps."""
        self.max_staleness, self.groups_per_step, self.version_of = max_staleness, groups_per_step, version_of
        self.max_leases_per_worker = max_leases_per_worker or groups_per_step
        self.buffer: list[G] = list(buffer)
        """Admitted groups waiting for a batch, oldest submission first."""
        self.learner_step, self.steps_taken, self.current_version = learner_step, steps_taken, current_version
        self._checked_at: int | None = None
        """Step at which every buffered group is known admissible (advance may skip the scan)."""
        self.window = LeaseWindow(max_staleness, adaptive=fresh_leases)
        self.asked_at: tuple[int, float] | None = None
        """(step, when) the learner first asked for the batch not yet taken."""
        self.step_time_s: float | None = None
        """The learner's recent busy time per step (the caller keeps it current)."""

    # ---- versions ----
    def publish(self, version: int) -> None:
        self.current_version = max(self.current_version, version)

    # ---- leases ----
    def may_lease(self, worker_version: int) -> bool:
        return self.refusal(worker_version) is None

    def refusal(self, worker_version: int) -> LeaseGrant | None:
        """Why a worker holding `worker_version` gets no work whatever the window (None: it may)."""
        if self.current_version < 0:
            return LeaseGrant(0, NO_VERSION_RETRY_S, "no policy version published yet")
        if worker_version < 0 or not worker_may_lease(self.current_version, worker_version, self.max_staleness):
            newest_needed = self.current_version - self.max_staleness
            return LeaseGrant(0, STALE_RETRY_S, f"weights too stale: load version >= {newest_needed}")
        return None

    def grant(self, worker_version: int, wanted: int, *, leased: int, held_by_worker: int) -> LeaseGrant:
        """Groups a worker holding `worker_version` and `held_by_worker` leases may take now, with
        `leased` leases open in all. Counts only: the caller records the leases it hands out."""
        refused = self.refusal(worker_version)
        if refused is not None:
            return refused
        own_room = self.max_leases_per_worker - held_by_worker
        if own_room <= 0:
            return LeaseGrant(0, OWN_CAP_RETRY_S, f"holding {held_by_worker} leases: return some first")
        room = lease_capacity(max_staleness=self.window.steps, groups_per_step=self.groups_per_step,
                              worker_version=worker_version, steps_taken=self.steps_taken,
                              outstanding_groups=leased + len(self.buffer))
        count = min(wanted, room, own_room)
        if count <= 0:
            ahead = f" (leasing {self.window.steps} of S={self.max_staleness} steps ahead)" \
                if self.window.steps < self.max_staleness else ""
            return LeaseGrant(0, WINDOW_RETRY_S, f"window full: waiting for the learner{ahead}")
        return LeaseGrant(count)

    # ---- rollouts ----
    def admits(self, version: int) -> bool:
        """Would a group of `version` submitted now be buffered (rather than dropped as stale)?"""
        return is_admissible(self.learner_step, version, self.max_staleness)

    def add(self, group: G) -> None:
        """Buffer a group the caller found admissible (`admits`) at the current learner step."""
        self.buffer.append(group)

    def requeue_front(self, groups: list[G]) -> None:
        """Groups back at the head of the buffer (a rejected batch's innocent groups): they are
        the oldest, and the next advance checks them again."""
        self.buffer[:0] = groups
        self._checked_at = None

    def remove(self, keep: Callable[[G], bool]) -> list[G]:
        """Drop buffered groups for which `keep` is false (a quarantined worker's); returns them."""
        removed = [g for g in self.buffer if not keep(g)]
        if removed:
            self.buffer = [g for g in self.buffer if keep(g)]
        return removed

    # ---- batches ----
    def advance(self, step: int) -> list[G]:
        """The learner asks for `step`: move there and drop buffered groups too stale for it;
        returns the dropped groups (the caller persists and reports them)."""
        self.learner_step = step
        if self._checked_at == step:
            return []  # asked again for the same step: nothing can have aged since the scan
        self._checked_at = step
        S = self.max_staleness
        stale = [g for g in self.buffer if not is_admissible(step, self.version_of(g), S)]
        if stale:
            self.buffer = [g for g in self.buffer if is_admissible(step, self.version_of(g), S)]
        return stale

    def take_batch(self, step: int, now_s: float | None = None) -> list[G] | None:
        """Step `step`'s batch, the oldest P buffered groups, or None while fewer wait. Call
        `advance(step)` first (its drops are the caller's to record). `now_s`: the caller's
        clock, from which the learner's wait for each batch is measured (None: not measured)."""
        if step != self.learner_step:
            raise ValueError(f"take_batch({step}) before advance({step}): the learner is at step {self.learner_step}")
        if now_s is not None and (self.asked_at is None or self.asked_at[0] != step):
            self.asked_at = (step, now_s)
        need = self.groups_per_step
        if len(self.buffer) < need:
            return None
        batch, self.buffer = self.buffer[:need], self.buffer[need:]
        self.steps_taken = max(self.steps_taken, step + 1)
        if now_s is not None and self.asked_at is not None:
            self.window.observe(now_s - self.asked_at[1], self.step_time_s)
            self.asked_at = None
        return batch

"""What a worker id has earned by delivering: how many leases it may hold, how long a lease may
stay out, and how much of a batch its groups may fill. The data plane (`policy.dataplane`)
applies these rules for the coordinator and the simulator alike; the activation controller's
credit rules are in `policy.credit`.

Without these rules a few fresh worker ids can lease almost the whole window and return
nothing: no batch forms until their leases expire, and honest workers are told "window full"
meanwhile; and a worker returning groups without generating them fills whole batches.

- slow start: a worker with no accepted group (a group admitted at submission) may hold
  `NEW_WORKER_LEASES` lease; each accepted group doubles its allowance, up to the per-worker cap
  (coordinator.max_leases_per_worker). Standing belongs to a registration: an id that registers
  again starts over, so a departed honest worker's id is worth nothing to whoever takes it.
- delivery: with a clock, a worker also holds no more than its delivery justifies: the groups
  its measured rate (groups accepted over the last `DELIVERY_WINDOW_S`, over at least a lease
  deadline) returns within a lease's deadline, plus `DELIVERY_MARGIN_GROUPS`. Trust is spent
  only as fast as it is earned: ids that delivered a few groups and then hold what they lease
  see their allowance shrink as their deliveries age, to the margin once none is recent.
- the new workers' pool: all workers without an accepted group together hold at most
  `NEW_WORKERS_WINDOW_SHARE` of the lease window (never less than one lease, so a new worker can
  always get its first lease once the pool has room);
- deadlines: a lease's worker must answer within max(`DEADLINE_FLOOR_S`, `DEADLINE_FACTOR` x
  the slowest of its last `DEADLINE_SAMPLES` lease-to-submit times), never more than
  coordinator.lease_timeout_s. A worker that never submitted gets lease_timeout_s: a shorter
  default would expire an honest slow worker's first lease (a large model's first generation)
  before it could ever be measured, and slow start already bounds what a new id can hold.
- batch shares: no worker's groups fill more than `max_worker_share` of a batch
  (`batch_share_cap`, applied by `DataPlane.take_batch`).
- reports: a worker's bad-peer reports ask for the coordinator's own check of the relay
  (coordinator.parts.relay_reports) only once `REPORT_STANDING_GROUPS` of its groups were accepted.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

NEW_WORKER_LEASES = 1
DELIVERY_WINDOW_S = 120.0
"""A worker's delivery rate counts its groups accepted in the last this long."""
DELIVERY_MARGIN_GROUPS = 2
"""Leases beyond what a worker's measured delivery returns within a deadline (a worker whose
deliveries all aged out may still hold this many, enough to show it is working again)."""
DELIVERY_SAMPLES = 1024
"""Accepted groups' times kept per worker (a worker this fast is past any per-worker cap)."""
REPORT_STANDING_GROUPS = 4
"""Groups of a registration accepted before its bad-peer reports make the coordinator check the
relay (coordinator.parts.relay_reports): a handful of fresh ids, joined a moment ago with nothing
delivered, cannot make the coordinator fetch from relays on their word; an honest worker passes
this within its first few leases."""
NEW_WORKERS_WINDOW_SHARE = 0.25
DEADLINE_FLOOR_S = 30.0
DEADLINE_FACTOR = 4.0
DEADLINE_SAMPLES = 8
# a batch short of its share cap waits for other workers' groups at most this long, or one
# learner step time when that is longer: a worker that stops delivering costs one step's wait
SHARE_WAIT_MIN_S = 1.0


@dataclass
class Standing:
    accepted: int = 0
    """Groups admitted at submission since this registration."""
    held_s: deque[float] = field(default_factory=lambda: deque(maxlen=DEADLINE_SAMPLES))
    """Its latest lease-to-submit times, on the caller's clock."""
    accepted_at: deque[float] = field(default_factory=lambda: deque(maxlen=DELIVERY_SAMPLES))
    """When its latest accepted groups came (with a clock)."""
    since_s: float | None = None
    """When its first answered lease was issued (with a clock): what its rate is measured from."""


class LeaseTrust:
    def __init__(self, clock: Callable[[], float] | None = None, lease_timeout_s: float = math.inf) -> None:
        """`clock` (None: slow start only): the caller's, for delivery rates. `lease_timeout_s`:
        coordinator.lease_timeout_s, the longest deadline (`deadline_s`)."""
        self.clock, self.lease_timeout_s = clock, lease_timeout_s
        self.standing: dict[str, Standing] = {}

    def is_new(self, worker_id: str) -> bool:
        """No group of this registration accepted yet."""
        standing = self.standing.get(worker_id)
        return standing is None or standing.accepted == 0

    def accepted(self, worker_id: str) -> int:
        """Groups of this registration admitted at submission."""
        standing = self.standing.get(worker_id)
        return standing.accepted if standing is not None else 0

    def allowance(self, worker_id: str, cap: int) -> int:
        """Leases the worker may hold at once: one while new, doubling per accepted group, no
        more than its delivery justifies (with a clock: `delivered`), at most `cap`."""
        earned = min(cap, NEW_WORKER_LEASES << min(self.accepted(worker_id), 32))
        delivered = self.delivered(worker_id)
        return earned if delivered is None else min(earned, max(NEW_WORKER_LEASES, delivered))

    def delivered(self, worker_id: str) -> int | None:
        """The groups the worker's measured rate returns within a lease's deadline, plus the
        margin (None: no clock, or nothing answered yet)."""
        standing = self.standing.get(worker_id)
        if self.clock is None or standing is None or standing.since_s is None:
            return None
        now, deadline_s = self.clock(), self.deadline_s(worker_id, self.lease_timeout_s)
        span_s = min(DELIVERY_WINDOW_S, max(deadline_s, now - standing.since_s))
        recent = sum(1 for at in standing.accepted_at if at > now - span_s)
        if len(standing.accepted_at) == DELIVERY_SAMPLES:  # the oldest kept is inside the span
            span_s = min(span_s, max(deadline_s, now - standing.accepted_at[0]))
        return math.ceil(recent * deadline_s / span_s) + DELIVERY_MARGIN_GROUPS

    @staticmethod
    def new_pool(window_groups: int) -> int:
        """Leases all new workers together may hold in a window of `window_groups` groups."""
        return max(1, math.floor(window_groups * NEW_WORKERS_WINDOW_SHARE))

    def submitted(self, worker_id: str, held_s: float, *, accepted: bool) -> None:
        """A lease of the worker was answered after `held_s` seconds; its group was admitted
        (`accepted`) or dropped as stale (its time still measures the worker)."""
        standing = self.standing.setdefault(worker_id, Standing())
        standing.held_s.append(max(0.0, held_s))
        now = self.clock() if self.clock is not None else None
        if now is not None and standing.since_s is None:
            standing.since_s = now - max(0.0, held_s)
        if accepted:
            standing.accepted += 1
            if now is not None:
                standing.accepted_at.append(now)

    def deadline_s(self, worker_id: str, lease_timeout_s: float) -> float:
        """How long a lease issued to the worker now may stay out."""
        standing = self.standing.get(worker_id)
        if standing is None or not standing.held_s:
            return lease_timeout_s
        return min(lease_timeout_s, max(DEADLINE_FLOOR_S, DEADLINE_FACTOR * max(standing.held_s)))

    def forget(self, worker_id: str) -> None:
        """The id registered again (or is forgotten): it starts over as new."""
        self.standing.pop(worker_id, None)


def batch_share_cap(max_worker_share: float, groups_per_step: int) -> int:
    """Most groups of one worker in a batch of `groups_per_step` (at least one)."""
    return max(1, math.floor(max_worker_share * groups_per_step + 1e-9))


def share_wait_s(step_time_s: float | None) -> float:
    """How long a batch short of its share cap waits for other workers' groups."""
    return max(SHARE_WAIT_MIN_S, step_time_s or 0.0)

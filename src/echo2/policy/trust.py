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
from dataclasses import dataclass, field

NEW_WORKER_LEASES = 1
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


class LeaseTrust:
    def __init__(self) -> None:
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
        """Leases the worker may hold at once: one while new, doubling per accepted group, at most `cap`."""
        return min(cap, NEW_WORKER_LEASES << min(self.accepted(worker_id), 32))

    @staticmethod
    def new_pool(window_groups: int) -> int:
        """Leases all new workers together may hold in a window of `window_groups` groups."""
        return max(1, math.floor(window_groups * NEW_WORKERS_WINDOW_SHARE))

    def submitted(self, worker_id: str, held_s: float, *, accepted: bool) -> None:
        """A lease of the worker was answered after `held_s` seconds; its group was admitted
        (`accepted`) or dropped as stale (its time still measures the worker)."""
        standing = self.standing.setdefault(worker_id, Standing())
        standing.held_s.append(max(0.0, held_s))
        if accepted:
            standing.accepted += 1

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

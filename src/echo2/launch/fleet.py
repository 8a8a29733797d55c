"""Fleet providers of the local launcher, and the fleet rule they follow.

`FleetSync` (policy/fleet_sync.py, re-exported here) turns the activation controller's decisions
into acquire and release calls on a `FleetProvider`: a worker inactive for `release_after_s` is
released (its machine handed back: it bills nothing), and a released worker the controller
chooses again is acquired (started again under the same worker id). The simulator drives the same
`FleetSync` with a simulated provider (sim/provider.py).

Providers here:
- `StaticFleet`: machines rented for the whole run; nothing can be released, so an idle worker
  bills every second (the controller bills rented time, active or idle).
- `LocalFleet` (`echo2 run`, `[activation] provider = "local"`): the launcher's worker
  processes are stopped (SIGTERM: the worker leaves cleanly) and started again, and the time from
  the acquire to the worker's registration is recorded (`worker_rejoined`, `rejoin_s`).
The ssh and skypilot providers are launch/ssh_fleet.py and launch/skypilot.py; a cloud provider
implements the same members (see `FleetProvider` and the README, "Fleet providers").
"""

from __future__ import annotations

import time
from collections.abc import Callable

from echo2.launch.children import Child, stop_children
from echo2.policy.fleet_sync import FleetProvider, FleetSync
from echo2.report.metrics import MetricsWriter

# the rule itself lives in policy/fleet_sync.py, where the simulator drives it too; the launchers
# and their tests keep importing it from here
__all__ = ["FleetProvider", "FleetSync", "LocalFleet", "StaticFleet"]


class StaticFleet:
    """Machines rented for the whole run: every worker always held."""

    releasable = False

    def __init__(self, worker_ids: set[str]) -> None:
        self.ids = set(worker_ids)

    def worker_ids(self) -> set[str]:
        return set(self.ids)

    def released(self) -> set[str]:
        return set()

    def release(self, worker_id: str) -> None:
        raise RuntimeError(f"the static fleet cannot release {worker_id!r}: its machines are held for the whole run")

    def acquire(self, worker_id: str) -> None:
        pass  # never released, so always held

    def observe(self, record: dict) -> None:
        pass


class LocalFleet:
    """The launcher's worker processes: stopped by PID and started again with the same args."""

    releasable = True

    def __init__(self, children: dict[str, Child], start: Callable[[str], Child], metrics: MetricsWriter, *,
                 not_started: set[str] = frozenset()) -> None:
        """`not_started`: workers offered to the run but not started yet; they count as released
        (billing nothing) until the controller chooses them."""
        self.children = dict(children)  # worker id -> its current process
        self.start, self.metrics = start, metrics
        self.released_ids: set[str] = set(not_started)
        self.acquired_at: dict[str, float] = {}  # wall clock, to compare with the registration's record

    def worker_ids(self) -> set[str]:
        """Running or released: one whose process died on its own is no longer ours to act on."""
        running = {w for w, c in self.children.items() if c.exit_code() is None}
        return running | self.released_ids

    def released(self) -> set[str]:
        return set(self.released_ids)

    def release(self, worker_id: str) -> None:
        child = self.children[worker_id]
        started = time.monotonic()
        stop_children([child])
        self.released_ids.add(worker_id)
        self.metrics.write("worker_released", worker_id=worker_id, pid=child.pid, exit_code=child.exit_code(),
                           stop_s=time.monotonic() - started)

    def acquire(self, worker_id: str) -> None:
        self.acquired_at[worker_id] = time.time()
        child = self.start(worker_id)
        self.children[worker_id] = child
        self.released_ids.discard(worker_id)
        self.metrics.write("worker_acquired", worker_id=worker_id, pid=child.pid)

    def observe(self, record: dict) -> None:
        """A coordinator record: the registration of an acquired worker ends its rejoin."""
        if record.get("kind") == "worker_registered" and record.get("worker_id") in self.acquired_at:
            worker_id = record["worker_id"]
            rejoin_s = record["time"] - self.acquired_at.pop(worker_id)
            self.metrics.write("worker_rejoined", worker_id=worker_id, rejoin_s=rejoin_s)

"""Fleet actions: the activation controller's decisions become acquire and release calls on a
`FleetProvider`, the one place that knows how workers' machines are held.

The coordinator decides which workers are active (policy/controller.py) and records each
decision as an `activation` metric event. `FleetSync` follows those decisions: a worker inactive
for `release_after_s` is released (its machine handed back: it bills nothing), and a released
worker the controller chooses again is acquired (started again under the same worker id; it
registers, loads the current weights and trains). The coordinator keeps a released worker's
measured rate, so the controller can still price it and choose it.

Providers:
- `StaticFleet`: machines rented for the whole run; nothing can be released, so an idle worker
  bills every second (the controller bills rented time, active or idle).
- `LocalFleet` (`echo2 run`, `[activation] provider = "local"`): the launcher's worker
  processes are stopped (SIGTERM: the worker leaves cleanly) and started again, and the time from
  the acquire to the worker's registration is recorded (`worker_rejoined`, `rejoin_s`).

A cloud provider implements the same members: `releasable`, `worker_ids()`, `released()`, `release(id)`
(stop or hand back the instance; the worker process must get SIGTERM so it leaves the
coordinator cleanly), `acquire(id)` (boot an instance that starts `echo2 worker` with the same
worker id) and `observe(record)`. See the README, "Fleet providers".
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Protocol

from echo2.launch.children import Child, stop_children
from echo2.report.metrics import MetricsWriter


class FleetProvider(Protocol):
    releasable: bool
    """False: release is never called (the machines are held for the whole run)."""

    def worker_ids(self) -> set[str]:
        """Every worker the provider holds or can acquire."""
        ...

    def released(self) -> set[str]:
        """The workers released and not acquired since."""
        ...

    def release(self, worker_id: str) -> None:
        """Hand the worker's machine back; its process gets SIGTERM and leaves the coordinator."""
        ...

    def acquire(self, worker_id: str) -> None:
        """Start a released worker again under the same worker id."""
        ...

    def observe(self, record: dict) -> None:
        """A coordinator metrics record (e.g. a registration, which ends an acquired worker's rejoin)."""
        ...


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


class FleetSync:
    """Follows the coordinator's activation decisions with provider calls."""

    def __init__(self, provider: FleetProvider, release_after_s: float, since: float = 0.0) -> None:
        """`since`: wall-clock time before which records are not this launcher's to act on (a
        resumed run's metrics begin with the previous run's decisions)."""
        self.provider, self.release_after_s, self.since = provider, release_after_s, since
        self.active: set[str] | None = None  # None until the first decision: nothing to act on
        self.inactive_since: dict[str, float] = {}
        # registered and not gone: only these are released (one still loading is not idle)
        self.joined: set[str] = set()

    def observe(self, record: dict, now: float) -> None:
        """One metrics record; `now` is the caller's monotonic clock."""
        if record.get("role") != "coordinator" or record.get("time", self.since) < self.since:
            return
        if record["kind"] == "worker_registered":
            self.joined.add(record["worker_id"])
        elif record["kind"] in ("worker_left", "worker_lost"):  # gone by itself: not ours to release
            self.joined.discard(record["worker_id"])
        elif record["kind"] == "activation":
            self.on_activation(record["active"], now)
        self.provider.observe(record)

    def on_activation(self, active: list[str], now: float) -> None:
        self.active = set(active)
        for worker_id in self.active:
            self.inactive_since.pop(worker_id, None)
        for worker_id in self.provider.worker_ids() - self.active:
            self.inactive_since.setdefault(worker_id, now)

    def step(self, now: float) -> None:
        if self.active is None:
            return
        released = self.provider.released()
        for worker_id in sorted(self.provider.worker_ids()):
            if worker_id in self.active:
                if worker_id in released:
                    self.provider.acquire(worker_id)
            elif (self.provider.releasable and worker_id not in released and worker_id in self.joined
                  and now - self.inactive_since.get(worker_id, now) >= self.release_after_s):
                self.provider.release(worker_id)

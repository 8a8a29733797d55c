"""The fleet rule: the activation controller's decisions become acquire and release calls on a
`FleetProvider`, the one place that knows how workers' machines are held. The launchers drive it
on the wall clock (launch/local.py, launch/remote_fleet.py) and the simulator on its own clock
(sim/provider.py), so `echo2 sim` releases and acquires exactly as a real run does.

The coordinator decides which workers are active (policy/controller.py) and records each
decision as an `activation` metric event. `FleetSync` follows those decisions: a worker inactive
for `release_after_s` is released (its machine handed back: it bills nothing), and a released
worker the controller chooses again is acquired (started again under the same worker id; it
registers, loads the current weights and trains). The coordinator keeps a released worker's
measured rate, so the controller can still price it and choose it. A release reaches its worker
late (an SSH stop takes seconds): if the controller chose the worker again meanwhile, the
coordinator takes its leave for a departure (it cannot tell that leave from one by hand) and
will not choose it, so `FleetSync` acquires it back once the release is done.

A provider implements the members of `FleetProvider`: `releasable`, `worker_ids()`, `released()`,
`release(id)` (stop or hand back the machine; the worker process must get SIGTERM so it leaves the
coordinator cleanly), `acquire(id)` (boot a machine that starts `echo2 worker` with the same
worker id) and `observe(record)`. The providers are in launch/fleet.py (static, local),
launch/ssh_fleet.py, launch/skypilot.py and sim/provider.py; see the README, "Fleet providers".
"""

from __future__ import annotations

from typing import Protocol


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
        self.leaving: set[str] = set()  # released here, their leave not recorded yet
        # released here, but chosen again before their leave reached the coordinator, which took it
        # for a departure (they are no candidate now): acquired back once their release is done
        self.wanted_back: set[str] = set()

    def observe(self, record: dict, now: float) -> None:
        """One metrics record; `now` is the caller's monotonic clock."""
        if record.get("role") != "coordinator" or record.get("time", self.since) < self.since:
            return
        if record["kind"] == "worker_registered":
            self.on_registered(record["worker_id"], now)
        elif record["kind"] in ("worker_left", "worker_lost"):  # gone by itself: not ours to release
            self.joined.discard(record["worker_id"])
            if record["worker_id"] in self.leaving and record.get("released") is False:
                self.wanted_back.add(record["worker_id"])  # we released it; the coordinator saw a departure
            self.leaving.discard(record["worker_id"])
            self.inactive_since.pop(record["worker_id"], None)  # away is not idle: a return starts afresh
        elif record["kind"] == "activation":
            self.on_activation(record["active"], now)
        self.provider.observe(record)

    def on_registered(self, worker_id: str, now: float) -> None:
        """A worker the last decision left out idles from its registration (one back from a
        preemption, or the coordinator's newcomer whose decision did not choose it, which the
        coordinator records only when the set changes)."""
        self.joined.add(worker_id)
        if self.active is not None and worker_id not in self.active:
            self.inactive_since[worker_id] = now

    def on_activation(self, active: list[str], now: float) -> None:
        """Start the idle clock of each held worker left out; a released one has none, so one its
        provider takes back by itself (a spare in a lost machine's place) starts idle from zero."""
        self.active = set(active)
        for worker_id in self.active:
            self.inactive_since.pop(worker_id, None)
        for worker_id in self.provider.worker_ids() - self.active - self.provider.released():
            self.inactive_since.setdefault(worker_id, now)

    def step(self, now: float) -> None:
        if self.active is None:
            return
        released = self.provider.released()
        for worker_id in sorted(self.provider.worker_ids()):
            if worker_id in self.active or worker_id in self.wanted_back:
                if worker_id in released:
                    self.provider.acquire(worker_id)  # a no-op while its release is under way
            elif self._releasable(worker_id, released) and now >= self._release_at(worker_id, now):
                self.inactive_since.pop(worker_id, None)
                self.leaving.add(worker_id)
                self.provider.release(worker_id)
        self.wanted_back &= self.provider.released()  # acquired: the decisions rule it again

    def release_due_s(self) -> float | None:
        """The earliest time at which `step` would release a worker if no record came first
        (None: none would be). A caller with its own clock (the simulator) steps exactly then; a
        launcher steps on every tick and needs no schedule."""
        if self.active is None:
            return None
        released = self.provider.released()
        due = [self.inactive_since[w] + self.release_after_s for w in self.provider.worker_ids() - self.active
               if w in self.inactive_since and self._releasable(w, released)]
        return min(due, default=None)

    def _releasable(self, worker_id: str, released: set[str]) -> bool:
        """Held, registered (one still loading is not idle) and with a provider that can let go."""
        return self.provider.releasable and worker_id not in released and worker_id in self.joined

    def _release_at(self, worker_id: str, now: float) -> float:
        # compared as a deadline, not as `now - since >= delay`: a clock that steps exactly at the
        # deadline (the simulator's) must release then, whatever the rounding of the subtraction
        return self.inactive_since.get(worker_id, now) + self.release_after_s

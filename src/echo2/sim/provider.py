"""The simulated fleet provider: a `FleetProvider` (policy/fleet_sync.py) over the simulated
machines, so the simulator follows the activation controller's decisions with the same
`FleetSync` a real launcher runs, on the simulated clock.

What each call means here, with the per-class figures of the scenario's [workers.NAME]:
- acquire: the machine bills from now and registers after its class's `boot_s` (sim/fleet.py);
- release: it stops, leaves the coordinator cleanly and bills nothing from now on;
- preemption (its class's `mean_uptime_s`, scaled by `sim.preemption_scale`): the machine is lost
  and stops billing; the provider replaces an active one with a spare of its class that is up.

A lost machine is neither held nor released: as in the real providers, a worker gone by itself
is not FleetSync's to act on. Without a spare it stays rented and, once its machine is back
(`mean_downtime_s`), boots and registers again. Every provider but "static" is releasable
([activation] provider: "local", "ssh" and "skypilot" behave alike here).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: the simulator hands the provider its fleet
    from echo2.sim.fleet import Fleet, SimWorker


class SimProvider:
    def __init__(self, fleet: Fleet, *, releasable: bool, not_started: set[str] = frozenset()) -> None:
        """`not_started`: workers offered to the run and not acquired yet; they count as released
        (billing nothing) until the controller chooses them, as in the real providers."""
        self.fleet, self.releasable = fleet, releasable
        self.by_id = {w.id: w for w in fleet.workers}
        self.released_ids: set[str] = set(not_started)
        self.acquires = 0
        self.releases = 0
        self.replaced = 0
        """Lost active machines replaced by a spare of their class (the provider's own move)."""

    def worker_ids(self) -> set[str]:
        return {w.id for w in self.fleet.workers if w.rented} | self.released_ids

    def released(self) -> set[str]:
        return set(self.released_ids)

    def release(self, worker_id: str) -> None:
        self.released_ids.add(worker_id)
        self.releases += 1
        self.fleet.rent(self.by_id[worker_id], False)

    def acquire(self, worker_id: str) -> None:
        self.released_ids.discard(worker_id)
        self.acquires += 1
        self.fleet.rent(self.by_id[worker_id], True)  # bills from now, registers once booted

    def observe(self, record: dict) -> None:
        pass  # the simulated machines need no record to know they have booted

    def rent_initial(self, counts: dict[str, int]) -> None:
        """Rent the first `counts[class]` workers of each class (they come up at their start delay)."""
        left = dict(counts)
        for w in self.fleet.workers:
            if left.get(w.cls, 0) > 0:
                left[w.cls] -= 1
                self.fleet.rent(w, True)

    def replace(self, lost: SimWorker) -> bool:
        """A rented machine was preempted: if it was active, rent a spare of its class that is up
        in its place (False: none, and the lost one stays rented to come back)."""
        spare = None if not lost.active else next(  # an idle worker lost is no capacity lost
            (s for s in self.fleet.workers if s.cls == lost.cls and s.alive and not s.rented), None)
        if spare is None:
            return False
        self.replaced += 1
        self.fleet.rent(lost, False)  # its machine is gone for good: the bill stopped at the preemption
        self.released_ids.discard(spare.id)  # an offered spare is taken, not released any more
        self.fleet.rent(spare, True)
        return True

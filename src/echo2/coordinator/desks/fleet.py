"""What the coordinator does for the fleet as a whole, between requests and on their behalf:
the sweep that expires silent workers (once a second: a pass over every worker) and overdue
leases, excusing the coordinator's own stalls, handing a worker's leases back, and deciding
activation (at every control period, when a worker is lost, and soon after newcomers join).
Every method applies a whole change; events go to the shared list."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from echo2.coordinator.parts import Parts
from echo2.coordinator.parts.leases import Lease
from echo2.coordinator.records import events as ev

if TYPE_CHECKING:
    from echo2.coordinator.desks.evaluation import EvaluationDesk


TRIGGERS_NAMED = 5
WORKERS_SWEPT_EVERY_S = 1.0
"""Silence is looked for once a second: a timeout is many seconds, and a pass over 10,000
workers four times a second would cost more than their heartbeats."""


class FleetDesk:
    def __init__(self, state: Parts, *, evaluation: EvaluationDesk | None) -> None:
        self.cfg = state.cfg
        self.registry, self.leases_book, self.groups = state.registry, state.leases_book, state.groups
        self.versions, self.controller, self.evaluation = state.versions, state.controller, evaluation
        self.store, self.counters, self.events, self.clock = state.store, state.counters, state.events, state.clock
        self.control_due = False
        """A decision is due (a newcomer waits for one, a worker left): the next sweep makes it,
        one for however many joined or left meanwhile."""
        self.triggers: list[str] = []
        """What made it due (the first TRIGGERS_NAMED), for its record."""
        self.swept_workers_at = -math.inf

    def release_leases(self, worker_id: str, reason: ev.RequeueReason) -> int:
        mine = self.leases_book.held_by(worker_id)
        self.requeue(mine, reason)
        return len(mine)

    def requeue(self, leases: list[Lease], reason: ev.RequeueReason) -> None:
        if not leases:  # most workers leave holding none: no transaction for nothing (a fleet leaving at once)
            return
        with self.store.tx():
            self.leases_book.requeue(leases)
            self.counters.leases_expired += len(leases)
            self.counters.save(self.store)
        self.events += [ev.LeaseRequeued(worker_id=lease.worker_id, reason=reason, prompt_index=lease.prompt_index)
                        for lease in leases]

    def excuse_stall(self, stall_s: float) -> None:
        """The coordinator's event loop was blocked for `stall_s`: the heartbeats sent meanwhile
        are still unread, so no worker is silent for that time."""
        excused = self.registry.excuse(stall_s)
        self.events.append(ev.CoordinatorStalled(stall_s=round(stall_s, 3), workers_excused=excused))

    def sweep(self) -> None:
        """Expire leases held too long and, once a second (a pass over every worker), silent
        workers (all their leases go back); decide activation for newcomers."""
        now = self.clock()
        if now - self.swept_workers_at >= WORKERS_SWEPT_EVERY_S:
            self.swept_workers_at = now
            self._sweep_workers(now)
        overdue = self.leases_book.overdue(now)
        if overdue:
            self.requeue(overdue, reason="lease_timeout")
        if self.control_due:
            triggers, more = self.triggers[:TRIGGERS_NAMED], len(self.triggers) - TRIGGERS_NAMED
            self.control_due, self.triggers = False, []
            self.control(trigger=", ".join(triggers) + (f" and {more} more" if more > 0 else ""))

    def control_soon(self, trigger: str = "") -> None:
        """Decide at the next sweep (at most a sweep away), with `trigger` in its record: a fleet
        leaving at once costs one decision, not one each."""
        self.control_due = True
        if trigger and len(self.triggers) <= TRIGGERS_NAMED:
            self.triggers.append(trigger)
        elif trigger:
            self.triggers.append("")  # counted, not named

    def _sweep_workers(self, now: float) -> None:
        lost = self.registry.silent(now)
        for worker_id in lost:
            self.controller.vanish(worker_id)
            self.counters.workers_lost += 1
            released = self.release_leases(worker_id, reason="worker_timeout")
            self.events.append(ev.WorkerLost(worker_id=worker_id, leases_requeued=released))
        if lost:  # a preempted worker: re-plan now, not at the next control period
            self.control(trigger=f"lost {', '.join(lost)}")
        if self.evaluation is not None:
            self.evaluation.sweep(self.registry.alive_versions(), self.cfg.coordinator.lease_timeout_s, now)
        horizon_s = self.cfg.coordinator.forget_workers_after_s
        for worker_id in self.registry.forget(now, horizon_s, self.controller.costless):
            self.controller.forget(worker_id)
            self.groups.trust.forget(worker_id)
            self.versions.dissemination.forget(worker_id)

    def control(self, trigger: str = "") -> None:
        """Re-decide which workers are active; record the decision when the set changes, or
        always when something happened (`trigger`, e.g. a worker vanished)."""
        decision = self.controller.decide(self.clock())
        self.groups.set_window_floor(self.controller.s_min())
        if decision.changed or trigger:
            self.events.append(ev.Activation(
                active=sorted(decision.active), reason=decision.reason, trigger=trigger, changed=decision.changed,
                required_rps=decision.required_rps if decision.required_rps != float("inf") else None,
                estimates_rps=decision.estimates,
            ))

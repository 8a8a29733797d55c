"""Which workers are rented and which are active.

Mode "plan" runs what `echo2 run` runs. The fleet `echo2 plan` provisions (`make_plan`) is
rented at the start. From then on the coordinator's own `ActivationController`
(policy/controller.py) decides which rented workers are active, fed the observations the
coordinator gets:
- each worker's lease-holding time and rollouts;
- whether its groups were admitted or dropped as stale;
- its swap and publish-to-loaded latency;
- the learner's step time.

The controller's rules are not written again here. It keeps workers on probation until they are
measured, sizes sets with headroom, keeps the current set inside the hysteresis band, scales
down only after `scale_down_after_s`, and falls back to running everything.

The fleet provider follows the decisions, as `launch/fleet.py`'s FleetSync does:
- an inactive worker stays rented, keeps its weights current and bills as idle;
- with a releasable provider, a worker inactive for `release_after_s` is released;
- a released worker the controller chooses again is acquired, and downloads the current version
  again before it can work.
A preempted active machine is replaced by the provider with a spare of its class that is up (the
replacement registers, downloads the current version, and is on probation until measured), and
the controller re-decides at once. With no spare, the preempted worker stays rented and
registers again when its machine comes back. This is what the planner's availability term
assumes (planner/tail.py), in every mode.

Mode "online" offers every worker of the scenario to the same controller, with the scenario as
its activation catalog (each worker declares its class: `policy.planned` decides with the
planner's model, the catalog's figures as the prior and what the run measures in their place).
With a releasable provider nothing is rented at the start: the first decision, at time 0,
acquires a covering set and the rest stay unacquired until chosen. With a static provider every
machine runs already (as under `echo2 run`'s static provider): all are rented, and
those not chosen idle and bill.

Modes "all" (every worker) and "fixed" (given counts per class, e.g. for sweeps and for checking
the planner's fleet) rent their workers for the whole run, all active, with no controller.
"""

from __future__ import annotations

from echo2.config.sim import ScenarioConfig
from echo2.planner import make_plan
from echo2.policy.controller import ActivationController
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, Generation, SimWorker


def initial_counts(scenario: ScenarioConfig) -> tuple[dict[str, int], dict]:
    """Workers to rent per class at start, and the plan behind them (JSON-ready). Online, none:
    the controller's first decision acquires what it chooses among the offered."""
    if scenario.sim.activation == "online" and scenario.activation.provider != "static":
        return {}, {}
    if scenario.sim.activation in ("all", "online"):  # a static provider's machines all run already
        return {name: cls.count for name, cls in scenario.workers.items()}, {}
    plan = make_plan(scenario.plan_config())
    return {c.name: c.chosen for c in plan.classes if c.chosen}, plan.to_dict()


def worker_id(w: SimWorker) -> str:
    return w.id


class Controller:
    def __init__(self, scenario: ScenarioConfig, fleet: Fleet, loop: EventLoop, mode: str) -> None:
        self.scenario, self.fleet, self.loop, self.mode = scenario, fleet, loop, mode
        settings = scenario.activation
        self.core: ActivationController | None = None
        self.releasable = settings.provider != "static"
        self.release_after_s = settings.release_after_s
        self.inactive_since: dict[SimWorker, float] = {}
        self.decision_pending = False
        self.decisions = 0
        self.switches = 0
        self.released = 0
        self.acquired = 0
        self.replaced = 0
        fleet.on_preempted = self.on_preempted
        if mode in ("plan", "online"):
            work = scenario.workload
            catalog = scenario.plan_config() if mode == "online" else None
            self.core = ActivationController(settings, batch_rollouts=work.batch_rollouts,
                                             max_staleness=work.max_staleness,
                                             learner_price_per_hour=scenario.learner.price_per_hour, now=0.0,
                                             catalog=catalog, max_masked_fraction=work.max_masked_fraction)
            fleet.on_registered, fleet.on_left = self._registered, self._left
            fleet.on_finished, fleet.on_loaded = self._finished, self._loaded
            if mode == "online" and self.releasable:  # all offered with their class; the first decision rents
                for w in fleet.workers:
                    self.core.offer(worker_id(w), w.price_per_hour, w.cls)
                # after the machines that are up at the start have joined: each one it chooses is
                # acquired then, and boots (boot_s) before it registers
                loop.after(0.0, loop.after, 0.0, self.decide)
            loop.after(settings.control_period_s, self._periodic)

    def rent_initial(self, counts: dict[str, int]) -> None:
        """Rent the first `counts[class]` workers of each class (they come up at their start delay)."""
        left = dict(counts)
        for w in self.fleet.workers:
            if left.get(w.cls, 0) > 0:
                left[w.cls] -= 1
                self.fleet.rent(w, True)

    # ---- what the coordinator observes ----
    def _registered(self, w: SimWorker) -> None:
        assert self.core is not None
        self.core.join(worker_id(w), w.price_per_hour, w.cls)  # a returning worker keeps its measurements
        self.fleet.set_active(w, True)  # on probation, or active until the next decision

    def _left(self, w: SimWorker, released: bool) -> None:
        assert self.core is not None
        (self.core.release if released else self.core.vanish)(worker_id(w))
        self.inactive_since.pop(w, None)

    def _finished(self, w: SimWorker, g: Generation, dropped: int) -> None:
        assert self.core is not None
        wid = worker_id(w)
        self.core.observe_busy(wid, w.rollouts, self._busy_s(w), self.fleet.stale_s_total(w))
        self.core.observe_latencies(wid, None, self.loop.now_s - g.started_s)
        if self.fleet.segment_s is not None:  # as the coordinator measures it of each lease
            self.core.observe_segment(self.fleet.segment_s)
        for i in range(g.groups):
            self.core.observe_outcome(wid, admitted=i >= dropped)

    def _busy_s(self, w: SimWorker) -> float:
        return w.busy_s + (self.loop.now_s - w.busy_since_s if w.busy_since_s is not None else 0.0)

    def _loaded(self, w: SimWorker, latency_s: float) -> None:
        assert self.core is not None
        self.core.observe_swap(w.load_s)
        self.core.observe_latencies(worker_id(w), latency_s, None)

    def observe_step_time(self, step_time_s: float) -> None:
        if self.core is not None:
            self.core.observe_step_time(step_time_s)

    # ---- decisions ----
    def on_preempted(self, w: SimWorker) -> None:
        """A rented worker went away: replace it with a spare of its class that is up, if any,
        and decide now (once for a burst at the same instant)."""
        spare = None if not w.active else next(  # an idle worker lost is no capacity lost
            (s for s in self.fleet.workers if s.cls == w.cls and s.alive and not s.rented), None)
        if spare is not None:
            self.replaced += 1
            self.fleet.rent(w, False)  # its machine is gone for good: the bill stopped at the preemption
            self.fleet.rent(spare, True)
        if self.core is not None and not self.decision_pending:
            self.decision_pending = True
            self.loop.after(0.0, self.decide)

    def _periodic(self) -> None:
        self.decide()
        assert self.core is not None
        if any(w.rented for w in self.fleet.workers) or any(self.core.is_released(worker_id(w))
                                                             for w in self.fleet.workers):
            self.loop.after(self.scenario.activation.control_period_s, self._periodic)
        # else nobody is rented or can be acquired again: no decision can change anything, and
        # a periodic event would keep a starved run going until max_sim_s

    def decide(self) -> None:
        """The coordinator's decision, applied: activate and deactivate rented workers, acquire
        released ones chosen again, and start the release clock of the newly inactive."""
        assert self.core is not None
        self.decision_pending = False
        now = self.loop.now_s
        for w in self.fleet.workers:  # a worker too stale to lease submits nothing: its heartbeats tell
            if w.rented and w.alive and w.stale_since_s is not None:
                self.core.observe_busy(worker_id(w), w.rollouts, self._busy_s(w), self.fleet.stale_s_total(w))
        counters = self.fleet.data.counters  # the coordinator measures d the same way
        self.core.observe_uninformative(counters.dropped_uninformative, counters.scored)
        decision = self.core.decide(now)
        self.fleet.data.core.window.set_floor(self.core.s_min())  # as the coordinator does
        self.decisions += 1
        self.switches += decision.changed
        for w in self.fleet.workers:
            wid = worker_id(w)
            chosen = wid in decision.active
            if chosen and not w.rented and self.core.is_released(wid):
                self.acquired += 1
                self.fleet.rent(w, True)  # registers when up, and downloads the current version
            elif w.rented and w.alive:
                self.fleet.set_active(w, chosen)
                if chosen:
                    self.inactive_since.pop(w, None)
                elif w not in self.inactive_since:
                    self.inactive_since[w] = now
                    if self.releasable:
                        self.loop.after(self.release_after_s, self._release_if_idle, w, now)

    def _release_if_idle(self, w: SimWorker, inactive_since_s: float) -> None:
        """Hand the machine back if it stayed inactive since then (FleetSync's rule)."""
        if self.inactive_since.get(w) == inactive_since_s and w.rented and w.alive and not w.active:
            self.inactive_since.pop(w)
            self.released += 1
            self.fleet.rent(w, False)

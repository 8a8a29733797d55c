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

The fleet provider follows the decisions by the launchers' own rule: the simulator records each
decision, registration and departure as the coordinator does, and feeds the records to the same
`FleetSync` (policy/fleet_sync.py) a real launcher runs, over a simulated provider
(sim/provider.py), on the simulated clock:
- an inactive worker stays rented, keeps its weights current and bills as idle;
- with a releasable provider, a registered worker inactive for `release_after_s` is released;
- a released worker the controller chooses again is acquired: it bills from the acquire, boots
  for its class's `boot_s`, registers and downloads the current version before it can work.
A preempted active machine is replaced by the provider with a spare of its class that is up (the
replacement registers, downloads the current version, and is on probation until measured), and
the controller re-decides at once. With no spare, the preempted worker stays rented and
registers again when its machine comes back. This is what the planner's availability term
assumes (planner/tail.py), in every mode.

Mode "online" offers every worker of the scenario to the same controller, with the scenario as
its activation catalog (each worker declares its class: `policy.planned` decides with the
planner's model, the catalog's figures as the prior and what the run measures in their place),
or with none (`sim.online_pricing = "measured"`: each worker priced by its measured rate alone).
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
from echo2.policy.credit import MIN_PASSED_AUDITS
from echo2.policy.fleet_sync import FleetSync
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, Generation, SimWorker
from echo2.sim.provider import SimProvider


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
        releasable = settings.provider != "static"
        offered = mode == "online" and releasable  # all offered with their class; the first decision rents
        self.provider = SimProvider(fleet, releasable=releasable,
                                    not_started={worker_id(w) for w in fleet.workers} if offered else set())
        self.sync = FleetSync(self.provider, settings.release_after_s)
        self.sync_due_s: float | None = None
        """When the next FleetSync step is scheduled (a release comes due then)."""
        self.decision_pending = False
        self.decisions = 0
        self.switches = 0
        fleet.on_preempted = self.on_preempted
        if mode in ("plan", "online"):
            work = scenario.workload
            by_catalog = mode == "online" and scenario.sim.online_pricing == "catalog"
            catalog = scenario.plan_config() if by_catalog else None
            audited = scenario.sim.audit_share > 0
            self.core = ActivationController(settings, batch_rollouts=work.batch_rollouts,
                                             max_staleness=work.max_staleness,
                                             learner_price_per_hour=scenario.learner.price_per_hour, now=0.0,
                                             catalog=catalog, max_masked_fraction=work.max_masked_fraction,
                                             groups_per_step=work.prompts_per_step,
                                             min_passed_audits=MIN_PASSED_AUDITS if audited else 0)
            if audited:  # the coordinator's audit wiring: a rate counts once its groups pass
                fleet.data.on_buffered = self.core.observe_buffered
                fleet.data.on_audited = self._audited
            fleet.on_registered, fleet.on_left = self._registered, self._left
            fleet.on_finished, fleet.on_loaded = self._finished, self._loaded
            if offered:
                for w in fleet.workers:
                    self.core.offer(worker_id(w), w.price_per_hour, w.cls)
                # after the machines that are up at the start have joined: each one it chooses is
                # acquired then, and boots (boot_s) before it registers
                loop.after(0.0, loop.after, 0.0, self.decide)
            loop.after(settings.control_period_s, self._periodic)

    def rent_initial(self, counts: dict[str, int]) -> None:
        self.provider.rent_initial(counts)

    # ---- what the coordinator observes, and records for the fleet provider ----
    def _registered(self, w: SimWorker) -> None:
        assert self.core is not None
        self.core.join(worker_id(w), w.price_per_hour, w.cls)  # a returning worker keeps its measurements
        self.fleet.set_active(w, True)  # on probation, or active until the next decision
        self._record("worker_registered", worker_id=worker_id(w))

    def _audited(self, worker: str, passed: int, newest_seq: int) -> None:
        assert self.core is not None
        self.core.observe_audit(worker, audited=passed, failed=0, newest_passed_seq=newest_seq)

    def _left(self, w: SimWorker, released: bool) -> None:
        assert self.core is not None
        (self.core.release if released else self.core.vanish)(worker_id(w))
        if released:
            self._record("worker_left", worker_id=worker_id(w), released=True)
        else:
            self._record("worker_lost", worker_id=worker_id(w))

    def _record(self, kind: str, **values) -> None:
        """A coordinator metrics record, as FleetSync reads it from a real run's metrics."""
        now = self.loop.now_s
        self.sync.observe({"role": "coordinator", "kind": kind, "time": now, **values}, now)
        self._schedule_sync()

    def _schedule_sync(self) -> None:
        """Step FleetSync when its next release comes due (a launcher steps on every tick)."""
        due_s = self.sync.release_due_s()
        if due_s is not None and (self.sync_due_s is None or due_s < self.sync_due_s):
            self.sync_due_s = due_s
            self.loop.at(max(due_s, self.loop.now_s), self._sync_step)

    def _sync_step(self) -> None:
        self.sync_due_s = None  # an earlier step than planned may have come first: harmless
        self.sync.step(self.loop.now_s)
        self._schedule_sync()

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
        """A rented worker went away: the provider replaces it with a spare of its class that is
        up, if any, and the controller decides now (once for a burst at the same instant)."""
        self.provider.replace(w)
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
        """The coordinator's decision: rented workers are told whether they are active, and the
        decision goes to FleetSync, which acquires released workers chosen again at once and
        releases the inactive when their time comes."""
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
            if w.rented and w.alive:
                self.fleet.set_active(w, worker_id(w) in decision.active)
        # every decision is recorded, not only changes as the coordinator does: here a returning
        # worker runs until the next decision (the coordinator holds it back until one), so an
        # unchanged set can still be news to FleetSync
        self._record("activation", active=sorted(decision.active))
        self.sync.step(now)

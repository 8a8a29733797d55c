"""Which workers are rented: the activation policy, the same functions the planner and the
coordinator's controller use (`echo2.planner`: `make_plan` for the first fleet; then
`cheapest_fleet`, built on `activate`, over the workers that are up, and `keep_or_switch` with
hysteresis to decide whether to move to it).

Re-decisions happen when a rented worker is preempted (the fleet may now fall short) and every
control period (a cheaper set may have become available). Proposals come from the planner's
fleet-size search, because dissemination latency grows with the fleet: an activation solved at
one size can be inadmissible at the size it produces, and a controller that ignores this flips
between two fleets forever.

Modes: "plan" (cost-aware, as above), "all" (every worker, whole run) and "fixed" (given counts
per class, e.g. for sweeps). In "all" and "fixed" a preempted worker is rented again when it
comes back; in "plan" it is released and the controller decides.
"""

from __future__ import annotations

from collections import Counter

from echo2.config.sim import ScenarioConfig
from echo2.planner import Activation, Offer, base_throughput_rps, keep_or_switch, make_plan
from echo2.planner.plan import cheapest_fleet, class_plans
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet


def initial_counts(scenario: ScenarioConfig) -> tuple[dict[str, int], dict]:
    """Workers to rent per class at start, and the plan behind them (JSON-ready)."""
    if scenario.sim.activation == "all":
        return {name: cls.count for name, cls in scenario.workers.items()}, {}
    plan = make_plan(scenario.plan_config())
    return {c.name: c.chosen for c in plan.classes if c.chosen}, plan.to_dict()


class Controller:
    def __init__(self, scenario: ScenarioConfig, fleet: Fleet, loop: EventLoop, mode: str) -> None:
        self.scenario, self.fleet, self.loop, self.mode = scenario, fleet, loop, mode
        self.plan_config = scenario.plan_config()
        self.required_rps = base_throughput_rps(scenario.workload.batch_rollouts, scenario.workload.step_time_s)
        self.margin = scenario.sim.hysteresis_margin
        self.period_s = scenario.sim.control_period_s
        self.decision_pending = False
        self._proposals: dict[tuple, Activation | None] = {}  # cheapest fleet per set of workers up
        self.decisions = 0
        self.switches = 0
        if mode == "plan":
            fleet.release_on_preempt = True  # a preempted spot machine is gone; we decide anew
            loop.after(self.period_s, self._periodic)

    def rent_initial(self, counts: dict[str, int]) -> None:
        """Rent the first `counts[class]` workers of each class (they come up at their start delay)."""
        left = dict(counts)
        for w in self.fleet.workers:
            if left.get(w.cls, 0) > 0:
                left[w.cls] -= 1
                self.fleet.rent(w, True)

    def on_preempted(self) -> None:
        """A rented worker went away: decide now (once for a burst at the same instant)."""
        if self.mode == "plan" and not self.decision_pending:
            self.decision_pending = True
            self.loop.after(0.0, self.decide)

    def _periodic(self) -> None:
        self.decide()
        self.loop.after(self.period_s, self._periodic)

    def decide(self) -> None:
        """The planner's cheapest fleet over what is up now; keep the current set unless it
        falls short or the proposal is cheaper by more than the hysteresis margin."""
        self.decision_pending = False
        self.decisions += 1
        current, up = self.counts(rented=True), self.counts(rented=None)
        proposal = self._cheapest(up)
        if proposal is None:
            return  # nothing up can feed the learner: keep what runs
        offers = [  # the current set's admissible rates at its own size
            Offer(c.name, c.price_per_hour, c.admissible_rps, up.get(c.name, 0), relay=c.reachable)
            for c in class_plans(self.plan_config, max(1, sum(current.values())))
        ]
        decision = keep_or_switch(current, proposal, offers, self.required_rps, self.margin)
        if decision.switched:
            self.switches += 1
            self.apply(proposal.counts)

    def _cheapest(self, up: dict[str, int]) -> Activation | None:
        """The planner's cheapest fleet among the workers up (an integer program per fleet-size
        cap, so it is remembered: churn keeps revisiting the same availability)."""
        key = tuple(sorted(up.items()))
        if key not in self._proposals:
            workers = {
                name: w.model_copy(update={"count": up.get(name, 0)})
                for name, w in self.plan_config.workers.items()
            }
            self._proposals[key] = cheapest_fleet(self.plan_config.model_copy(update={"workers": workers}))
        return self._proposals[key]

    def counts(self, rented: bool | None) -> dict[str, int]:
        """Live workers per class: rented ones (True) or all that are up (None)."""
        return dict(Counter(w.cls for w in self.fleet.workers if w.alive and (rented is None or w.rented)))

    def apply(self, counts: dict[str, int]) -> None:
        """Reach `counts` live rented workers per class: keep rented ones first (no needless
        re-download), then rent the lowest-index idle ones; release the surplus."""
        live = [w for w in self.fleet.workers if w.alive]
        wanted = dict(counts)
        keep = set()
        for w in sorted(live, key=lambda w: (not w.rented, w.index)):
            if wanted.get(w.cls, 0) > 0:
                wanted[w.cls] -= 1
                keep.add(w)
        for w in live:
            self.fleet.rent(w, w in keep)

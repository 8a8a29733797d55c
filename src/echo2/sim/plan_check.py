"""The planner checked against the simulator: for a scenario and a staleness bound, what `echo2
plan` predicts for the fleet it provisions next to what `echo2 sim` measures when it rents that
fleet: rented for the whole run ("fixed": what the planner's prediction is about), and with the
coordinator's activation controller deciding online which of those workers run (mode "plan",
what `echo2 run` does), so the table also shows what the controller's savings cost in
utilization.

The planner predicts steady state; the simulated run also pays the first version's download and
generation before step 0, so both the whole-run and the steady utilization (first step's wait
left out) are reported, and the agreement is judged on the steady one.
"""

from __future__ import annotations

from echo2.config.sim import ScenarioConfig
from echo2.planner.fleet import with_staleness
from echo2.planner.plan import make_plan
from echo2.sim.simulator import simulate


def with_plan_staleness(scenario: ScenarioConfig, staleness: int) -> ScenarioConfig:
    return scenario.model_copy(update={"workload": with_staleness(scenario.plan_config(), staleness).workload})


def plan_vs_sim(scenario: ScenarioConfig, staleness: int | None = None) -> dict:
    """One row: planner-predicted and simulated utilization, their difference in points, the
    workers provisioned, and rollouts/s needed (B/T_train) against generated and trained."""
    if staleness is not None:
        scenario = with_plan_staleness(scenario, staleness)
    # the planner sizes an established fleet: a new worker's slow start (policy/trust.py) is a
    # ramp it does not model, so the simulator leaves it out here too
    scenario = scenario.model_copy(update={"sim": scenario.sim.model_copy(update={"slow_start": False})})
    plan = make_plan(scenario.plan_config())
    row = {
        "scenario": scenario.name,
        "staleness": scenario.workload.max_staleness,
        "feasible": plan.feasible,
        "planner_utilization": round(plan.utilization, 4),
        "workers": plan.n_workers,
        "chosen": {c.name: c.chosen for c in plan.classes if c.chosen},
        "planner_s_min": plan.s_min,
        "needed_rps": round(plan.base_rps, 3),
        "planner_admissible_rps": round(plan.admissible_rps, 3),
        "planner_gross_rps": round(plan.rollouts_per_s, 3),
    }
    if plan.n_workers == 0:
        return row  # nothing admissible to rent: the simulator would only wait for its horizon
    result = simulate(scenario, fleet_counts=row["chosen"])
    online = simulate(scenario.model_copy(update={"sim": scenario.sim.model_copy(update={"activation": "plan"})}))
    return row | {
        "steps": result.steps_done,
        "sim_utilization": round(result.utilization, 4),
        "sim_utilization_steady": round(result.utilization_steady, 4),
        "difference_points": round(100 * (result.utilization_steady - plan.utilization), 2),
        "difference_points_whole_run": round(100 * (result.utilization - plan.utilization), 2),
        "sim_generated_rps": round(result.rollouts_per_s, 3),
        "sim_trained_rps": round(result.trained_rollouts_per_s, 3),
        "sim_dropped_stale_groups": result.groups["dropped_stale"],
        "sim_preemptions": result.preemptions,
        "controller_utilization_steady": round(online.utilization_steady, 4),
        "controller_cost_per_step": round(online.cost_per_step, 4),
        "fixed_cost_per_step": round(result.cost_per_step, 4),
        "controller_fleet_time_h": {k: round(v, 2) for k, v in online.fleet_time_h.items()},
        "controller_switches": online.controller_switches,
    }

"""The three questions `echo2 sim` answers beyond its main run, each as JSON-ready data:

(a) dissemination latency versus number of workers, per topology, under a limited learner
    uplink: the simulated broadcast next to the planner's closed form;
(b) learner utilization versus S and worker bandwidth for a fixed fleet (the main run's),
    next to the planner's prediction;
(c) cost and wall time of the main run's steps, echo2 versus the centralized baseline.
"""

from __future__ import annotations

from echo2.config.sim import ScenarioConfig
from echo2.planner import dissemination as closed_form
from echo2.planner.plan import assemble
from echo2.sim.broadcast import Network, simulate_round
from echo2.sim.result import SimResult
from echo2.sim.simulator import simulate


def dissemination_vs_workers(scenario: ScenarioConfig) -> dict:
    """Publish until the last of N workers has loaded the version (T_dis), every topology."""
    sweep, net, work = scenario.sweep, scenario.broadcast, scenario.workload
    uplink_bps = sweep.learner_uplink_bps or scenario.learner.uplink_bps
    worker_bps = sweep.worker_bandwidth_bps
    out: dict = {
        "worker_counts": list(sweep.worker_counts),
        "learner_uplink_bps": uplink_bps,
        "worker_bandwidth_bps": worker_bps,
        "snapshot_bytes": scenario.workload.snapshot_bytes,
        "load_time_s": work.load_time_s,
        "topologies": {},
    }
    for topology in closed_form.TOPOLOGIES:
        network = Network(
            topology, scenario.workload.snapshot_bytes, uplink_bps, net.chunk_bytes, net.fanout, net.hop_latency_s
        )
        simulated = [
            simulate_round(network, [worker_bps] * n).last_s + work.load_time_s for n in sweep.worker_counts
        ]
        formula = [
            closed_form.dissemination_s(
                topology,
                scenario.workload.snapshot_bytes,
                n,
                learner_bytes_per_s=closed_form.bytes_per_s(uplink_bps),
                worker_bytes_per_s=closed_form.bytes_per_s(worker_bps),
                chunk_bytes=net.chunk_bytes,
                fanout=net.fanout,
                hop_latency_s=net.hop_latency_s,
            )
            + work.load_time_s
            for n in sweep.worker_counts
        ]
        out["topologies"][topology] = {"simulated_s": simulated, "closed_form_s": formula}
    return out


def with_network(
    scenario: ScenarioConfig, bandwidth_bps: float, staleness: int, steps: int
) -> ScenarioConfig:
    """The scenario with every worker class at `bandwidth_bps`, S = `staleness`, `steps` steps."""
    data = scenario.model_dump()
    for cls in data["workers"].values():
        cls["bandwidth_bps"] = bandwidth_bps
    data["workload"]["max_staleness"] = staleness
    data["sim"]["steps"] = steps
    return ScenarioConfig.model_validate(data)


def utilization_grid(scenario: ScenarioConfig, fleet_counts: dict[str, int]) -> dict:
    """Steady learner utilization of `fleet_counts` for every (bandwidth, S) of the sweep."""
    sweep = scenario.sweep
    grid: dict = {
        "staleness": list(sweep.staleness),
        "fleet": dict(fleet_counts),
        "steps": sweep.steps,
        "by_bandwidth": {},
    }
    for bandwidth_bps in sweep.bandwidths_bps:
        simulated, predicted = [], []
        for staleness in sweep.staleness:
            variant = with_network(scenario, bandwidth_bps, staleness, sweep.steps)
            run = simulate(variant, fleet_counts)
            simulated.append(run.utilization_steady if run.steps_done > 1 else run.utilization)
            plan = assemble(variant.plan_config(), fleet_counts, method="fixed", gap=0.0, reasons=(),
                            fixes=(), warnings=())
            predicted.append(plan.utilization)
        grid["by_bandwidth"][str(bandwidth_bps)] = {"simulated": simulated, "planner": predicted}
    return grid


def cost_comparison(result: SimResult) -> dict:
    """The main run against the centralized baseline at the same number of steps."""
    out = {
        "steps": result.steps_done,
        "echo2": {
            "wall_s": result.wall_s,
            "learner_cost": result.learner_cost,
            "fleet_cost": result.fleet_cost,
            "total_cost": result.total_cost,
        },
        "centralized": None,
        "saving_fraction": result.saving_fraction,
        "planner_saving_fraction": result.plan.get("saving_fraction"),
    }
    if result.baseline is not None:
        out["centralized"] = {
            "wall_s": result.baseline.wall_s,
            "total_cost": result.baseline.cost,
            "step_s": result.baseline.step_s,
        }
    return out

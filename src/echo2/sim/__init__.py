"""echo2.sim: a discrete-event simulator of the whole system (learner, heterogeneous spot
workers with churn, weight broadcast topologies, the coordinator's staleness admission and the
planner's activation policy) for deployments one machine cannot run.

    from echo2.sim import load_scenario, simulate, analyze
    result = simulate(load_scenario("configs/sim/qwen3_8b.toml", ["sim.steps=100"]))
    result.utilization, result.total_cost, result.saving_fraction

The data plane is the coordinator's own object (`echo2.policy.DataPlane`) and the activation
policy comes from `echo2.planner`, never copied. No torch: importable anywhere.
"""

from echo2.config.sim import ScenarioConfig, load_scenario
from echo2.sim.analysis import Analysis, analyze, write_outputs
from echo2.sim.broadcast import Network, Round, simulate_round
from echo2.sim.result import SimResult
from echo2.sim.simulator import Simulator, simulate
from echo2.sim.sweeps import cost_comparison, dissemination_vs_workers, utilization_grid

__all__ = [
    "Analysis",
    "Network",
    "Round",
    "ScenarioConfig",
    "SimResult",
    "Simulator",
    "analyze",
    "cost_comparison",
    "dissemination_vs_workers",
    "load_scenario",
    "simulate",
    "simulate_round",
    "utilization_grid",
    "write_outputs",
]

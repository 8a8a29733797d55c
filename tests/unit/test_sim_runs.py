"""Whole simulated runs: determinism for a seed, every scenario file parses and runs, the
Qwen3-8B scenario's qualitative results (the paper's), and the torch-free import rule."""

import subprocess
import sys
from pathlib import Path

import pytest

from echo2.config.sim import ScenarioConfig, load_scenario
from echo2.sim import sweeps
from echo2.sim.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((ROOT / "configs" / "sim").glob("*.toml"))
QWEN3_8B = ROOT / "configs" / "sim" / "qwen3_8b.toml"


def test_there_are_scenarios_for_4b_8b_and_32b():
    assert {p.stem for p in SCENARIOS} >= {"qwen3_4b", "qwen3_8b", "qwen3_32b"}


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_every_scenario_parses_and_runs(path):
    scenario = load_scenario(path, ["sim.steps=8"])
    assert scenario.plan_config().workload.batch_rollouts == scenario.workload.batch_rollouts
    result = simulate(scenario)
    assert result.finished and result.steps_done == 8
    assert result.fleet and result.total_cost > 0
    assert 0 < result.utilization <= 1
    # a scenario's dump loads again as the same scenario (benchmarks keep their simulated fleets so)
    for loaded in (scenario, load_scenario(path, ["sim.steps=8", "sim.generation_cv=0.5"])):
        assert ScenarioConfig.model_validate_json(loaded.model_dump_json()) == loaded


def test_a_scenario_the_planner_cannot_staff_ends_at_once_unfinished():
    """At S = 4 no worker of the 30B-A3B scenario delivers in time (S_min is 5): nothing is
    rented, and the run stops at once instead of simulating machines up to max_sim_s."""
    result = simulate(load_scenario(ROOT / "configs" / "sim" / "qwen3_30b_a3b.toml",
                                    ["sim.steps=20", "workload.max_staleness=4"]))
    assert not result.finished and result.steps_done == 0 and result.fleet == {}
    assert result.events == 0


def test_same_seed_same_run_other_seed_other_run():
    scenario = load_scenario(QWEN3_8B, ["sim.steps=30", "activation.control_period_s=1200"])
    first, again = simulate(scenario), simulate(scenario)
    strip = lambda r: {k: v for k, v in r.to_dict(per_worker=True).items() if k != "run_s"}  # noqa: E731
    assert strip(first) == strip(again)
    other = simulate(load_scenario(QWEN3_8B, ["sim.steps=30", "activation.control_period_s=1200", "sim.seed=7"]))
    assert strip(other) != strip(first)


def test_qwen3_8b_dissemination_one_to_many_grows_pipelined_stays_near_ideal():
    scenario = load_scenario(QWEN3_8B, ["sweep.worker_counts=[1, 4, 16, 64]"])
    data = sweeps.dissemination_vs_workers(scenario)["topologies"]
    one_to_many, chain, ideal = (data[t]["simulated_s"] for t in ("one_to_many", "chain", "ideal"))
    assert one_to_many == sorted(one_to_many) and one_to_many[-1] > 30 * one_to_many[0]
    assert all(c <= 1.3 * i for c, i in zip(chain, ideal, strict=True))


def test_qwen3_8b_costs_less_than_the_centralized_baseline_at_the_same_steps():
    result = simulate(load_scenario(QWEN3_8B, ["sim.steps=60"]))
    assert result.baseline is not None and result.steps_done == 60
    assert result.total_cost < result.baseline.cost
    assert 0 < result.saving_fraction < 1
    assert result.wall_s < result.baseline.wall_s


def test_more_staleness_never_hurts_much_and_helps_a_starved_learner():
    scenario = load_scenario(
        QWEN3_8B, ["sweep.staleness=[0, 2, 6]", "sweep.bandwidths_bps=[1e9]", "sweep.steps=20"]
    )
    grid = sweeps.utilization_grid(scenario, {"rtx4090_dc": 23})
    simulated = grid["by_bandwidth"]["1000000000.0"]["simulated"]
    assert simulated[0] < simulated[1] < simulated[2]


def test_sim_imports_without_torch():
    code = "import sys, echo2.sim, echo2.sim.analysis, echo2.cli.sim_cmd; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, env={"PYTHONPATH": str(ROOT / "src")})

"""The capacity model with a share d of scored groups dropped as uninformative
(workload.uninformative_share): the fleet generates B / (1 - d) rollouts a step, so every
required rate grows by exactly 1 / (1 - d); `echo2 plan` and `echo2 sim` take d as a workload
field, and the simulator, drawing each admitted group uninformative with probability d and
refilling the batch, keeps the learner as busy as the planner predicts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from echo2.cli import main
from echo2.config.catalog import load_plan_config
from echo2.config.sim import load_scenario
from echo2.planner import capacity
from echo2.planner.plan import assemble, make_plan
from echo2.sim.plan_check import plan_vs_sim, with_plan_staleness
from echo2.sim.simulator import simulate

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = str(ROOT / "configs" / "catalog" / "example.toml")
QWEN3_8B = ROOT / "configs" / "sim" / "qwen3_8b.toml"


@pytest.mark.parametrize("share", [0.1, 0.3, 0.5, 0.95])
def test_every_required_rate_grows_by_one_over_one_minus_d(share):
    grow = 1 / (1 - share)
    assert capacity.rollouts_generated_per_step(512, share) == pytest.approx(512 * grow)
    assert capacity.base_throughput_rps(512, 60, uninformative_share=share) == pytest.approx(512 / 60 * grow)
    args = dict(batch_rollouts=512, step_time_s=60, staleness=4, stall_s=15.0)
    assert capacity.required_throughput_rps(**args, uninformative_share=share) == pytest.approx(
        capacity.required_throughput_rps(**args) * grow)
    assert capacity.learner_utilization(5.0, 512, 60, uninformative_share=share) == pytest.approx(
        capacity.learner_utilization(5.0, 512, 60) / grow)
    base = make_plan(load_plan_config(EXAMPLE))
    plan = make_plan(load_plan_config(EXAMPLE, overrides=[f"workload.uninformative_share={share}"]))
    assert plan.base_rps == pytest.approx(base.base_rps * grow) and plan.uninformative_share == share


def test_a_share_outside_its_range_is_refused():
    with pytest.raises(ValueError, match="uninformative_share"):
        load_plan_config(EXAMPLE, overrides=["workload.uninformative_share=0.96"])
    with pytest.raises(ValueError, match=r"uninformative_share must be in \[0, 1\)"):
        capacity.rollouts_generated_per_step(512, 1.0)


def test_the_plan_provisions_for_the_refills_and_says_so(capsys):
    assert main(["plan", "--catalog", EXAMPLE, "--set", "workload.uninformative_share=0.3", "--json"]) == 0
    dropped = json.loads(capsys.readouterr().out)
    assert main(["plan", "--catalog", EXAMPLE, "--json"]) == 0
    plain = json.loads(capsys.readouterr().out)
    assert dropped["admissible_rps"] >= dropped["base_rps"] > plain["admissible_rps"] * 1.2
    assert main(["plan", "--catalog", EXAMPLE, "--set", "workload.uninformative_share=0.3"]) == 0
    assert "30% of groups dropped as uninformative" in capsys.readouterr().out
    assert main(["plan", "--catalog", EXAMPLE]) == 0
    assert "uninformative" not in capsys.readouterr().out


@pytest.mark.parametrize("staleness", [4, 6])
def test_the_simulator_keeps_the_planned_utilization_with_30_percent_dropped(staleness):
    scenario = load_scenario(QWEN3_8B, ["sim.steps=60", "workload.uninformative_share=0.3"])
    row = plan_vs_sim(scenario, staleness)
    assert row["feasible"] and row["planner_utilization"] == 1.0
    assert abs(row["difference_points"]) <= 5.0, row
    assert row["needed_rps"] == pytest.approx(512 / 80 / 0.7, rel=1e-3)


def test_a_fleet_planned_without_the_share_falls_short_as_the_planner_predicts():
    """The fleet sized for d = 0, run with 30% of groups dropped: the planner (told d) predicts
    about 72% utilization, and the simulator measures it within 5 points."""
    plain = with_plan_staleness(load_scenario(QWEN3_8B, ["sim.steps=60", "sim.slow_start=false"]), 6)
    counts = {c.name: c.chosen for c in make_plan(plain.plan_config()).classes if c.chosen}
    dropped = with_plan_staleness(load_scenario(QWEN3_8B, ["sim.steps=60", "sim.slow_start=false",
                                                           "workload.uninformative_share=0.3"]), 6)
    predicted = assemble(dropped.plan_config(), counts, method="fixed", gap=0.0, reasons=(), fixes=(), warnings=())
    result = simulate(dropped, fleet_counts=counts)
    assert predicted.utilization < 0.8
    assert abs(result.utilization_steady - predicted.utilization) <= 0.05, (result.utilization_steady,
                                                                          predicted.utilization)
    scored = result.groups["accepted"] + result.groups["dropped_uninformative"]
    assert abs(result.groups["dropped_uninformative"] / scored - 0.3) < 0.05  # the seeded draws
    assert result.groups["trained"] == 60 * dropped.workload.prompts_per_step


def test_echo2_sim_takes_the_share(tmp_path, capsys):
    code = main(["sim", "--scenario", str(QWEN3_8B), "--set", "sim.steps=8", "--set",
                 "workload.uninformative_share=0.3", "--no-sweeps", "--json", "--out", str(tmp_path)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    run = out["main_run"]
    assert run["uninformative_share"] == 0.3 and run["groups"]["dropped_uninformative"] > 0

"""In-flight weight updates (segment swaps, workload.segment_s) in the capacity model, the planner
and the simulator: with swaps only T_seg + (1 - f) T_gen of a generation counts against the
window, so a generation longer than T_train no longer forces S up."""

import json
import math
import sys
from pathlib import Path

import pytest

from echo2.cli import main
from echo2.config.catalog import load_plan_config
from echo2.config.sim import ScenarioConfig, load_scenario
from echo2.planner import capacity
from echo2.planner.plan import make_plan
from echo2.policy.admission import admits_tokens
from echo2.sim.plan_check import plan_vs_sim, with_plan_staleness
from echo2.sim.simulator import simulate

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from inflight_sim import long_tailed  # noqa: E402  (Goal 1's workload: one definition, benchmark and test)

ROOT = Path(__file__).resolve().parents[2]
QWEN3_8B = ROOT / "configs" / "sim" / "qwen3_8b.toml"
EXAMPLE = ROOT / "configs" / "catalog" / "example.toml"
LONG = ["sim.steps=60", "workload.generation_time_s=300"]  # T_gen 300 s against T_train 80 s


def _per_token_admitted(staleness, step_s, *, dis_s, gen_s, seg_s, f, tokens=2000):
    """The brute force: tokens evenly over the generation, each sampled by the newest version a
    worker holds T_dis + T_seg earlier, the group trained when it ends, admitted by the
    coordinator's own rule. Time in units of step_s: version v is published at v * step_s, and
    the learner trains at step (end of generation) / step_s."""
    start_s = 1000 * step_s  # far from version 0
    end_s = start_s + gen_s
    train_step = end_s / step_s
    by_version: dict[float, int] = {}
    for i in range(tokens):
        tau_s = start_s + (i + 0.5) * gen_s / tokens
        version = min(tau_s, start_s + gen_s) - dis_s - seg_s  # the version's publish time
        age = (end_s - version) / step_s  # real-valued staleness in steps
        key = train_step - age
        by_version[key] = by_version.get(key, 0) + 1
    share = sum(n for v, n in by_version.items() if train_step - v > staleness) / tokens
    return share, share < f


@pytest.mark.parametrize("dis_s,gen_s,seg_s,f", [(24, 300, 5, 0.5), (60, 500, 10, 0.2), (10, 90, 0, 0.9)])
def test_the_closed_form_matches_a_per_token_brute_force(dis_s, gen_s, seg_s, f):
    step_s = 80.0
    swapped = capacity.swapped_lateness_s(gen_s, segment_s=seg_s, max_masked_fraction=f)
    s_min = capacity.min_staleness(dis_s, gen_s, step_s, swapped_s=swapped)
    for staleness in range(0, 12):
        share, admitted = _per_token_admitted(staleness, step_s, dis_s=dis_s, gen_s=gen_s, seg_s=seg_s, f=f)
        model = capacity.masked_token_share(staleness, step_s, dissemination_s=dis_s, generation_s=gen_s,
                                            segment_s=seg_s)
        unswapped_fresh = dis_s + gen_s <= staleness * step_s
        assert model == pytest.approx(0.0 if unswapped_fresh else share, abs=1e-3)
        assert capacity.overlap_holds(dis_s, gen_s, staleness, step_s, swapped_s=swapped) == (
            admitted or unswapped_fresh)
        assert (staleness >= s_min) == (admitted or unswapped_fresh)


def test_s_min_with_swaps_by_hand_and_at_its_boundaries():
    # T_dis 20 + T_seg 10 + (1 - 0.5) x 100 = 80 = exactly 2 steps of 40 s: a share of exactly f
    # is masked at S = 2, and the rule wants less, so S = 3 (without swaps: ceil(120/40) = 3)
    swapped = capacity.swapped_lateness_s(100, segment_s=10, max_masked_fraction=0.5)
    assert swapped == 60
    assert capacity.min_staleness(20, 100, 40, swapped_s=swapped) == 3
    assert capacity.masked_token_share(2, 40, dissemination_s=20, generation_s=100, segment_s=10) == 0.5
    assert not admits_tokens(2, {0: 50, 1: 50}, 1, 0.5)  # the rule it mirrors: a share of f is too much
    # a hair less lateness and S = 2 suffices
    assert capacity.min_staleness(20, 100, 40, swapped_s=59.9) == 2
    # the long-generation case: 300 s generations, 80 s steps, 24 s dissemination, 5 s segments
    assert capacity.min_staleness(24, 300, 80) == 5
    assert capacity.min_staleness(24, 300, 80, swapped_s=capacity.swapped_lateness_s(
        300, segment_s=5, max_masked_fraction=0.5)) == 3  # (24 + 5 + 150) / 80 = 2.24
    # never below the dissemination floor, and swaps never make it worse than without
    assert capacity.min_staleness(200, 10, 80, swapped_s=0.0) == 3
    assert capacity.min_staleness(24, 60, 80, swapped_s=capacity.swapped_lateness_s(
        60, segment_s=60, max_masked_fraction=0.5)) == capacity.min_staleness(24, 60, 80) == 2


def test_swaps_off_is_todays_rule_exactly():
    for dis_s, gen_s, step_s in [(140, 0, 60), (100, 20, 60), (0.1 + 0.2, 119.7, 60), (100, 21, 60), (0, 0, 60)]:
        today = math.ceil((dis_s + gen_s) / step_s * (1 - 1e-9))
        assert capacity.min_staleness(dis_s, gen_s, step_s, swapped_s=None) == max(0, today)
        for staleness in range(5):
            share = capacity.masked_token_share(staleness, step_s, dissemination_s=dis_s, generation_s=gen_s)
            assert share == (0.0 if staleness >= today else 1.0)
    assert capacity.swap_ahead_steps(300, 80, segment_s=None, max_masked_fraction=0.5) == 0


def test_swap_ahead_steps_is_the_largest_k_with_k_steps_plus_a_segment_under_f_of_the_generation():
    assert capacity.swap_ahead_steps(300, 80, segment_s=5, max_masked_fraction=0.5) == 1  # 80 + 5 < 150
    assert capacity.swap_ahead_steps(330, 80, segment_s=5, max_masked_fraction=0.5) == 2  # 160 + 5 < 165
    assert capacity.swap_ahead_steps(330, 80, segment_s=5.0001, max_masked_fraction=0.5) == 1
    assert capacity.swap_ahead_steps(100, 80, segment_s=5, max_masked_fraction=0.5) == 0
    with pytest.raises(ValueError, match="max_masked_fraction"):
        capacity.swapped_lateness_s(100, segment_s=5, max_masked_fraction=0.0)


def test_the_planner_lowers_s_min_with_segment_swaps_and_says_how_much_is_masked(capsys):
    plain = make_plan(load_plan_config(EXAMPLE, overrides=["workload.generation_time_s=300"]))
    swapped = make_plan(load_plan_config(EXAMPLE, overrides=["workload.generation_time_s=300",
                                                             "workload.segment_s=5"]))
    assert not plain.feasible and plain.s_min == 7 and plain.segment_s is None and plain.masked_share == 0
    assert swapped.feasible and swapped.s_min == 4 and swapped.utilization == 1.0
    assert 0 < swapped.masked_share < 0.05  # (300 + 24 + 5 - 320) / 300 at S = 4
    with pytest.raises(ValueError, match="max_masked_fraction"):
        load_plan_config(EXAMPLE, overrides=["workload.max_masked_fraction=0"])
    assert main(["plan", "--catalog", str(EXAMPLE), "--set", "workload.generation_time_s=300",
                 "--set", "workload.segment_s=5"]) == 0
    assert "segment swaps (T_seg)" in capsys.readouterr().out


def test_segment_swaps_off_leave_the_simulated_run_unchanged():
    base = simulate(load_scenario(QWEN3_8B, ["sim.steps=20"])).to_dict()
    same = simulate(load_scenario(QWEN3_8B, ["sim.steps=20", "workload.max_masked_fraction=0.3"])).to_dict()
    for key in ("utilization", "groups", "staleness_hist", "wall_s", "events", "rollouts_generated"):
        assert base[key] == same[key]
    assert base["segment_s"] is None and base["tokens"]["tokens_masked_stale"] == 0


def test_the_simulator_trains_long_generations_at_a_lower_s_with_segment_swaps():
    """At S = 4, the planner's S_min with swaps (7 without), its fleet rented with and without
    them: without, a third more groups are leased and the shorter generations alone land in time
    (about 73% utilization); with, the learner stays busy, a group's tokens span versions and
    part of them is masked, always less than f per trained group."""
    swapped = with_plan_staleness(load_scenario(QWEN3_8B, LONG + ["workload.segment_s=5", "sim.slow_start=false"]), 4)
    plan = make_plan(swapped.plan_config())
    assert plan.feasible and plan.s_min == 4
    counts = {c.name: c.chosen for c in plan.classes if c.chosen}
    plain = with_plan_staleness(load_scenario(QWEN3_8B, LONG + ["sim.slow_start=false"]), 4)
    with_swaps, without = simulate(swapped, fleet_counts=counts), simulate(plain, fleet_counts=counts)
    assert with_swaps.utilization_steady > 0.9 > 0.8 > without.utilization_steady
    assert without.groups["dropped_stale"] > 3 * with_swaps.groups["dropped_stale"]
    tokens = with_swaps.tokens
    assert 0 < tokens["masked_token_share"] < 0.25 and tokens["token_staleness_p95"] <= 4
    assert len(tokens["token_staleness_hist"]) > 3  # the tokens of one group span versions
    assert without.tokens["tokens_masked_stale"] == 0  # one version per group: all trained or none


def test_the_simulator_agrees_with_the_planner_with_segment_swaps():
    row = plan_vs_sim(load_scenario(QWEN3_8B, LONG + ["workload.segment_s=5"]), 5)
    assert row["feasible"] and row["planner_utilization"] == 1.0 and row["planner_s_min"] == 5
    assert abs(row["difference_points"]) <= 5.0, row
    unswapped = plan_vs_sim(load_scenario(QWEN3_8B, LONG), 5)
    assert not unswapped["feasible"] and unswapped["planner_s_min"] == 7


def test_echo2_sim_takes_the_segment_fields(tmp_path, capsys):
    code = main(["sim", "--scenario", str(QWEN3_8B), "--set", "sim.steps=8", "--set", "workload.segment_s=5",
                 "--set", "workload.max_masked_fraction=0.4", "--no-sweeps", "--json", "--out", str(tmp_path)])
    assert code == 0
    run = json.loads(capsys.readouterr().out)["main_run"]
    assert run["segment_s"] == 5 and run["tokens"]["token_staleness_p50"] is not None
    assert main(["sim", "--scenario", str(QWEN3_8B), "--set", "sim.steps=4", "--set", "workload.segment_s=5",
                 "--no-sweeps", "--out", str(tmp_path)]) == 0
    assert "tokens:" in capsys.readouterr().out  # the token staleness row (rich wraps its cells)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_in_flight_swaps_drop_no_long_generation_that_swaps_between_generations_drop(seed):
    """benchmarks/inflight.py's Goal 1 through the coordinator's own data plane: swapping only
    between generations, a generation that outlasts S steps arrives with a version too old and is
    dropped whole; swapping in flight, its early tokens are the old version's, masked (fewer than
    max_masked_fraction), and the group trains."""
    between, inflight = simulate(long_tailed("between", seed)), simulate(long_tailed("inflight", seed))
    assert between.groups["dropped_on_arrival"] >= 1
    assert inflight.groups["dropped_on_arrival"] == 0 and inflight.groups["dropped_stale"] == 0
    assert 0 < inflight.tokens["masked_token_share"] < 0.5 and inflight.tokens["token_staleness_p95"] <= 4
    assert inflight.utilization_steady > between.utilization_steady


def test_generation_range_is_checked():
    data = long_tailed("between", 0).model_dump()
    for bad, message in (([400, 40], "0 < shortest < longest"), ([0, 40], "0 < shortest < longest")):
        with pytest.raises(ValueError, match=message):
            ScenarioConfig.model_validate({**data, "sim": {**data["sim"], "generation_range": bad}})
    with pytest.raises(ValueError, match="set one"):
        ScenarioConfig.model_validate({**data, "sim": {**data["sim"], "generation_cv": 0.3}})

"""Calibration terms of the capacity model: round period, version skipping, the latency tail,
preemption, and the knobs that carry them in from the catalog and the scenario."""

import math
from pathlib import Path

import pytest

from echo2.config.sim import load_scenario
from echo2.planner import tail
from echo2.planner.plan import make_plan

ROOT = Path(__file__).resolve().parents[2]
QWEN3_8B = ROOT / "configs" / "sim" / "qwen3_8b.toml"


def test_round_period_is_the_stream_at_the_slowest_link():
    gb = 1e9  # 8 Gbit
    assert tail.round_period_s("chain", snapshot_bytes=gb, n_workers=10, learner_bps=10e9,
                               slowest_bps=1e9) == pytest.approx(8.0)
    assert tail.round_period_s("chain", snapshot_bytes=gb, n_workers=10, learner_bps=0.5e9,
                               slowest_bps=1e9) == pytest.approx(16.0)  # learner slower
    assert tail.round_period_s("tree", snapshot_bytes=gb, n_workers=10, learner_bps=10e9, slowest_bps=1e9,
                               fanout=2) == pytest.approx(16.0)  # split upload
    assert tail.round_period_s("one_to_many", snapshot_bytes=gb, n_workers=10, learner_bps=10e9,
                               slowest_bps=1e9) == pytest.approx(8.0)
    assert tail.round_period_s("one_to_many", snapshot_bytes=gb, n_workers=20, learner_bps=10e9,
                               slowest_bps=1e9) == pytest.approx(16.0)


def test_versions_are_skipped_only_when_the_round_outlasts_the_step():
    assert tail.swap_interval_s(80, 50) == 80 and tail.max_wait_s(80, 50) == 0
    assert tail.swap_interval_s(80, 131) == 131 and tail.max_wait_s(80, 131) == 131


def test_tail_quantiles():
    assert tail.gamma_quantile(150, 0.0, 0.9) == 150
    # gamma with cv 0.3: p50 just under the mean, p90 about 1.39x
    assert tail.gamma_quantile(150, 0.3, 0.5) == pytest.approx(145.5, abs=0.5)
    assert tail.gamma_quantile(150, 0.3, 0.9) == pytest.approx(209, abs=1.5)
    # no spread: the generation plus the p-quantile of the uniform lease spread
    assert tail.wait_plus_generation_s(round_wait_s=0.0, lease_spread_s=80.0, generation_s=150, cv=0.0,
                                       percentile=0.9) == pytest.approx(150 + 72, abs=2)
    # the sum's quantile is below the sum of the quantiles
    both = tail.wait_plus_generation_s(round_wait_s=131.0, lease_spread_s=80.0, generation_s=150, cv=0.3,
                                       percentile=0.9)
    assert 150 + 105 < both < tail.gamma_quantile(150, 0.3, 0.9) + 0.9 * 131 + 0.9 * 80
    assert tail.wait_plus_generation_cdf(both, round_wait_s=131.0, lease_spread_s=80.0, generation_s=150,
                                         cv=0.3) == pytest.approx(0.9, abs=0.01)
    cdf = [tail.wait_plus_generation_cdf(x, round_wait_s=131.0, lease_spread_s=80.0, generation_s=150, cv=0.3)
           for x in range(100, 600, 50)]
    assert cdf == sorted(cdf) and cdf[0] < 0.05 and cdf[-1] > 0.99


def test_preemption_availability():
    assert tail.availability(None, 100) == 1.0
    assert tail.availability(math.inf, 100) == 1.0
    assert tail.availability(900, 100) == pytest.approx(0.9)


def test_scenario_passes_churn_and_generation_spread_to_the_planner():
    scenario = load_scenario(QWEN3_8B)
    cfg = scenario.plan_config()
    assert cfg.workers["a100_spot"].mean_uptime_s == 14400
    assert cfg.plan.generation_cv == scenario.sim.generation_cv == 0.3
    a100 = next(c for c in make_plan(cfg).classes if c.name == "a100_spot")
    assert 0.98 < a100.availability < 1.0
    never = load_scenario(QWEN3_8B, ["workers.a100_spot.mean_uptime_s=1e12"]).plan_config()
    assert next(c for c in make_plan(never).classes if c.name == "a100_spot").availability == pytest.approx(1.0)


def test_a_higher_percentile_needs_a_larger_s():
    median = load_scenario(QWEN3_8B, ["plan.latency_percentile=0.5"]).plan_config()
    p99 = load_scenario(QWEN3_8B, ["plan.latency_percentile=0.99"]).plan_config()
    assert make_plan(median).s_min < make_plan(p99).s_min


def test_scenario_rejects_a_second_generation_spread():
    with pytest.raises(ValueError, match="sim.generation_cv"):
        load_scenario(QWEN3_8B, ["plan.generation_cv=0.5"])
    with pytest.raises(ValueError, match="latency_percentile"):
        load_scenario(QWEN3_8B, ["plan.latency_percentile=1.5"])

"""Capacity formulas and cost helpers against hand-computed cases."""

import math

import pytest

from echo2.planner import capacity, cost


def test_base_and_required_throughput_by_hand():
    # B = 512, T_train = 60 s: 8.533 rollouts/s with no stall
    assert capacity.base_throughput_rps(512, 60) == pytest.approx(512 / 60)
    assert capacity.required_throughput_rps(batch_rollouts=512, step_time_s=60, staleness=4,
                                            stall_s=0.0) == pytest.approx(512 / 60)
    # S = 4 -> window 240 s, stall 15 s: 512/60 * 240/225 = 9.1022
    assert capacity.required_throughput_rps(batch_rollouts=512, step_time_s=60, staleness=4,
                                            stall_s=15.0) == pytest.approx(9.102222, rel=1e-6)


def test_required_throughput_is_infinite_when_the_window_cannot_cover_the_stall():
    assert math.isinf(capacity.required_throughput_rps(batch_rollouts=512, step_time_s=60, staleness=1,
                                                       stall_s=60.0))
    assert math.isinf(capacity.required_throughput_rps(batch_rollouts=512, step_time_s=60, staleness=0,
                                                       stall_s=0.0))  # S = 0: synchronous


def test_min_staleness_by_hand():
    assert capacity.min_staleness(140, 0, 60) == 3  # the example: ceil(140/60)
    assert capacity.min_staleness(100, 20, 60) == 2  # exactly two steps: no rounding up
    assert capacity.min_staleness(0.1 + 0.2, 119.7, 60) == 2  # float noise must not add one
    assert capacity.min_staleness(100, 21, 60) == 3
    assert capacity.min_staleness(0, 0, 60) == 0
    assert capacity.overlap_holds(100, 20, 2, 60)
    assert not capacity.overlap_holds(100, 21, 2, 60)


def test_effective_throughput_loses_the_stall_fraction_and_drops_stale_workers():
    # window 2 x 60 = 120 s, stall 30 s: keeps 3/4 of 2 rollouts/s
    kept = capacity.effective_throughput_rps(2.0, 2, 60, dissemination_s=50, generation_s=40, stall_s=30)
    assert kept == pytest.approx(1.5)
    assert (
        capacity.effective_throughput_rps(2.0, 2, 60, dissemination_s=90, generation_s=40, stall_s=30) == 0.0
    )


def test_uniform_stall_makes_the_sum_of_effective_rates_equal_to_r_required():
    rates, staleness, step_s, stall_s = [0.7, 1.3, 2.0], 3, 50.0, 20.0
    effective = sum(capacity.effective_throughput_rps(r, staleness, step_s, stall_s=stall_s) for r in rates)
    batch = 200
    # sum r_eff >= B/T  <=>  sum r >= R_required
    ratio = sum(rates) / capacity.required_throughput_rps(batch_rollouts=batch, step_time_s=step_s,
                                                          staleness=staleness, stall_s=stall_s)
    assert effective / capacity.base_throughput_rps(batch, step_s) == pytest.approx(ratio)


def test_utilization_and_step_wall_time():
    assert capacity.learner_utilization(4.0, 512, 64) == pytest.approx(0.5)  # needs 8/s, gets 4/s
    assert capacity.learner_utilization(20.0, 512, 64) == 1.0
    assert capacity.step_wall_s(4.0, 512, 64) == pytest.approx(128.0)  # B / R
    assert capacity.step_wall_s(20.0, 512, 64) == pytest.approx(64.0)  # T_train
    assert math.isinf(capacity.step_wall_s(0.0, 512, 64))


def test_cost_helpers_by_hand():
    assert cost.cost_per_step(36.0, 100.0) == pytest.approx(1.0)
    assert cost.cost_per_rollout(1.0, 500) == pytest.approx(0.002)
    # generation is throughput-bound (512/8 = 64 s > T_gen 30 s), then train 60 s
    assert cost.centralized_step_s(60, 512, 8.0, 30) == pytest.approx(124.0)
    # latency-bound: the slowest group (150 s) beats 512/32 = 16 s
    assert cost.centralized_step_s(60, 512, 32.0, 150) == pytest.approx(210.0)
    assert cost.saving_fraction(0.65, 1.0) == pytest.approx(0.35)


@pytest.mark.parametrize(
    "call",
    [
        lambda: capacity.base_throughput_rps(0, 60),
        lambda: capacity.base_throughput_rps(512, 0),
        lambda: capacity.required_throughput_rps(batch_rollouts=512, step_time_s=60, staleness=-1),
        lambda: capacity.min_staleness(-1, 0, 60),
        lambda: cost.centralized_step_s(60, 512, 0.0, 10),
        lambda: cost.saving_fraction(1.0, 0.0),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_field(call):
    with pytest.raises(ValueError, match="must be"):
        call()

"""The online activation controller: cheapest covering set from measured rates, replacement on
preemption, hysteresis, cost accounting."""

from __future__ import annotations

import math

import pytest

from echo2.config.run import ActivationConfig
from echo2.coordinator.controller import ActivationController

PRICES = {"cheap1": 1.0, "cheap2": 1.0, "dear1": 5.0, "dear2": 5.0}


def make(max_staleness: int = 2, **cfg) -> ActivationController:
    ctl = ActivationController(ActivationConfig(min_samples=2, **cfg), batch_rollouts=128,
                               max_staleness=max_staleness, learner_price_per_hour=10.0, now=0.0)
    for worker_id, price in PRICES.items():
        ctl.join(worker_id, price)
    return ctl


def feed(ctl: ActivationController, rates: dict[str, float], step_time_s: float = 1.0) -> None:
    for _ in range(3):
        ctl.observe_step_time(step_time_s)
        for worker_id, rate in rates.items():
            ctl.observe_generation(worker_id, rollouts=int(rate), tokens=int(rate) * 5, gen_s=1.0)


def test_runs_everyone_until_rates_and_demand_are_known():
    ctl = make()
    assert ctl.decide(now=1.0).active == set(PRICES)
    ctl.observe_step_time(1.0)
    assert ctl.decide(now=2.0).active == set(PRICES)  # rates unknown yet


def test_activates_the_cheapest_cover_and_replaces_a_lost_worker():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    # B / T_train = 128 rollouts/s, x 1.15 headroom: two 100-rollout/s workers suffice
    decision = ctl.decide(now=10.0)
    assert decision.active == {"cheap1", "cheap2"} and decision.changed
    assert decision.required_rps == pytest.approx(128 * 1.15)
    assert not ctl.is_active("dear1")
    ctl.vanish("cheap1")  # preempted
    replaced = ctl.decide(now=11.0)
    assert replaced.active in ({"cheap2", "dear1"}, {"cheap2", "dear2"}) and replaced.changed


def test_hysteresis_keeps_a_set_that_still_covers():
    ctl = make(margin=0.5)
    feed(ctl, {"cheap1": 100.0, "cheap2": 100.0, "dear1": 100.0, "dear2": 100.0})
    assert ctl.decide(now=1.0).active == {"cheap1", "cheap2"}
    ctl.workers["dear1"].price_per_hour = 0.9  # a slightly cheaper option appears: not worth a switch
    assert ctl.decide(now=2.0).active == {"cheap1", "cheap2"}


def test_demand_above_supply_runs_everyone():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 10.0))
    decision = ctl.decide(now=1.0)
    assert decision.active == set(PRICES) and "no set covers" in decision.reason


def test_synchronous_runs_everyone():
    ctl = make(max_staleness=0)
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    assert math.isinf(ctl.required_rps()) and ctl.decide(now=1.0).active == set(PRICES)


def test_cost_is_price_times_active_time():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    ctl.decide(now=0.0)  # cheap1 + cheap2 active from t = 0
    ctl.account(now=3600.0)
    assert ctl.learner_cost == pytest.approx(10.0)
    assert ctl.workers["cheap1"].cost == pytest.approx(1.0)
    assert ctl.workers["dear1"].cost == 0.0
    assert ctl.total_cost() == pytest.approx(12.0)

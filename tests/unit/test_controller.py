"""The online activation controller: cheapest covering set from measured rates, replacement on
preemption, hysteresis, cost accounting."""

from __future__ import annotations

import math

import pytest

from echo2.config.activation import ActivationConfig
from echo2.policy.controller import ActivationController

PRICES = {"cheap1": 1.0, "cheap2": 1.0, "dear1": 5.0, "dear2": 5.0}


def make(max_staleness: int = 2, **cfg) -> ActivationController:
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0, **cfg), batch_rollouts=128,
                               max_staleness=max_staleness, learner_price_per_hour=10.0, now=0.0)
    for worker_id, price in PRICES.items():
        ctl.join(worker_id, price)
    return ctl


def feed(ctl: ActivationController, rates: dict[str, float], step_time_s: float = 1.0) -> None:
    """Three heartbeats' worth of cumulative counters: `rate` rollouts per busy second."""
    for beat in range(1, 4):
        ctl.observe_step_time(step_time_s)
        for worker_id, rate in rates.items():
            ctl.observe_busy(worker_id, rollouts_total=int(rate * beat), busy_s_total=float(beat))


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
    assert decision.required_rps == pytest.approx(128)
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
    assert decision.active == set(PRICES) and "no measured set covers" in decision.reason


def test_a_short_measured_set_adds_enough_unmeasured_workers_to_cover_the_rest():
    """Short of demand, every measured worker runs, and unmeasured ones are counted at the
    measured average: 4 measured at 10/s leave 147.2 - 40 = 107.2/s, so 11 more run, not all 30."""
    ctl = make(probation_slots=2)
    feed(ctl, dict.fromkeys(PRICES, 10.0))
    for i in range(30):
        ctl.join(f"new{i:02d}", 1.0)
    decision = ctl.decide(now=1.0)
    assert decision.active == set(PRICES) | {f"new{i:02d}" for i in range(11)}
    assert "(19 more waiting)" in decision.reason


def test_synchronous_runs_everyone():
    ctl = make(max_staleness=0)
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    assert math.isinf(ctl.required_rps()) and ctl.decide(now=1.0).active == set(PRICES)


def test_cost_is_price_times_rented_time_active_or_idle():
    """Nothing released (the static provider): an idle worker bills like an active one."""
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    ctl.decide(now=0.0)  # cheap1 + cheap2 active from t = 0, the dear ones idle
    ctl.account(now=3600.0)
    assert ctl.learner_cost == pytest.approx(10.0)
    assert ctl.workers["cheap1"].cost == pytest.approx(1.0) and ctl.workers["cheap1"].active_s == pytest.approx(3600)
    dear = ctl.snapshot()["workers"]["dear1"]
    assert dear["cost"] == pytest.approx(5.0) and not dear["active"]
    assert (dear["active_s"], dear["idle_s"], dear["released_s"]) == (0.0, pytest.approx(3600), 0.0)
    assert ctl.total_cost() == pytest.approx(10.0 + 1 + 1 + 5 + 5)


def test_a_released_worker_bills_nothing_and_can_be_chosen_again():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    assert ctl.decide(now=0.0).active == {"cheap1", "cheap2"}
    ctl.account(now=1800.0)  # half an hour idle and rented
    ctl.release("dear1")
    ctl.release("dear2")
    ctl.account(now=3600.0)  # half an hour released
    dear = ctl.snapshot()["workers"]["dear1"]
    assert (dear["idle_s"], dear["released_s"]) == (pytest.approx(1800), pytest.approx(1800))
    assert dear["cost"] == pytest.approx(2.5) and dear["released"] and ctl.is_released("dear1")
    # the cheap ones are lost: the released workers are the offers left, so they are chosen
    ctl.vanish("cheap1")
    ctl.vanish("cheap2")
    decision = ctl.decide(now=3601.0)
    assert decision.active == {"dear1", "dear2"} and decision.changed
    assert not ctl.is_active("dear1")  # chosen, not yet back: nothing bills until it joins
    ctl.account(now=3700.0)
    assert ctl.workers["dear1"].cost == pytest.approx(2.5)
    ctl.join("dear1", 5.0)  # acquired: it keeps its measurements and its bill
    assert ctl.is_active("dear1") and not ctl.is_released("dear1")
    assert ctl.workers["dear1"].rollouts_per_s.samples and ctl.workers["dear1"].cost == pytest.approx(2.5)


def test_a_lost_worker_is_no_offer():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    ctl.decide(now=0.0)
    ctl.vanish("dear1")  # crashed or left: unlike a released one, nobody can bring it back
    ctl.vanish("cheap1")
    ctl.vanish("cheap2")
    assert ctl.decide(now=1.0).active == {"dear2"}


def test_rates_come_from_busy_time_and_survive_a_worker_restart():
    ctl = make()
    ctl.observe_busy("cheap1", rollouts_total=100, busy_s_total=2.0)
    ctl.observe_busy("cheap1", rollouts_total=300, busy_s_total=4.0)
    assert ctl.workers["cheap1"].rollouts_per_s.value == pytest.approx(0.2 * 100 + 0.8 * 50)  # EWMA of 50, 100
    ctl.observe_busy("cheap1", rollouts_total=10, busy_s_total=0.1)  # restarted: counters reset
    ctl.observe_busy("cheap1", rollouts_total=110, busy_s_total=1.1)
    assert ctl.workers["cheap1"].rollouts_per_s.samples == 3


def test_saving_switches_wait_but_shortfalls_do_not():
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=30.0), batch_rollouts=128,
                               max_staleness=2, learner_price_per_hour=0.0, now=0.0)
    for worker_id, price in PRICES.items():
        ctl.join(worker_id, price)
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    assert ctl.decide(now=5.0).active == set(PRICES)  # all four still cover: the saving waits
    assert ctl.decide(now=31.0).active == {"cheap1", "cheap2"}
    ctl.vanish("cheap2")
    assert ctl.decide(now=32.0).active in ({"cheap1", "dear1"}, {"cheap1", "dear2"})  # at once


def test_noise_inside_the_headroom_band_changes_nothing():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0), step_time_s=1.0)  # need 128, sized for 147: two workers
    assert ctl.decide(now=1.0).active == {"cheap1", "cheap2"}
    for _ in range(10):  # demand drifts up to ~183 (EWMA settled), still < the 200 on hand
        feed(ctl, dict.fromkeys(PRICES, 100.0), step_time_s=0.7)
    assert not ctl.decide(now=2.0).changed
    for _ in range(10):  # 256 > 200: a real shortfall
        feed(ctl, dict.fromkeys(PRICES, 100.0), step_time_s=0.5)
    assert len(ctl.decide(now=3.0).active) == 3


def test_no_live_workers_is_not_an_error():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    for worker_id in PRICES:
        ctl.vanish(worker_id)
    decision = ctl.decide(now=1.0)
    assert decision.active == set() and decision.reason == "no live workers"


def test_a_worker_whose_groups_go_stale_is_priced_at_its_admitted_share():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    # cheap1 is cheap and fast but far behind: three of its four groups arrive too stale
    for admitted in (True, False, False, False) * 5:
        ctl.observe_outcome("cheap1", admitted)
        ctl.observe_outcome("cheap2", True)
    decision = ctl.decide(now=1.0)
    assert decision.estimates["cheap1"] < 40 and decision.estimates["cheap2"] == pytest.approx(100.0)
    assert "cheap1" not in decision.active and "cheap2" in decision.active


def test_measured_latencies_give_s_min():
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0), step_time_s=1.0)
    assert ctl.s_min() is None
    for worker_id in PRICES:
        ctl.observe_latencies(worker_id, dissemination_s=1.5, generation_s=1.2)
    assert ctl.s_min() == 3  # ceil((1.5 + 1.2) / 1.0)


def test_measured_segment_swaps_lower_s_min_by_the_planners_rule():
    """Workers that swap versions in mid-generation (sampling.segment_tokens): S_min is the
    planner's swap rule on what was measured, T_dis + T_seg + (1 - f) T_gen < S*T_train."""
    ctl = make(max_staleness=8)
    feed(ctl, dict.fromkeys(PRICES, 100.0), step_time_s=1.0)
    for worker_id in PRICES:
        ctl.observe_latencies(worker_id, dissemination_s=0.5, generation_s=6.0)
    assert ctl.s_min() == 7  # ceil(6.5): the window must cover the whole generation
    ctl.observe_segment(0.6)
    assert ctl.s_min() == 5  # 0.5 + 0.6 + 0.5 * 6.0 = 4.1 < 5 (f = 0.5, the default)
    assert ctl.snapshot()["s_min_measured"] == 5


def test_unmeasured_workers_are_on_probation_and_never_displace_measured_ones():
    """A stream of fresh registrations claiming $0 (that never lease) once switched every honest
    worker off: an unmeasured worker now runs beside the cheapest measured cover, never in its
    place, until the coordinator has measured it."""
    ctl = make()
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    assert ctl.decide(now=10.0).active == {"cheap1", "cheap2"}
    for i in range(5):
        ctl.join(f"free{i}", 0.0)
    decision = ctl.decide(now=11.0)
    assert decision.active == {"cheap1", "cheap2"} | {f"free{i}" for i in range(4)}  # 4 probation slots
    assert "on probation until measured: free0, free1, free2, free3 (1 more waiting)" in decision.reason
    feed(ctl, {"free0": 100.0, "free1": 100.0})  # two of them measured: now they compete on price
    assert ctl.decide(now=12.0).active == {"free0", "free1", "free2", "free3", "free4"}


def test_probation_slots_rotate_so_a_worker_that_never_leases_gives_its_slot_up():
    """Unbounded probation kept every unmeasured worker active (and billed) when a full lease
    window left them no work to be measured by; slots are bounded and go to the workers that
    have spent the least time on probation."""
    ctl = make(probation_slots=2, probation_timeout_s=30.0)
    feed(ctl, dict.fromkeys(PRICES, 100.0))
    ctl.decide(now=10.0)
    for i in range(3):
        ctl.join(f"new{i}", 1.0)
    assert ctl.decide(now=11.0).active == {"cheap1", "cheap2", "new0", "new1"}
    # within their probation_timeout_s, slot holders keep their slots
    assert ctl.decide(now=31.0).active == {"cheap1", "cheap2", "new0", "new1"}
    # new0 and new1 ran a minute without being measured: their slots go to new2 (active only
    # from its join to the first decision), and while the measured set covers demand they are not
    # tried again (rotating them in and out acquired a machine per control period, measuring none)
    assert ctl.decide(now=71.0).active == {"cheap1", "cheap2", "new2"}
    assert [ctl.workers[w].probation_s for w in ("new0", "new1", "new2")] == [61.0, 61.0, 1.0]
    ctl.decide(now=131.0)  # new2's probation is used up too: nobody on probation now
    assert ctl.decide(now=132.0).active == {"cheap1", "cheap2"}
    # the measured fall short: every unmeasured worker is a hope again, the least tried first
    for worker_id in ("cheap1", "cheap2", "dear1"):
        ctl.vanish(worker_id)
    decision = ctl.decide(now=133.0)
    assert not decision.covered and decision.active == {"dear2", "new0", "new1"}  # 2 slots, ties by registration

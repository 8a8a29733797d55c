"""What a measured run shows and the simulator replays: sim.workload_profile (the step time and
the uninformative share by learner step) and a worker class's engine_start_s (its model load
after registering). The fleet is fleet_ssh's seed-1 online fleet as simulated from its run
(benchmarks/results/fleet_ssh.json), whose policy dropped 0.22 of its scored groups over the first 10 steps and
0.63 over the last."""

import pytest

from echo2.config.sim import ProfileSegment, ScenarioConfig
from echo2.sim.learner import profile_at
from echo2.sim.simulator import simulate

HOSTS = {  # name: (rollouts/s, $/h), as fleet_ssh's seed-1 online controller measured them (d13365e)
    "h100": (117.0, 2.69), "a100": (80.5, 1.39), "l40s": (45.7, 0.79),
    "rtx4090-a": (27.1, 0.34), "rtx4090-b": (21.7, 0.34)}


def _fleet_ssh(engine_start_s: float = 0.0, **sim) -> ScenarioConfig:
    """fleet_ssh's five hosts and its run's activation settings, booting 18 s (4 s again)."""
    return ScenarioConfig.model_validate({
        "name": "fleet_ssh_online", "learner": {"price_per_hour": 22.32, "uplink_bps": 1e12},
        "workers": {name: {"rollouts_per_s": rate, "count": 1, "price_per_hour": price, "bandwidth_bps": 1e10,
                           "tasks_per_lease": 2, "start_delay_s": 18.0, "boot_s": 4.0, "engine_start_s": engine_start_s}
                    for name, (rate, price) in HOSTS.items()},
        "workload": {"params": 1e6, "prompts_per_step": 16, "group_size": 8, "step_time_s": 3.0, "max_staleness": 2,
                     "generation_time_s": 0.0, "uninformative_share": 0.2},
        "broadcast": {"topology": "ideal", "hop_latency_s": 0.0},
        "activation": {"control_period_s": 2.0, "headroom": 1.15, "margin": 0.1, "ewma_alpha": 0.2,
                       "scale_down_after_s": 30.0, "min_samples": 3, "probation_slots": 4, "probation_timeout_s": 120.0,
                       "provider": "ssh", "release_after_s": 15.0, "max_worker_share": 0.5},
        "sim": {"steps": 60, "seed": 1, "activation": "online", "online_pricing": "measured", "audit_share": 0.55,
                "max_sim_s": 3000.0, **sim},
    })


def test_a_segment_holds_from_its_step_and_gaps_take_the_workload():
    profile = [ProfileSegment(from_step=10, step_time_s=2.0), ProfileSegment(from_step=20, uninformative_share=0.5)]
    assert profile_at(profile, 0, 3.0, 0.1) == (3.0, 0.1)  # before the first segment
    assert profile_at(profile, 10, 3.0, 0.1) == (2.0, 0.1)
    assert profile_at(profile, 19, 3.0, 0.1) == (2.0, 0.1)
    assert profile_at(profile, 25, 3.0, 0.1) == (3.0, 0.5)  # its step time not given: the workload's
    assert profile_at([], 5, 3.0, 0.1) == (3.0, 0.1)


def test_the_replayed_step_times_set_the_run_length():
    flat = simulate(_fleet_ssh(activation="all"))
    slower = simulate(_fleet_ssh(activation="all", workload_profile=[{"from_step": 30, "step_time_s": 6.0}]))
    assert flat.finished and slower.finished
    # every host held: the learner is the bottleneck, so 30 steps at 6 s add about 90 s
    assert slower.wall_s - flat.wall_s == pytest.approx(30 * 3.0, rel=0.15)


def test_a_rising_uninformative_share_drops_more_and_the_controller_rents_more():
    flat = simulate(_fleet_ssh())
    rising = simulate(_fleet_ssh(workload_profile=[{"from_step": 30, "uninformative_share": 0.6}]))
    assert flat.finished and rising.finished
    share = lambda r: r.groups["dropped_uninformative"] / (r.groups["dropped_uninformative"] + r.groups["accepted"])  # noqa: E731
    assert share(flat) == pytest.approx(0.2, abs=0.05)
    # each step trains 16 groups out of 16 / (1 - d) scored: 30 steps at d 0.2, 30 at 0.6
    assert share(rising) == pytest.approx((0.2 / 0.8 + 0.6 / 0.4) / (1 / 0.8 + 1 / 0.4), abs=0.04)
    # the learner's need doubles over the second half: the online controller acquires the A100
    # again (the three cheapest no longer cover it), and the bill per step rises
    assert rising.acquires > flat.acquires
    assert rising.worker_hours["a100"] > 2 * flat.worker_hours["a100"]
    assert rising.billed_usd_per_step > 1.1 * flat.billed_usd_per_step


def test_segments_out_of_order_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="from_step values \\[10, 5\\]"):
        _fleet_ssh(workload_profile=[{"from_step": 10, "step_time_s": 1.0}, {"from_step": 5, "step_time_s": 2.0}])
    with pytest.raises(ValueError, match="uninformative_share"):
        _fleet_ssh(workload_profile=[{"from_step": 0, "uninformative_share": 1.0}])


def test_a_worker_loading_its_model_after_registering_bills_and_generates_nothing():
    ready = simulate(_fleet_ssh(activation="all"))
    loading = simulate(_fleet_ssh(engine_start_s=12.0, activation="all"))
    assert ready.finished and loading.finished
    # the first batch waits for the model loads (most of them: hosts that registered early load
    # while later ones boot); the run ends that much later and bills it
    assert 9.0 <= loading.first_wait_s - ready.first_wait_s <= 12.5
    assert loading.wall_s - ready.wall_s == pytest.approx(12.0, abs=3.0)
    assert loading.billed_s - ready.billed_s == pytest.approx(5 * 12.0, rel=0.25)

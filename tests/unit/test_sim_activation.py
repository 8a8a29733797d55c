"""Activation in the simulator: the coordinator's own ActivationController decides, the fleet
provider follows (idle workers bill, releasable ones are handed back), and the summary splits
worker-hours into active, idle and released."""

import pytest

from echo2.config.sim import ScenarioConfig
from echo2.policy.controller import ActivationController
from echo2.sim.control import Controller
from echo2.sim.dataplane import SimDataPlane
from echo2.sim.events import EventLoop
from echo2.sim.fleet import Fleet, build_workers
from echo2.sim.simulator import simulate

ACTIVATION = {"control_period_s": 10.0, "scale_down_after_s": 30.0, "release_after_s": 60.0,
              "probation_timeout_s": 120.0}


def _scenario(mode: str, provider: str = "local", **workers) -> ScenarioConfig:
    """B = 4 prompts x G = 4 every 10 s: 1.6 rollouts/s needed; ten cheap workers give 1/s each."""
    cheap = {"count": 10, "price_per_hour": 0.3, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9, **workers}
    return ScenarioConfig.model_validate({
        "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9},
        "workers": {"cheap": cheap, "dear": {"count": 2, "price_per_hour": 3.0, "rollouts_per_s": 1.0,
                                             "bandwidth_bps": 1e9}},
        "workload": {"params": 1e8, "prompts_per_step": 4, "group_size": 4, "step_time_s": 10.0,
                     "max_staleness": 3, "generation_time_s": 8.0, "load_time_s": 0.5},
        "activation": {**ACTIVATION, "provider": provider},
        "sim": {"steps": 300, "activation": mode, "generation_cv": 0.3, "max_sim_s": 20000.0},
    })


def test_the_simulator_drives_the_coordinators_controller():
    scenario = _scenario("online")
    loop = EventLoop()
    data = SimDataPlane(3, 4)
    controller = Controller(scenario, Fleet(scenario, build_workers(scenario), loop, data), loop, "online")
    assert type(controller.core) is ActivationController


def test_online_activation_acquires_a_cheap_cover_and_leaves_the_rest_unacquired():
    online, everyone = simulate(_scenario("online")), simulate(_scenario("all"))
    assert online.finished and everyone.finished
    assert online.utilization_steady >= 0.9  # the chosen set still feeds the learner
    hours = online.fleet_time_h
    assert hours["released"] > 0  # offered and never acquired: billed nothing
    assert hours["active"] < 0.5 * everyone.fleet_time_h["active"]
    assert everyone.fleet_time_h["idle"] == 0 and everyone.releases == 0
    assert online.fleet_cost < 0.6 * everyone.fleet_cost
    per_worker = online.to_dict(per_worker=True)["per_worker"]
    # the planner's choice from the catalog prior, from the first decision: two cheap workers
    # (1.6 rollouts/s needed, 1/s each), no dear one, and no worker rented then dropped
    assert sum(1 for w in per_worker if w["class"] == "cheap" and w["billed_s"] > 0) == 2
    assert all(w["billed_s"] == 0 for w in per_worker if w["class"] == "dear")
    assert online.acquires == 2 and online.controller_switches == 1


def test_online_pricing_by_measured_rate_alone_is_the_run_without_a_catalog():
    """sim.online_pricing = "measured" is `echo2 run` with no [activation] catalog: the controller
    has no planner model and no prior, so it measures offered workers on probation first, then
    covers the demand with the cheapest measured ones (and still saves against every worker)."""
    measured = _scenario("online").model_copy(deep=True)
    measured = ScenarioConfig.model_validate({**measured.model_dump(),
                                              "sim": {**measured.sim.model_dump(), "online_pricing": "measured"}})
    loop = EventLoop()
    fleet = Fleet(measured, build_workers(measured), loop, SimDataPlane(3, 4))
    assert Controller(measured, fleet, loop, "online").core.planned is None
    by_catalog = Controller(_scenario("online"), fleet, loop, "online").core
    assert by_catalog.planned is not None
    online, everyone = simulate(measured), simulate(_scenario("all"))
    assert online.finished and online.utilization_steady >= 0.9
    assert online.fleet_cost < 0.7 * everyone.fleet_cost
    assert online.controller_switches > 1  # probation first, then the measured cover: not the one-shot plan


def test_a_static_provider_runs_every_machine_and_bills_the_idle_ones():
    static, local = simulate(_scenario("online", provider="static")), simulate(_scenario("online"))
    assert static.releases == 0 and static.fleet_time_h["released"] == pytest.approx(0.0, abs=0.01)
    assert static.fleet_time_h["idle"] > local.fleet_time_h["idle"]
    assert static.fleet_cost > local.fleet_cost
    per_worker = static.to_dict(per_worker=True)["per_worker"]
    assert all(w["active_s"] + w["idle_s"] == pytest.approx(w["billed_s"]) for w in per_worker)
    assert static.utilization_steady >= 0.9


def test_a_preempted_active_worker_is_replaced_by_a_spare_of_its_class():
    scenario = _scenario("plan", mean_uptime_s=300.0, mean_downtime_s=2000.0)
    result = simulate(scenario)
    assert result.preemptions > 0 and result.finished
    rented_at_start = result.fleet["cheap"]
    joined = [w for w in result.to_dict(per_worker=True)["per_worker"] if w["class"] == "cheap" and w["billed_s"] > 0]
    assert len(joined) > rented_at_start  # spares took the preempted workers' places


def test_a_machine_bills_its_boot_and_registers_only_once_booted():
    """As the ssh and skypilot providers' ledgers bill: from the acquire, boot included. A machine
    rented at the start bills its start delay; one acquired during the run (boot_s) bills from
    the acquire and leases nothing until it has booted."""
    scenario = _scenario("online", start_delay_s=40.0, boot_s=25.0)
    loop, data = EventLoop(), SimDataPlane(3, 4)
    fleet = Fleet(scenario, build_workers(scenario), loop, data)
    registered: list[tuple[float, int]] = []
    fleet.on_registered = lambda w: registered.append((loop.now_s, w.index))
    first, later = fleet.workers[0], fleet.workers[1]
    first.rented = True
    loop.at(40.0, fleet.join, first, 40.0)
    loop.at(40.0, fleet.join, later, 40.0)  # up, not rented: bills nothing
    loop.at(100.0, fleet.rent, later, True)
    loop.run(horizon_s=110.0)
    assert registered == [(40.0, first.index)] and later.booting
    loop.at(130.0, fleet.rent, later, False)
    loop.run(horizon_s=140.0)
    assert registered[-1] == (125.0, later.index) and not later.booting
    fleet.close_billing()
    assert first.billed_s == pytest.approx(loop.now_s)  # from the start, its 40 s delay included
    assert later.billed_s == pytest.approx(30.0)  # from the acquire at 100 s to the release, boot included


def test_boot_time_costs_an_online_fleet_that_acquires_again():
    quick, slow = (simulate(_scenario("online", boot_s=boot)) for boot in (0.0, 120.0))
    assert quick.finished and slow.finished
    assert slow.fleet_cost > quick.fleet_cost



def test_the_simulated_audit_passes_trained_groups_and_tells_whose():
    """sim.audit_share: the learner's audit checks that share of each trained batch; each passed
    group is reported with its worker and its buffered number, as the coordinator reports them."""
    buffered, audited = [], []
    data = SimDataPlane(2, 2, audit_share=1.0)
    data.on_buffered = lambda worker, seq: buffered.append((worker, seq))
    data.on_audited = lambda worker, passed, seq: audited.append((worker, passed, seq))
    data.publish(0)
    assert data.lease(0, 2, worker="a") == 2 and data.lease(0, 1, worker="b") == 1
    data.submit(0, 2, worker="a")
    data.submit(0, 1, worker="b")
    assert buffered == [("a", 2), ("b", 3)]
    assert data.take_batch(0) is not None and audited == [("a", 2, 2)]  # the batch: a's two groups
    quiet = SimDataPlane(2, 2)  # no audit: nothing reported
    quiet.on_audited = lambda *args: audited.append(args)
    quiet.publish(0)
    quiet.lease(0, 2, worker="a")
    quiet.submit(0, 2, worker="a")
    assert quiet.take_batch(0) is not None and len(audited) == 1


def test_with_the_audit_a_rate_counts_only_once_two_of_its_groups_passed(monkeypatch):
    """As at the coordinator (policy.credit): the controller prices no worker by its measured
    rate before the audit has passed 2 of its trained groups, so its first cover comes later."""
    decided: list[tuple[float, str]] = []
    decide = ActivationController.decide

    def recorded(self, now):
        decision = decide(self, now)
        decided.append((now, decision.reason))
        return decision

    monkeypatch.setattr(ActivationController, "decide", recorded)

    def first_cover_s(audit_share: float) -> float:
        decided.clear()
        base = _scenario("online")
        scenario = ScenarioConfig.model_validate({**base.model_dump(), "sim": {
            **base.sim.model_dump(), "online_pricing": "measured", "audit_share": audit_share, "steps": 40}})
        assert simulate(scenario).finished
        return next(now for now, reason in decided if not reason.startswith("controller off"))

    assert first_cover_s(0.25) > first_cover_s(0.0)

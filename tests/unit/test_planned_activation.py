"""The online controller with an activation catalog (policy/planned.py): it decides with the
planner's model, the catalog's figures as the prior and the run's measurements in their place;
and the rate accounting that charges a worker for time it is too stale to work."""

from __future__ import annotations

from pathlib import Path

import pytest
from tests.unit.coordinator_helpers import FakeClock, event_records, lease, make_state, publish, submission

from echo2.config.activation import ActivationConfig
from echo2.config.catalog import PlanConfig
from echo2.config.run import RunConfig
from echo2.config.sim import load_scenario
from echo2.coordinator.records.errors import RequestError
from echo2.planner import make_plan
from echo2.planner.fleet import MeasuredOnTime, class_plans
from echo2.policy.controller import ActivationController
from echo2.protocol.messages import Heartbeat, RegisterRequest

ROOT = Path(__file__).resolve().parents[2]


def catalog(**dear) -> PlanConfig:
    """B = 4 x 4 every 10 s: 1.6 rollouts/s; cheap workers give 1/s each, dear ones 1/s at 3x."""
    return PlanConfig.model_validate({
        "learner": {"price_per_hour": 10.0, "uplink_bps": 1e9},
        "workers": {"cheap": {"count": 10, "price_per_hour": 0.3, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9},
                    "dear": {"count": 4, "price_per_hour": 0.9, "rollouts_per_s": 1.0, "bandwidth_bps": 1e9, **dear}},
        "workload": {"params": 1e8, "prompts_per_step": 4, "group_size": 4, "step_time_s": 10.0,
                     "max_staleness": 3, "generation_time_s": 8.0, "load_time_s": 0.5},
    })


def controller(plan: PlanConfig, **cfg) -> ActivationController:
    settings = ActivationConfig(**{"scale_down_after_s": 0.0, "probation_timeout_s": 120.0, **cfg})
    ctl = ActivationController(settings, batch_rollouts=plan.workload.batch_rollouts,
                               max_staleness=plan.workload.max_staleness, learner_price_per_hour=10.0,
                               now=0.0, catalog=plan)
    for name, cls in plan.workers.items():
        for i in range(cls.count):
            ctl.offer(f"{name}{i}", cls.price_per_hour, name)
    return ctl


def acquire(ctl: ActivationController, chosen: set[str]) -> None:
    """The provider starts what was chosen: each registers with its class."""
    for worker_id in sorted(chosen):
        view = ctl.workers[worker_id]
        if not view.alive:
            ctl.join(worker_id, view.price_per_hour, view.worker_class)


def deliver(ctl: ActivationController, worker_id: str, groups: int, admitted: int, busy_s: float,
            stale_s: float = 0.0) -> None:
    for i in range(groups):
        ctl.observe_outcome(worker_id, admitted=i < admitted)
    for beat in range(1, 4):
        ctl.observe_busy(worker_id, rollouts_total=16 * beat, busy_s_total=busy_s * beat / 3,
                         stale_s_total=stale_s * beat / 3)


def test_time_refused_as_too_stale_counts_against_a_workers_rate():
    ctl = ActivationController(ActivationConfig(), batch_rollouts=16, max_staleness=2, learner_price_per_hour=1.0,
                               now=0.0)
    ctl.join("slow", 0.1)
    ctl.join("fast", 0.1)
    ctl.observe_busy("slow", rollouts_total=100, busy_s_total=50.0, stale_s_total=50.0)
    ctl.observe_busy("fast", rollouts_total=100, busy_s_total=50.0)
    assert ctl.workers["slow"].rollouts_per_s.value == pytest.approx(1.0)  # 100 over 100 s working
    assert ctl.workers["fast"].rollouts_per_s.value == pytest.approx(2.0)
    assert ctl.workers["slow"].stale_share() == pytest.approx(0.5)
    # the next sample is over the new working time only, stale time included
    ctl.observe_busy("slow", rollouts_total=200, busy_s_total=60.0, stale_s_total=140.0)
    assert ctl.workers["slow"].rollouts_per_s.samples == 2
    assert ctl.workers["slow"].rollouts_per_s.value == pytest.approx(0.8 * 1.0 + 0.2 * 1.0)


def test_the_first_decision_is_the_planners_fleet_from_the_catalog_prior():
    """144 offered workers of the 8B scenario, nothing measured: the first decision is what
    `echo2 plan` rents, not the cheap RTX 4090s whose links take minutes per version."""
    plan_cfg = load_scenario(ROOT / "configs" / "sim" / "qwen3_8b.toml").plan_config()
    ctl = controller(plan_cfg, headroom=1.0)
    decision = ctl.decide(now=0.0)
    chosen: dict[str, int] = {}
    for worker_id in decision.active:
        cls = ctl.workers[worker_id].worker_class
        chosen[cls] = chosen.get(cls, 0) + 1
    planned = {c.name: c.chosen for c in make_plan(plan_cfg).classes if c.chosen}
    assert chosen == planned and "rtx4090_home" not in chosen and decision.changed
    assert all(ctl.workers[w].released for w in decision.active)  # chosen, to be acquired: none billed yet
    assert ctl.total_cost() == 0.0


def test_groups_dropped_as_stale_move_the_decision_to_another_class():
    ctl = controller(catalog())
    first = ctl.decide(now=0.0).active
    assert first == {"cheap0", "cheap1"}
    acquire(ctl, first)
    ctl.observe_step_time(10.0)
    for worker_id in first:  # a link slower than declared: 9 of 10 groups land too late
        deliver(ctl, worker_id, groups=20, admitted=2, busy_s=30.0)
    decision = ctl.decide(now=100.0)
    assert decision.changed and "current set gives" in decision.reason
    assert {ctl.workers[w].worker_class for w in decision.active} == {"dear"}
    assert decision.estimates == {"cheap": pytest.approx(0.1)}  # the measured on-time share


def test_time_too_stale_moves_the_decision_as_drops_do():
    ctl = controller(catalog())
    first = ctl.decide(now=0.0).active
    acquire(ctl, first)
    for worker_id in first:  # every group admitted, but idle for want of weights 80% of the time
        deliver(ctl, worker_id, groups=20, admitted=20, busy_s=20.0, stale_s=80.0)
    decision = ctl.decide(now=100.0)
    assert {ctl.workers[w].worker_class for w in decision.active} == {"dear"}


def test_a_declared_class_buys_nothing_after_probation_without_being_measured():
    ctl = controller(catalog(), probation_timeout_s=120.0)
    first = ctl.decide(now=0.0).active
    acquire(ctl, first)
    ctl.decide(now=60.0)
    kept = ctl.decide(now=119.0).active
    assert kept == first  # still believed
    later = ctl.decide(now=200.0).active  # active 200 s, never a rate sample: a claim, no more
    assert not later & first and len(later) == 2


def test_a_lost_worker_is_replaced_at_once_by_a_live_one_holding_weights():
    ctl = controller(catalog())
    first = ctl.decide(now=0.0).active
    acquire(ctl, first | {"cheap5"})  # cheap5 runs idle (a static provider's machine): it holds the version
    ctl.decide(now=1.0)
    ctl.vanish("cheap0")
    decision = ctl.decide(now=2.0)
    assert decision.active == {"cheap1", "cheap5"} and decision.changed
    assert "topped up" in decision.reason  # the survivor kept, one added: not a fresh fleet


def test_noisy_measurements_change_nothing():
    ctl = controller(catalog())
    first = ctl.decide(now=0.0).active
    acquire(ctl, first)
    changes = 0
    for k in range(1, 60):
        ctl.observe_step_time(10.0 * (1 + 0.03 * ((-1) ** k)))
        ctl.observe_swap(0.5 * (1 + 0.1 * ((-1) ** k)))
        for worker_id in first:
            ctl.observe_outcome(worker_id, admitted=k % 17 != 0)
        changes += ctl.decide(now=float(k)).changed
    assert changes == 0 and ctl.decide(now=100.0).active == first


def test_a_worker_the_audit_discredits_is_no_candidate():
    ctl = controller(catalog())
    first = ctl.decide(now=0.0).active
    acquire(ctl, first)
    ctl.observe_audit("cheap0", audited=4, failed=2)
    decision = ctl.decide(now=1.0)
    assert "cheap0" not in decision.active and len(decision.active) == 2


def test_unclassed_workers_fall_back_to_the_measured_rule():
    """A catalog, but no worker declared a class in it: the per-worker rule decides as before."""
    plan_cfg = catalog()
    ctl = ActivationController(ActivationConfig(), batch_rollouts=16, max_staleness=3, learner_price_per_hour=1.0,
                               now=0.0, catalog=plan_cfg)
    ctl.join("a", 0.1)
    ctl.join("b", 0.2, "no-such-class")
    assert ctl.decide(now=1.0).active == {"a", "b"}  # demand unknown, nothing measured: run all


def test_the_coordinator_counts_time_a_worker_is_too_stale_to_lease(tmp_path, tiny_model_dir):
    """Through the state machine: the worker's heartbeats say it holds version 0 while version 2
    is out (S = 1), so for 10 s it can get no work; that time joins its working time."""
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=1, groups_per_step=4)
    publish(state, 0)
    state.worker_desk.register(RegisterRequest(worker_id="slow", engine="hf", price_per_hour=0.1))
    task = lease(state, "slow", 0).tasks[0]
    clock.now += 2.0
    assert state.intake.submit(submission(state, "slow", task.lease_id, 0)).accepted
    publish(state, 1)
    publish(state, 2)
    state.worker_desk.heartbeat(Heartbeat(worker_id="slow", version=0, rollouts_total=0, busy_s_total=0.0))
    clock.now += 10.0
    state.worker_desk.heartbeat(Heartbeat(worker_id="slow", version=2, rollouts_total=0, busy_s_total=0.0))
    clock.now += 5.0  # fresh again: idle time now is not its fault
    task = lease(state, "slow", 2).tasks[0]
    clock.now += 2.0
    assert state.intake.submit(submission(state, "slow", task.lease_id, 2)).accepted
    view = state.controller.workers["slow"]
    assert view.stale_s_total == pytest.approx(10.0) and view.busy_s_total == pytest.approx(4.0)


def test_a_worker_too_stale_to_lease_is_left_out_of_a_short_fleet():
    """Demand above what everyone gives: all measured workers run, except one whose link keeps it
    too stale to lease (its rate decays toward 0 with every heartbeat's sample)."""
    ctl = ActivationController(ActivationConfig(min_samples=2), batch_rollouts=300, max_staleness=1,
                               learner_price_per_hour=0.0, now=0.0)
    for worker_id, price in (("slow", 0.1), ("fast1", 1.0), ("fast2", 2.0)):
        ctl.join(worker_id, price)
    for beat in range(1, 4):
        for worker_id in ("slow", "fast1", "fast2"):
            ctl.observe_busy(worker_id, rollouts_total=100 * beat, busy_s_total=float(beat))
    ctl.observe_step_time(1.0)  # 300 rollouts/s needed, 300 measured: with headroom, short
    assert ctl.decide(now=1.0).active == {"slow", "fast1", "fast2"}
    for beat in range(1, 30):  # slow: refused as too stale from now on, submitting nothing
        ctl.observe_busy("slow", rollouts_total=300, busy_s_total=3.0, stale_s_total=float(beat))
    decision = ctl.decide(now=2.0)
    assert decision.active == {"fast1", "fast2"} and "covers" in decision.reason


CATALOG_TOML = """
[learner]
price_per_hour = 10.0
uplink_bps = 1e9

[workers.cheap]
count = 10
price_per_hour = 0.3
rollouts_per_s = 1.0
bandwidth_bps = 1e9

[workers.dear]
count = 4
price_per_hour = 0.9
rollouts_per_s = 1.0
bandwidth_bps = 1e9

[workload]
params = 1e8
prompts_per_step = 32
group_size = 16
step_time_s = 10.0
max_staleness = 6
generation_time_s = 8.0
load_time_s = 0.5
"""


def test_a_run_with_a_catalog_chooses_among_registered_workers_by_the_planner(tmp_path, tiny_model_dir):
    """[activation] catalog on a real coordinator state: the run's S and batch replace the
    catalog's, declared classes are the prior, and a class the catalog lacks is refused."""
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG_TOML)
    run_cfg = RunConfig.model_validate({"run_dir": str(tmp_path / "run"), "activation": {"catalog": str(path)},
                                        "train": {"max_staleness": 3}, "grpo": {"prompts_per_step": 4},
                                        "sampling": {"group_size": 2}})
    catalog_cfg = run_cfg.activation_plan()
    assert catalog_cfg.workload.max_staleness == 3 and catalog_cfg.workload.prompts_per_step == 4
    assert catalog_cfg.workload.group_size == run_cfg.sampling.group_size
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=3, groups_per_step=4,
                       config={"activation": {"catalog": str(path)}})
    publish(state, 0)
    for worker_id, cls, price in (("c1", "cheap", 0.3), ("c2", "cheap", 0.3), ("d1", "dear", 0.9)):
        state.worker_desk.register(RegisterRequest(worker_id=worker_id, engine="hf", price_per_hour=price,
                                                   worker_class=cls))
    with pytest.raises(RequestError, match="not a class of the run's activation catalog"):
        state.worker_desk.register(RegisterRequest(worker_id="x", engine="hf", worker_class="h100"))
    clock.now += 1.0
    state.fleet_desk.control()
    decision = [e for e in event_records(state) if e["kind"] == "activation"]
    assert decision, [e for e in event_records(state)][-3:]
    decision = decision[-1]
    # 4 x 2 rollouts per 10 s (the catalog's step time, the prior): one cheap worker covers it
    assert decision["active"] == ["c1"] and "planned set" in decision["reason"], decision


def test_a_measured_on_time_share_holds_only_for_fleets_no_slower_than_it_was_measured_in():
    """Measured in a fast fleet, a class's kept share replaces the model's prediction there; in
    a fleet with a slower link (rounds end later for everyone) the model's prediction stands."""
    plan_cfg = load_scenario(ROOT / "configs" / "sim" / "qwen3_8b.toml").plan_config()
    measured = {"a100_spot": MeasuredOnTime(1.0, 10e9)}
    model = {c.name: c for c in class_plans(plan_cfg, 8, 0.5e9)}
    with_slow = {c.name: c for c in class_plans(plan_cfg, 8, 0.5e9, measured)}
    fast = {c.name: c for c in class_plans(plan_cfg, 8, 10e9, measured)}
    assert model["a100_spot"].on_time < 0.9
    assert with_slow["a100_spot"].on_time == model["a100_spot"].on_time
    assert fast["a100_spot"].on_time == 1.0


def test_echo2_run_offers_classed_local_workers_and_the_first_decision_picks_among_them_unstarted(
        tmp_path, tiny_model_dir):
    """Under the local provider the classed local workers are offered at the coordinator's start:
    the first decision, before any worker runs, chooses the catalog's covering set among them,
    and the launcher starts only those (launch/fleet.py). A class the catalog lacks is a config
    error, not a run that refuses its own workers."""
    path = tmp_path / "catalog.toml"
    path.write_text(CATALOG_TOML)
    fleet = [{"worker_class": "dear", "price_per_hour": 0.9}, {"worker_class": "cheap", "price_per_hour": 0.3},
             {"worker_class": "cheap", "price_per_hour": 0.3}, {"price_per_hour": 0.1}]
    data = {"run_dir": str(tmp_path / "run"), "activation": {"catalog": str(path), "provider": "local"},
            "train": {"max_staleness": 3}, "grpo": {"prompts_per_step": 4}, "sampling": {"group_size": 2},
            "workers": {"count": 4, "per_worker": fleet}}
    run_cfg = RunConfig.model_validate(data)
    assert run_cfg.workers_started_on_demand() == {"w0", "w1", "w2"}  # w3 declares no class: it starts
    static = RunConfig.model_validate({**data, "activation": {"catalog": str(path)}})
    assert static.workers_started_on_demand() == set()  # a static fleet's machines all run anyway
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=3, groups_per_step=4,
                       config={"activation": data["activation"], "workers": data["workers"]})
    clock.now += 1.0
    state.fleet_desk.control()
    decisions = [e for e in event_records(state) if e["kind"] == "activation"]
    assert decisions and decisions[-1]["active"] == ["w1"], decisions  # one cheap worker covers the prior
    assert not state.registry.workers  # nothing registered: it is the launcher's to start w1
    state.worker_desk.register(RegisterRequest(worker_id="w1", engine="hf", price_per_hour=0.3, worker_class="cheap"))
    assert state.controller.is_active("w1")
    bad = [*fleet[:3], {"worker_class": "h100"}]
    with pytest.raises(ValueError, match="local worker 3 has worker_class 'h100'.*classes: cheap, dear"):
        RunConfig.model_validate({**data, "workers": {"count": 4, "per_worker": bad}})

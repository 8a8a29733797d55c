"""Before demand or any worker's rate is known, the activation controller runs every worker, but
no more than twice a full lease window's groups ((S + 1) x prompts per step): as many as can
hold work at once, and as many again ready for the room one frees. Found at 10,000 simulated
workers (benchmarks/coordinator_load.py): with the audit on and nothing yet audited, every
worker was told to work, 66,000 lease requests were refused in a minute, and the learner
stopped."""

from __future__ import annotations

from echo2.config.activation import ActivationConfig
from echo2.policy.controller import ActivationController

FLEET = 10_000


def controller(*, groups_per_step: int | None, enabled: bool = True) -> ActivationController:
    ctl = ActivationController(ActivationConfig(enabled=enabled, min_samples=2), batch_rollouts=128, max_staleness=2,
                               learner_price_per_hour=10.0, now=0.0, min_passed_audits=2,
                               groups_per_step=groups_per_step)
    for index in range(FLEET):
        ctl.join(f"w{index:05d}", 1.0)
    return ctl


def test_a_large_unmeasured_fleet_runs_only_what_a_full_lease_window_can_give_work():
    ctl = controller(groups_per_step=16)
    decision = ctl.decide(now=1.0)
    assert len(decision.active) == 2 * 3 * 16
    assert decision.active == {f"w{index:05d}" for index in range(96)}  # the oldest registrations first
    assert f"{FLEET - 96} waiting" in decision.reason
    assert sum(view.active for view in ctl.workers.values()) == 96  # the others are told to idle


def test_probation_slots_turn_over_so_every_worker_gets_its_turn_to_be_measured():
    ctl = controller(groups_per_step=16)
    first = ctl.decide(now=1.0).active
    later = ctl.decide(now=1.0 + ctl.cfg.probation_timeout_s + 1.0).active
    assert len(later) == 96 and not first & later  # their time on probation is up: the next 96


def test_a_small_fleet_and_a_controller_turned_off_still_run_every_worker():
    assert len(controller(groups_per_step=16, enabled=False).decide(now=1.0).active) == FLEET
    assert len(controller(groups_per_step=None).decide(now=1.0).active) == FLEET  # no window given: no cap
    small = ActivationController(ActivationConfig(min_samples=2), batch_rollouts=128, max_staleness=2,
                                 learner_price_per_hour=10.0, now=0.0, groups_per_step=16)
    for index in range(90):
        small.join(f"s{index}", 1.0)
    assert len(small.decide(now=1.0).active) == 90

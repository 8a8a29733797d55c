"""Credit only for checked work (issue 24): a worker returning groups without generating them was
measured at 780 rollouts/s and 7 s later was the only active worker. The controller now credits
no worker with more than activation.max_worker_share of the demand while other measured workers
are live, and scales a worker's rate down by its failed audits (policy/credit.py)."""

from __future__ import annotations

import pytest
from tests.unit.coordinator_helpers import FakeClock, event_records, lease, make_state, publish, submission

from echo2.config.activation import ActivationConfig
from echo2.policy.controller import ActivationController
from echo2.policy.credit import audit_credit
from echo2.protocol.learner_api import AuditReport, GroupAudit
from echo2.protocol.messages import Heartbeat, RegisterRequest


def controller(prices: dict[str, float], **cfg) -> ActivationController:
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0, **cfg), batch_rollouts=128,
                               max_staleness=2, learner_price_per_hour=10.0, now=0.0)
    for worker_id, price in prices.items():
        ctl.join(worker_id, price)
    return ctl


def feed(ctl: ActivationController, rates: dict[str, float]) -> None:
    """Three samples of `rate` rollouts per busy second each; the learner steps in 1 s (128/s needed)."""
    for beat in range(1, 4):
        ctl.observe_step_time(1.0)
        for worker_id, rate in rates.items():
            ctl.observe_busy(worker_id, rollouts_total=int(rate * beat), busy_s_total=float(beat))


def test_a_fake_fast_worker_never_becomes_the_only_active_worker_while_others_are_live_and_measured():
    ctl = controller({"fake": 0.0, "h1": 1.0, "h2": 2.0})
    feed(ctl, {"fake": 100_000.0, "h1": 100.0, "h2": 100.0})
    decision = ctl.decide(now=10.0)
    assert decision.active == {"fake", "h1"}  # free and, by its numbers, fast: it runs, never alone
    assert decision.estimates["fake"] == pytest.approx(100_000.0)  # measured as it is; credited at most half
    ctl.vanish("h1")
    assert ctl.decide(now=11.0).active == {"fake", "h2"}
    ctl.vanish("h2")
    assert ctl.decide(now=12.0).active == {"fake"}  # no other live worker: it carries the run alone
    uncapped = controller({"fake": 0.0, "h1": 1.0, "h2": 2.0}, max_worker_share=1.0)
    feed(uncapped, {"fake": 100_000.0, "h1": 100.0, "h2": 100.0})
    assert uncapped.decide(now=10.0).active == {"fake"}  # what the attack did, with the cap turned off


def test_a_worker_whose_groups_failed_the_audit_loses_its_credit():
    ctl = controller({"cheap": 1.0, "dear1": 5.0, "dear2": 5.0})
    feed(ctl, dict.fromkeys(("cheap", "dear1", "dear2"), 100.0))
    assert "cheap" in ctl.decide(now=10.0).active
    ctl.observe_audit("cheap", audited=4, failed=4)
    decision = ctl.decide(now=11.0)
    assert decision.estimates["cheap"] == 0.0 and decision.active == {"dear1", "dear2"}
    ctl.join("cheap", 1.0)  # registering again does not wash the record
    assert ctl.decide(now=12.0).estimates["cheap"] == 0.0
    assert audit_credit(0, 0) == 1.0 and audit_credit(100, 1) == pytest.approx(99 / 109)
    assert audit_credit(10, 5) == pytest.approx(5 / 55)


def _round(state, worker_id: str, gen_s: float) -> None:
    task = lease(state, worker_id, 0).tasks[0]
    state.clock.now += gen_s
    assert state.intake.submit(submission(state, worker_id, task.lease_id, 0)).accepted


def test_the_coordinator_keeps_two_workers_and_takes_a_failed_workers_credit(tmp_path, tiny_model_dir):
    """Through the state machine: the fake worker submits 60 ms after each lease (and claims a
    million rollouts/s in its heartbeats); the honest ones take a second per lease."""
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=2, groups_per_step=4,
                       activation=ActivationConfig(min_samples=2, scale_down_after_s=0.0))
    publish(state, 0)
    for worker_id, price in (("fake", 0.0), ("h1", 1.0), ("h2", 2.0)):
        state.worker_desk.register(RegisterRequest(worker_id=worker_id, engine="hf", price_per_hour=price))
    for _ in range(2):
        for worker_id, gen_s in (("fake", 0.06), ("h1", 1.0), ("h2", 1.0)):
            _round(state, worker_id, gen_s)
    state.worker_desk.heartbeat(Heartbeat(worker_id="fake", version=0, rollouts_total=10**6, busy_s_total=1.0))
    state.learner_desk.observe_step_time(10.0)  # 8 rollouts per 10 s step: any one worker covers it by its numbers
    clock.now += 1.0
    state.fleet_desk.control()
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert decision["estimates_rps"]["fake"] > 10 * decision["estimates_rps"]["h1"]
    assert decision["active"] == ["fake", "h1"]

    fake_group = next(g for g in state.groups.buffer if g.worker_id == "fake")
    verdict = GroupAudit(lease_id=fake_group.lease_id, worker_id="fake", version=0, tokens=8,
                         mean_abs_logprob_diff=3.0, recomputed=False, failed=True)
    # one failure: not yet quarantined
    assert state.learner_desk.record_audit(AuditReport(step=0, groups=[verdict])) == []
    clock.now += 1.0
    state.fleet_desk.control()
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert decision["estimates_rps"]["fake"] == 0.0 and decision["active"] == ["h1", "h2"]

"""Credit only for checked work (issues 24 and 42): a worker returning groups without generating
them was measured at 780 rollouts/s and 7 s later was the only active worker; later, capped at
half the demand, it still switched off 2 of 4 honest workers before any of its groups was
audited. Now, while the run audits, a worker's rate counts only once the audit has passed some
of its groups (before that it is on probation and covers no demand), no worker is credited with
more than activation.max_worker_share of the demand while other measured workers are live, and
a worker's rate is scaled down by its failed audits (policy/credit.py)."""

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


def test_the_coordinator_credits_no_unaudited_rate_and_takes_a_failed_workers_credit(tmp_path, tiny_model_dir):
    """Through the state machine: the fake worker submits 60 ms after each lease (and claims a
    million rollouts/s in its heartbeats); the honest ones take a second per lease. Until the
    audit has passed some of its groups, its rate covers no demand; the honest workers, once
    checked, are chosen as if it were not there."""
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
    state.fleet_desk.control(trigger="test")
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert decision["estimates_rps"] == {}  # measured, never checked: nobody's rate counts yet
    assert decision["active"] == ["fake", "h1", "h2"]
    state.learner_desk.record_audit(AuditReport(step=0, groups=[_verdict(state, w, failed=False)
                                                                 for w in ("h1", "h2") for _ in range(2)]))
    clock.now += 1.0
    state.fleet_desk.control(trigger="test")
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert set(decision["estimates_rps"]) == {"h1", "h2"}  # the fake one's rate is not on offer
    assert decision["active"] == ["fake", "h1", "h2"]  # both honest kept (the share cap); fake on probation

    # one failure: not yet quarantined, and its credit is gone for good
    assert state.learner_desk.record_audit(AuditReport(step=0, groups=[_verdict(state, "fake", failed=True)])) == []
    clock.now += 1.0
    state.fleet_desk.control(trigger="test")
    decision = [e for e in event_records(state) if e["kind"] == "activation"][-1]
    assert "fake" not in decision["estimates_rps"] and {"h1", "h2"} <= set(decision["active"])


def _verdict(state, worker_id: str, *, failed: bool) -> GroupAudit:
    group = next(g for g in state.groups.buffer if g.worker_id == worker_id)
    return GroupAudit(lease_id=group.lease_id, worker_id=worker_id, version=0, tokens=8,
                      mean_abs_logprob_diff=3.0 if failed else 0.0, recomputed=False, failed=failed)


def test_a_fast_unaudited_worker_releases_no_honest_machine():
    """The issue's numbers: four honest workers at 100 rollouts/s each, the demand needing three of
    them, and a free worker measured at 794 rollouts/s before any of its groups was audited."""
    def active(with_fake: bool, min_passed_audits: int = 2) -> set[str]:
        prices = {"h1": 1.0, "h2": 1.5, "h3": 2.0, "h4": 4.0, **({"fake": 0.0} if with_fake else {})}
        ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0), batch_rollouts=256,
                                   max_staleness=2, learner_price_per_hour=10.0, now=0.0,
                                   min_passed_audits=min_passed_audits)
        for worker_id, price in prices.items():
            ctl.join(worker_id, price)
        feed(ctl, {w: 100.0 for w in ("h1", "h2", "h3", "h4")} | ({"fake": 794.0} if with_fake else {}))
        for worker_id in ("h1", "h2", "h3", "h4"):
            ctl.observe_audit(worker_id, audited=3, failed=0)
        chosen = set()
        for now in (10.0, 20.0, 30.0):  # decisions over time: none switches an honest worker off
            decision = ctl.decide(now=now)
            chosen |= decision.active
            assert min_passed_audits == 0 or "fake" not in decision.estimates
        return chosen

    assert active(with_fake=True) - {"fake"} == active(with_fake=False) == {"h1", "h2", "h3"}
    assert active(with_fake=True, min_passed_audits=0) == {"fake", "h1", "h2"}  # rates as measured: h3 off


def test_an_honest_worker_is_credited_once_its_audits_pass():
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0), batch_rollouts=128,
                               max_staleness=2, learner_price_per_hour=10.0, now=0.0, min_passed_audits=2)
    ctl.join("h1", 1.0)
    feed(ctl, {"h1": 150.0})
    assert ctl.decide(now=10.0).estimates == {}  # measured but unchecked: probation
    ctl.observe_audit("h1", audited=1, failed=0)
    assert ctl.decide(now=11.0).estimates == {}
    ctl.observe_audit("h1", audited=2, failed=0)
    assert ctl.decide(now=12.0).estimates["h1"] == pytest.approx(150.0)  # its full measured rate

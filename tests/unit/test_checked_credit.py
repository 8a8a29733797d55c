"""Credit only for checked work (issues 24 and 42): a worker returning groups without generating
them was measured at 780 rollouts/s and 7 s later was the only active worker; later, capped at
half the demand, it still switched off 2 of 4 honest workers before any of its groups was
audited. Now, while the run audits, a worker's rate counts only once the audit has passed some
of its groups (before that it is on probation and covers no demand), and then only up to the
rate it had when it delivered its newest group that passed (a rate it reached since,
unchecked, adds nothing); no worker is credited with more than
activation.max_worker_share of the demand while other measured workers are live, and a worker's
rate is scaled down by its failed audits (policy/credit.py)."""

from __future__ import annotations

import pytest
from tests.unit.coordinator_helpers import FakeClock, event_records, lease, make_state, publish, submission

from echo2.config.activation import ActivationConfig
from echo2.policy.controller import ActivationController
from echo2.policy.credit import audit_credit, credited_rps
from echo2.policy.worker_view import MAX_RATE_NOTES
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
    decision = _decision(state)
    assert decision["estimates_rps"] == {}  # measured, never checked: nobody's rate counts yet
    assert decision["active"] == ["fake", "h1", "h2"]
    state.learner_desk.record_audit(AuditReport(step=0, groups=[_verdict(state, w, failed=False, nth=n)
                                                                 for w in ("h1", "h2") for n in (0, 1)]))
    decision = _decision(state)
    assert set(decision["estimates_rps"]) == {"h1", "h2"}  # the fake one's rate is not on offer
    assert decision["active"] == ["fake", "h1", "h2"]  # both honest kept (the share cap); fake on probation

    # one failure: not yet quarantined, and its credit is gone for good
    assert state.learner_desk.record_audit(AuditReport(step=0, groups=[_verdict(state, "fake", failed=True)])) == []
    decision = _decision(state)
    assert "fake" not in decision["estimates_rps"] and {"h1", "h2"} <= set(decision["active"])


def _verdict(state, worker_id: str, *, failed: bool, nth: int = 0) -> GroupAudit:
    """The learner's verdict on the worker's `nth` buffered group."""
    group = [g for g in state.groups.buffer if g.worker_id == worker_id][nth]
    return GroupAudit(lease_id=group.lease_id, worker_id=worker_id, version=0, tokens=8,
                      mean_abs_logprob_diff=3.0 if failed else 0.0, recomputed=False, failed=failed)


def _decision(state) -> dict:
    """A control period later: the activation decision's record."""
    state.clock.now += 1.0
    state.fleet_desk.control(trigger="test")
    return [e for e in event_records(state) if e["kind"] == "activation"][-1]


def test_the_coordinator_credits_a_rate_only_as_far_as_the_audit_has_passed_its_groups(tmp_path, tiny_model_dir):
    """Through the state machine: a worker delivers a group a second (2 rollouts/s) and the
    audit passes two of them; then it returns its groups ten times as fast. That rate is
    credited only once the audit passes one of the faster groups."""
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=2, groups_per_step=4,
                       activation=ActivationConfig(min_samples=2, scale_down_after_s=0.0))
    publish(state, 0)
    state.worker_desk.register(RegisterRequest(worker_id="w", engine="hf", price_per_hour=1.0))
    for _ in range(3):
        _round(state, "w", 1.0)
    state.learner_desk.observe_step_time(10.0)
    passed = [_verdict(state, "w", failed=False, nth=n) for n in (1, 2)]
    state.learner_desk.record_audit(AuditReport(step=0, groups=passed))
    assert _decision(state)["estimates_rps"]["w"] == pytest.approx(2.0)
    for _ in range(6):
        _round(state, "w", 0.1)
    measured = state.controller.workers["w"].rollouts_per_s.value
    assert measured > 10.0 and _decision(state)["estimates_rps"]["w"] == pytest.approx(2.0)  # not yet checked
    state.learner_desk.record_audit(AuditReport(step=1, groups=[_verdict(state, "w", failed=False, nth=-1)]))
    assert _decision(state)["estimates_rps"]["w"] == pytest.approx(measured)


HONEST = {"h1": 1.0, "h2": 1.5, "h3": 2.0, "h4": 4.0}


class Meter:
    """Each worker's running counters (rollouts, busy seconds), as the coordinator keeps them, fed
    to the controller one second of work at a time, each second one group of each worker
    buffered in turn (the run's sequence numbers); the learner steps in 1 s."""

    def __init__(self, ctl: ActivationController) -> None:
        self.ctl, self.totals, self.seq = ctl, {}, -1
        self.newest: dict[str, int] = {}
        """Each worker's newest buffered group's sequence number."""

    def work(self, rates: dict[str, float], seconds: int = 3) -> None:
        for _ in range(seconds):
            self.ctl.observe_step_time(1.0)
            for worker_id, rate in rates.items():
                rollouts, busy_s = self.totals.get(worker_id, (0, 0.0))
                self.totals[worker_id] = (rollouts + int(rate), busy_s + 1.0)
                self.ctl.observe_busy(worker_id, *self.totals[worker_id])
                self.seq += 1
                self.ctl.observe_buffered(worker_id, self.seq)
                self.newest[worker_id] = self.seq

    def passed(self, worker_id: str, *, audited: int) -> None:
        """The audit's record of the worker: `audited` groups passed, its newest one among them."""
        self.ctl.observe_audit(worker_id, audited=audited, failed=0, newest_passed_seq=self.newest[worker_id])


def four_honest_and(fake: str | None, min_passed_audits: int = 2) -> tuple[ActivationController, Meter]:
    """The issue's fleet: four honest workers at 100 rollouts/s each, measured and checked, and a
    demand of 340 rollouts/s that needs all four (x 1.15 headroom: 391); with `fake`, a free
    worker too."""
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0), batch_rollouts=340,
                               max_staleness=2, learner_price_per_hour=10.0, now=0.0,
                               min_passed_audits=min_passed_audits)
    for worker_id, price in (HONEST | ({fake: 0.0} if fake else {})).items():
        ctl.join(worker_id, price)
    meter = Meter(ctl)
    meter.work(dict.fromkeys(HONEST, 100.0))
    for worker_id in HONEST:
        meter.passed(worker_id, audited=3)
    return ctl, meter


def honest_active(ctl: ActivationController, meter: Meter, rates: dict[str, float], times: range) -> list[set[str]]:
    """The honest workers active at each decision while everyone works at `rates`."""
    chosen = []
    for now in times:
        meter.work(rates, seconds=1)
        chosen.append(ctl.decide(now=float(now)).active & set(HONEST))
    return chosen


def test_a_fast_unaudited_worker_releases_no_honest_machine():
    """The issue's numbers: a free worker measured at 794 rollouts/s before any of its groups was
    audited. Credited with it (capped at half the demand), it switched off 2 of the 4 honest
    workers, whose machines the ssh or skypilot provider would have released. Credited only for
    checked work, it switches off none at any decision, and once its audited groups fail it is
    credited nothing."""
    rates = dict.fromkeys(HONEST, 100.0) | {"fake": 794.0}
    ctl, meter = four_honest_and(None)
    assert honest_active(ctl, meter, dict.fromkeys(HONEST, 100.0), range(10, 20)) == [set(HONEST)] * 10
    ctl, meter = four_honest_and("fake")
    assert honest_active(ctl, meter, rates, range(10, 20)) == [set(HONEST)] * 10  # never one switched off
    assert "fake" not in ctl.decide(now=20.0).estimates  # measured at 794/s, credited with none of it
    ctl.observe_audit("fake", audited=2, failed=2)  # what the audit finds in groups it never generated
    assert credited_rps(ctl.workers["fake"]) == 0.0
    assert honest_active(ctl, meter, rates, range(21, 30)) == [set(HONEST)] * 9

    trusting, meter = four_honest_and("fake", min_passed_audits=0)  # rates as measured: what the issue saw
    # from its second rate sample on (min_samples), two honest workers are switched off
    assert [len(active) for active in honest_active(trusting, meter, rates, range(10, 14))] == [4, 2, 2, 2]


def test_a_worker_checked_at_one_rate_is_not_credited_for_a_faster_unchecked_one():
    """A free worker generates honestly at 30 rollouts/s, and the audit passes those groups; then
    it returns groups it never generated, measured at 794/s. Until the audit passes one of those
    it is credited 30/s, so no honest worker is switched off (credited its measured rate once its
    first groups passed, as before, it switched off one honest worker, then two); its failed
    groups then cut even that."""
    ctl, meter = four_honest_and("fake")
    meter.work({"fake": 30.0})
    meter.passed("fake", audited=3)
    assert ctl.decide(now=10.0).estimates["fake"] == pytest.approx(30.0)
    checked_seq = meter.newest["fake"]
    rates = dict.fromkeys(HONEST, 100.0) | {"fake": 794.0}
    assert honest_active(ctl, meter, rates, range(11, 20)) == [set(HONEST)] * 9
    assert ctl.workers["fake"].rollouts_per_s.value > 500.0
    assert ctl.decide(now=20.0).estimates["fake"] == pytest.approx(30.0)
    ctl.observe_audit("fake", audited=5, failed=2, newest_passed_seq=checked_seq)  # its later groups fail
    assert ctl.decide(now=21.0).estimates["fake"] == pytest.approx(30.0 * 3 / 23)


def test_an_honest_worker_is_credited_once_its_audits_pass():
    """Probation until two of its groups pass, then its full measured rate; a worker that got
    faster is credited the new rate once the audit passes a group it delivered at it."""
    ctl = ActivationController(ActivationConfig(min_samples=2, scale_down_after_s=0.0), batch_rollouts=128,
                               max_staleness=2, learner_price_per_hour=10.0, now=0.0, min_passed_audits=2)
    ctl.join("h1", 1.0)
    meter = Meter(ctl)
    meter.work({"h1": 150.0})
    assert ctl.decide(now=10.0).estimates == {}  # measured but unchecked: probation
    meter.passed("h1", audited=1)
    assert ctl.decide(now=11.0).estimates == {}
    meter.passed("h1", audited=2)
    assert ctl.decide(now=12.0).estimates["h1"] == pytest.approx(150.0)  # its full measured rate
    meter.work({"h1": 200.0}, seconds=10)
    measured = ctl.workers["h1"].rollouts_per_s.value
    assert measured > 190.0 and ctl.decide(now=13.0).estimates["h1"] == pytest.approx(150.0)
    meter.passed("h1", audited=4)
    assert ctl.decide(now=14.0).estimates["h1"] == pytest.approx(measured)


def test_a_worker_never_passed_keeps_a_bounded_record():
    """One rate note per buffered group, at most MAX_RATE_NOTES for a worker the audit never
    passes; a pass drops the notes before the passed group."""
    ctl = ActivationController(ActivationConfig(min_samples=2), batch_rollouts=128, max_staleness=2,
                               learner_price_per_hour=10.0, now=0.0, min_passed_audits=2)
    ctl.join("w", 1.0)
    meter = Meter(ctl)
    meter.work({"w": 10.0}, seconds=MAX_RATE_NOTES + 100)
    notes = ctl.workers["w"].rate_notes
    assert len(notes) == MAX_RATE_NOTES and notes[0][0] == 100
    ctl.observe_audit("w", audited=2, failed=0, newest_passed_seq=1000)
    assert notes[0][0] == 1000 and len(notes) == MAX_RATE_NOTES + 100 - 1000
    assert credited_rps(ctl.workers["w"]) == pytest.approx(10.0)

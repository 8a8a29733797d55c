"""The coordinator's side of the rollout audit: per-worker statistics, quarantine after
`audit_flags_to_quarantine` failed groups (kept across restarts), the quarantined worker's
groups dropped and its prompts redone, and a skipped step's honest groups handed back."""

from __future__ import annotations

import pytest
from tests.unit.coordinator_helpers import (
    FakeClock,
    event_records,
    lease,
    make_state,
    publish,
    register,
    submission,
)

from echo2.config.activation import ActivationConfig
from echo2.coordinator.http.view import snapshot
from echo2.coordinator.records.errors import RequestError
from echo2.protocol.learner_api import AuditReport, GroupAudit, VersionCheck
from echo2.protocol.messages import RegisterRequest


@pytest.fixture
def clock():
    return FakeClock()


def verdict(group: dict, failed: bool, diff: float | None = None) -> GroupAudit:
    return GroupAudit(lease_id=group.lease_id, worker_id=group.worker_id, version=group.version, tokens=8,
                      mean_abs_logprob_diff=diff if diff is not None else (3.0 if failed else 2e-7),
                      recomputed=False, failed=failed)


def fill(state, worker_id: str, groups: int) -> None:
    for _ in range(groups):
        task = lease(state, worker_id, 0).tasks[0]
        assert state.intake.submit(submission(state, worker_id, task.lease_id, 0)).accepted


def test_a_worker_failing_the_audit_twice_is_quarantined_for_good(tmp_path, tiny_model_dir, clock):
    # max_worker_share 1: oldest-first batches may be one worker's (the share cap is test_lease_trust's)
    state = make_state(tmp_path, tiny_model_dir, clock, groups_per_step=2,
                       activation=ActivationConfig(max_worker_share=1.0))
    publish(state, 0)
    for w in ("honest", "liar"):
        register(state, w)
    fill(state, "liar", 2)
    fill(state, "honest", 2)
    batch = state.learner_desk.take_batch(0)  # the liar's two groups: the oldest
    assert [g.worker_id for g in batch] == ["liar", "liar"]

    # the learner found one of them fabricated and skipped the step
    report = AuditReport(step=0, groups=[verdict(batch[0], True), verdict(batch[1], False)])
    assert state.learner_desk.record_audit(report) == []
    state.learner_desk.reject_batch(0, "rollout audit", [batch[1].lease_id])
    assert state.audit.workers["liar"].failed == 1 and state.counters.rejected_by_learner == 1
    assert [g.lease_id for g in state.groups.buffer][0] == batch[1].lease_id  # back at the head
    assert state.leases_book.queue[0] == batch[0].prompt_index  # the failed group's prompt is redone

    # a retried report of the same failure counts once
    state.learner_desk.record_audit(AuditReport(step=0, groups=[verdict(batch[0], True)]))
    assert state.audit.workers["liar"].failed == 1

    held = lease(state, "liar", 0).tasks
    batch = state.learner_desk.take_batch(0)
    assert state.learner_desk.record_audit(AuditReport(step=0, groups=[verdict(batch[0], True)])) == ["liar"]
    event = next(e for e in event_records(state) if e["kind"] == "worker_quarantined")
    assert event["worker_id"] == "liar" and "2 of its groups failed" in event["reason"]
    assert event["leases_requeued"] == len(held)
    state.learner_desk.reject_batch(0, "rollout audit", [g.lease_id for g in batch])
    assert all(g.worker_id == "honest" for g in state.groups.buffer)  # none of the liar's groups remain
    assert state.counters.dropped_quarantined + state.counters.rejected_by_learner >= 2

    for call in (lambda: lease(state, "liar", 0), lambda: register(state, "liar")):
        with pytest.raises(RequestError, match="quarantined: rollout audit") as err:
            call()
        assert err.value.status == 403
    assert snapshot(state)["audit"]["quarantined"].keys() == {"liar"}

    # a restarted coordinator still refuses it
    state.store.close()
    again = make_state(tmp_path, tiny_model_dir, clock, groups_per_step=2)
    with pytest.raises(RequestError, match="quarantined"):
        again.worker_desk.register(RegisterRequest(worker_id="liar", engine="hf"))


def test_honest_verdicts_only_build_statistics(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, groups_per_step=2)
    publish(state, 0)
    register(state, "a")
    fill(state, "a", 2)
    batch = state.learner_desk.take_batch(0)
    state.learner_desk.record_audit(AuditReport(step=0, groups=[verdict(g, False, diff=1e-6 * (i + 1))
                                                   for i, g in enumerate(batch)]))
    stats = snapshot(state)["audit"]["workers"]["a"]
    assert stats == {"audited": 2, "failed": 0, "max_passed_diff": 2e-6, "max_failed_diff": 0.0, "held_out": 0,
                     "version_evidence_nats": 0.0}
    assert not state.audit.quarantined and len(lease(state, "a", 0).tasks) == 1


def test_the_quarantine_reason_names_the_check_that_failed():
    from echo2.coordinator.parts.audit import AuditLedger

    def failing(lease_id: str, sampler: int | None, diff: float) -> GroupAudit:
        return GroupAudit(lease_id=lease_id, worker_id="w", version=3, tokens=8, mean_abs_logprob_diff=diff,
                          recomputed=True, failed=True, sampler_violations=sampler)

    chooser, liar = AuditLedger(flags_to_quarantine=2), AuditLedger(flags_to_quarantine=2)
    assert chooser.record(AuditReport(step=0, groups=[failing("a", 5, 1e-6)])) == {}
    (why,) = chooser.record(AuditReport(step=1, groups=[failing("b", 3, 1e-6)])).values()
    assert "recomputed under version 3: 3 of its tokens are not the seeded sampler's choice" in why
    assert "nats" not in why  # its log-probs were true: saying they differed would mislead
    liar.record(AuditReport(step=0, groups=[failing("a", 0, 2.5)]))
    (why,) = liar.record(AuditReport(step=1, groups=[failing("b", None, 2.5)])).values()
    assert "tokens differ from that version's log-probs by 2.5 nats per token" in why


def test_a_new_worker_is_always_audited_and_a_leaning_one_held_out_with_its_prompts_redone(tmp_path, tiny_model_dir,
                                                                                           clock):
    state = make_state(tmp_path, tiny_model_dir, clock, groups_per_step=2,
                       activation=ActivationConfig(max_worker_share=1.0), config={"audit": {"proven_groups": 2}})
    publish(state, 0)
    register(state, "w")
    fill(state, "w", 2)
    batch = state.learner_desk.take_batch(0)
    assert [g.audit for g in batch] == ["unproven", "unproven"]  # not yet audited proven_groups times
    state.learner_desk.record_audit(AuditReport(step=0, groups=[verdict(g, False) for g in batch]))
    fill(state, "w", 1)
    assert state.groups.buffer[-1].audit == "by_chance"  # proven: checked by the keyed draw

    # its tokens fit the version 1 older at 3 positions: the evidence leans against it (and one
    # offset leaning is enough: the other offsets' evidence does not average it away)
    leaning = verdict(state.groups.buffer[-1], False).model_copy(
        update={"lease_id": "x", "version_checks": [VersionCheck(offset=1, claimed=0, older=3)], "held_out": True})
    assert state.learner_desk.record_audit(AuditReport(step=0, groups=[leaning])) == []
    assert 0 < state.audit.workers["w"].version_evidence_nats < state.audit.evidence.bound_nats
    fill(state, "w", 1)
    assert state.groups.buffer[-1].audit == "hold_out"
    assert snapshot(state)["audit"]["workers"]["w"]["held_out"] == 1

    # the learner held a group out of step 1: the others go back, its prompt is redone, nothing failed
    publish(state, 1)
    batch = state.learner_desk.take_batch(1)
    held = verdict(batch[0], False).model_copy(update={"held_out": True})
    state.learner_desk.record_audit(AuditReport(step=1, groups=[held]))
    state.learner_desk.reject_batch(1, "rollout audit: held out", [g.lease_id for g in batch[1:]])
    assert state.leases_book.queue[0] == batch[0].prompt_index
    assert [g.lease_id for g in state.groups.buffer][:1] == [batch[1].lease_id]
    assert state.audit.workers["w"].failed == 0 and state.audit.workers["w"].held_out == 2
    assert not state.audit.quarantined

"""Dynamic sampling at the coordinator (grpo.drop_uninformative_groups): a scored group whose
rewards all equal each other is counted and never reaches a batch, its prompt is done (never
leased again), the lease window refills the batch with other prompts so a step still trains P
informative groups, and the counts reach the batch record, the persisted counters, the run
view, Prometheus and the summary. With the setting off such a group trains, as before."""

from __future__ import annotations

from prometheus_client.core import Metric
from tests.unit.coordinator_helpers import (
    KEEP_ALIKE,
    FakeClock,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
    submission,
)

from echo2.coordinator.http.history import RunHistory
from echo2.coordinator.http.prometheus import _run_metrics
from echo2.coordinator.http.view import run_view
from echo2.coordinator.records.store import Store
from echo2.coordinator.state import CoordinatorState
from echo2.report.summary import summarize


def _ready(state: CoordinatorState) -> None:
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)


def _batch_records(state: CoordinatorState) -> list[dict]:
    return [r for r in event_records(state) if r["kind"] == "batch_assigned"]


def test_an_uninformative_group_is_counted_never_trained_and_its_prompt_is_done(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2)
    _ready(state)
    alike, *kept = lease(state, "a", 0, max_tasks=2).tasks
    dropped_prompt = state.leases_book.leases[alike.lease_id].prompt_index
    reply = state.intake.submit(submission(state, "a", alike.lease_id, 0, alike=True))
    assert reply.accepted and reply.rewards == [1.0, 1.0] and "uninformative" in reply.reason
    assert state.counters.dropped_uninformative == 1 and state.counters.scored == 1
    assert state.counters.accepted == 0 and state.groups.buffer == [] and alike.lease_id not in state.leases_book.leases
    assert dropped_prompt not in state.store.pending_prompts()  # done: a restart does not lease it again
    dropped = [r for r in event_records(state) if r["kind"] == "groups_dropped"]
    assert dropped == [{"kind": "groups_dropped", "reason": "uninformative", "step": 0,
                        "prompt_indices": [dropped_prompt], "straddling": 0}]
    # the worker is credited with delivered work: its group counts as admitted, not stale
    assert state.controller.workers["a"].admitted.value == 1.0
    for task in kept:
        assert state.intake.submit(submission(state, "a", task.lease_id, 0)).accepted
    leased_later = []
    for _ in range(3):  # more prompts: the dropped one is never among them, nor queued again
        tasks = lease(state, "a", 0, max_tasks=2).tasks
        leased_later += [state.leases_book.leases[t.lease_id].prompt_index for t in tasks]
        for task in tasks:
            state.intake.submit(submission(state, "a", task.lease_id, 0))
        state.learner_desk.take_batch(state.groups.steps_taken)
    assert leased_later and dropped_prompt not in leased_later and dropped_prompt not in state.leases_book.queue
    assert state.groups.steps_taken >= 2
    trained = [g.lease_id for step in range(state.groups.steps_taken) for g in state.learner_desk.take_batch(step)]
    assert alike.lease_id not in trained and len(trained) == 2 * state.groups.steps_taken


def test_the_batch_still_fills_with_p_informative_groups_when_some_are_dropped(tmp_path, tiny_model_dir):
    """P = 2, S = 1: the lease window holds (S + 1) x P = 4 groups at version 0. Two groups
    dropped as uninformative leave the window (neither leased nor buffered), so the worker is
    leased two more prompts at once, and step 0's batch is the 2 informative ones."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2)
    _ready(state)
    first = lease(state, "a", 0, max_tasks=2).tasks
    for task in first:
        state.intake.submit(submission(state, "a", task.lease_id, 0, alike=True))
    assert state.learner_desk.take_batch(0) is None  # nothing informative yet: the learner waits
    refill = lease(state, "a", 0, max_tasks=2).tasks
    assert len(refill) == 2
    for task in refill:
        state.intake.submit(submission(state, "a", task.lease_id, 0))
    batch = state.learner_desk.take_batch(0)
    assert [g.lease_id for g in batch] == [t.lease_id for t in refill]
    assert all(len(set(g.rewards)) > 1 for g in batch)
    record = _batch_records(state)[-1]
    assert record["dropped_uninformative"] == 2 and record["completions_truncated"] == 0
    assert state.counters.scored == 4 and state.counters.dropped_uninformative == 2 and state.counters.trained == 2
    # the next step's record counts from this batch on
    for task in lease(state, "a", 0, max_tasks=2).tasks:
        state.intake.submit(submission(state, "a", task.lease_id, 0))
    publish(state, 1)
    assert len(state.learner_desk.take_batch(1)) == 2 and _batch_records(state)[-1]["dropped_uninformative"] == 0


def test_with_the_setting_off_a_group_of_equal_rewards_reaches_the_batch(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2, rewards=KEEP_ALIKE)
    _ready(state)
    tasks = lease(state, "a", 0, max_tasks=2).tasks
    for task in tasks:
        reply = state.intake.submit(submission(state, "a", task.lease_id, 0, alike=True))
        assert reply.accepted and reply.reason == ""
    batch = state.learner_desk.take_batch(0)
    assert [g.lease_id for g in batch] == [t.lease_id for t in tasks]
    assert all(g.rewards == [1.0, 1.0] for g in batch)  # zero advantage at the learner, as before
    assert state.counters.dropped_uninformative == 0 and state.counters.scored == 2


def test_the_counts_persist_and_reach_the_view_prometheus_and_summary(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2)
    _ready(state)
    tasks = lease(state, "a", 0, max_tasks=2).tasks
    state.intake.submit(submission(state, "a", tasks[0].lease_id, 0, alike=True))
    state.intake.submit(submission(state, "a", tasks[1].lease_id, 0))
    view = run_view(state, RunHistory(None))
    assert view["counters"]["dropped_uninformative"] == 1 and view["uninformative_share"] == 0.5
    metrics: dict[str, Metric] = {m.name: m for m in _run_metrics(view)}
    assert metrics["echo2_uninformative_share_ratio"].samples[0].value == 0.5
    groups = {s.labels["outcome"]: s.value for s in metrics["echo2_groups"].samples if s.name.endswith("_total")}
    assert groups["dropped_uninformative"] == 1 and groups["scored"] == 2
    final = {"kind": "coordinator_final", "role": "coordinator", "time": 1.0, "counters": view["counters"],
             "workers": {}}
    summary = summarize([final])
    assert summary["groups_dropped_uninformative"] == 1 and summary["uninformative_share"] == 0.5
    state.store.close()
    again = CoordinatorState(state.cfg, Store(tmp_path / "coordinator.db"), state.scorer, clock=FakeClock())
    assert again.counters.dropped_uninformative == 1 and again.counters.scored == 2


def test_the_controller_plans_for_the_measured_share(tmp_path, tiny_model_dir):
    """Required rate B / ((1 - d) T_train) with d measured from the counters once 20 groups
    are scored (before that, d = 0: the first few groups say little)."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=100, groups_per_step=2)
    _ready(state)
    state.learner_desk.observe_step_time(2.0)
    batch_rollouts = 2 * 2
    assert state.controller.required_rps() == batch_rollouts / 2.0
    for index in range(20):
        task = lease(state, "a", 0, max_tasks=1).tasks[0]
        state.intake.submit(submission(state, "a", task.lease_id, 0, alike=index % 4 == 0))  # 5 of 20 alike
        if index % 2:
            state.learner_desk.take_batch(state.groups.steps_taken)
    assert state.counters.dropped_uninformative == 5 and state.counters.scored == 20
    assert state.controller.uninformative_share == 0.25
    assert abs(state.controller.required_rps() - batch_rollouts / 2.0 / 0.75) < 1e-9


def test_a_long_streak_of_uninformative_groups_lets_one_through_and_says_so(tmp_path, tiny_model_dir):
    """A model that gets every completion of every prompt right (or wrong) would leave the
    learner waiting forever: after STALL_GUARD_BATCHES x P groups dropped in a row the next one
    is admitted (zero advantage), an uninformative_streak event says why, and the count restarts."""
    from echo2.policy.rewards import STALL_GUARD_BATCHES
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2)
    _ready(state)
    limit = STALL_GUARD_BATCHES * 2
    submitted = []
    while len(submitted) < limit + 1:
        for task in lease(state, "a", 0, max_tasks=2).tasks[: limit + 1 - len(submitted)]:
            state.intake.submit(submission(state, "a", task.lease_id, 0, alike=True))
            submitted.append(task.lease_id)
    assert state.counters.dropped_uninformative == limit
    assert [g.lease_id for g in state.groups.buffer] == [submitted[-1]]  # the one let through
    streaks = [r for r in event_records(state) if r["kind"] == "uninformative_streak"]
    assert streaks == [{"kind": "uninformative_streak", "step": 0, "dropped_in_a_row": limit}]
    assert state.groups.dropped_in_a_row == 0


def test_the_audit_sees_a_sample_of_what_dynamic_sampling_drops(tmp_path, tiny_model_dir):
    """A worker whose groups all score alike would never be audited: every uninformative group
    of a worker audited fewer than AUDITED_BEFORE_DROPPING times is buffered for the learner
    (weightless there), then audit.uninformative_fraction of them; the run config turns it on."""
    from echo2.config.run import RunConfig
    from echo2.policy.rewards import AUDITED_BEFORE_DROPPING, RewardRules
    cfg = RunConfig()
    rules = RewardRules.from_config(cfg.grpo, cfg.audit)
    assert rules.audit_fraction == 0.1 and rules.audited_before_dropping == AUDITED_BEFORE_DROPPING
    off_cfg = RunConfig.model_validate({"audit": {"enabled": False}})
    off = RewardRules.from_config(off_cfg.grpo, off_cfg.audit)
    assert off.audit_fraction == 0.0 and off.audited_before_dropping == 0
    assert rules.audit_keeps(worker_audited=0, draw=0.99) and not rules.audit_keeps(worker_audited=4, draw=0.5)
    assert rules.audit_keeps(worker_audited=4, draw=0.05)
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=2,
                       rewards=RewardRules(audit_fraction=0.0, audited_before_dropping=2))
    _ready(state)
    tasks = lease(state, "a", 0, max_tasks=2).tasks
    for task in tasks:  # unaudited: both go to the learner
        assert state.intake.submit(submission(state, "a", task.lease_id, 0, alike=True)).reason == ""
    assert [g.lease_id for g in state.learner_desk.take_batch(0)] == [t.lease_id for t in tasks]
    assert state.counters.uninformative_audited == 2 and state.counters.dropped_uninformative == 0
    state.controller.observe_audit("a", audited=2, failed=0, newest_passed_seq=0)  # the learner's audit report
    publish(state, 1)
    task = lease(state, "a", 1, max_tasks=1).tasks[0]
    assert "uninformative" in state.intake.submit(submission(state, "a", task.lease_id, 1, alike=True)).reason
    assert state.counters.dropped_uninformative == 1


def test_the_measured_share_follows_a_policy_that_learns():
    """d rises as the policy gets more groups all right: measured over the recent groups, the
    demand the controller sizes the fleet for rises with it (over the whole run it lagged)."""
    import pytest

    from echo2.policy.rewards import MIN_GROUPS_MEASURED, RECENT_GROUPS, UninformativeShare

    d = UninformativeShare()
    assert d.observe(5, MIN_GROUPS_MEASURED - 1, prior=0.3) == 0.3  # too few groups: the prior
    dropped = scored = 0
    for _ in range(RECENT_GROUPS):  # a fifth of the groups dropped...
        scored, dropped = scored + 5, dropped + 1
        share = d.observe(dropped, scored)
    assert share == pytest.approx(0.2)
    for _ in range(RECENT_GROUPS):  # ...then three fifths
        scored, dropped = scored + 5, dropped + 3
        share = d.observe(dropped, scored)
    assert share == pytest.approx(0.6, abs=0.03)  # over the whole run it would say 0.4
    assert len(d.marks) <= RECENT_GROUPS // 5 + 2  # the window's marks, not the run's
    assert d.observe(1, MIN_GROUPS_MEASURED + 10) == pytest.approx(1 / 30)  # counters that began again

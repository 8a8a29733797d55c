"""The staleness bound per token: a completion's versions on the wire (runs), the admission rule
on a group's share of tokens older than S (one rule, `policy.admission.admits_tokens`, which the
coordinator's data plane applies at submission and at every step), and the coordinator's checks
of what a worker claims."""

from __future__ import annotations

import io

import pytest
from rich.console import Console
from tests.unit.coordinator_helpers import (
    SAMPLING,
    FakeClock,
    lease,
    make_state,
    publish,
    register,
    submission,
)
from tests.unit.metrics_fixtures import synthetic_run

from echo2.coordinator.records.errors import RequestError
from echo2.policy import DataPlane
from echo2.policy.admission import admits_tokens, is_admissible, last_admissible_step, masked_share
from echo2.protocol import token_versions
from echo2.protocol.messages import RolloutCompletion
from echo2.report.render import render_summary
from echo2.report.summary import summarize


def render_text(summary: dict) -> str:
    out = io.StringIO()
    render_summary(summary, Console(file=out, width=200))
    return out.getvalue()


def test_runs_round_trip_and_a_single_version_sends_none():
    per_token = [3, 3, 4, 4, 4, 6]
    runs = token_versions.encode(per_token)
    assert runs == [(3, 2), (4, 3), (6, 1)]
    assert token_versions.expand(runs, 6, 3) == per_token
    assert token_versions.encode([5, 5, 5]) == [] and token_versions.encode([]) == []
    assert token_versions.expand([], 3, 5) == [5, 5, 5]


@pytest.mark.parametrize(("runs", "fragment"), [
    ([(2, 3)], "one run; send []"),
    ([(2, 2), (2, 2)], "versions must increase"),
    ([(2, 2), (1, 2)], "versions must increase"),
    ([(2, 0), (3, 4)], "covers 0 tokens"),
    ([(1, 2), (3, 2)], "starts at version 1; the generation started at rollout.version=2"),
    ([(2, 2), (9, 2)], "claims version 9; the newest published is 4"),
    ([(2, 2), (3, 3)], "covers 5 tokens; the completion has 4"),
])
def test_runs_a_worker_could_not_have_sampled_are_named(runs, fragment):
    problem = token_versions.problem(runs, tokens=4, version=2, newest=4, field="token_versions")
    assert problem is not None and fragment in problem and "token_versions" in problem
    assert token_versions.problem([(2, 1), (4, 3)], tokens=4, version=2, newest=4, field="f") is None


def test_tokens_by_version_counts_the_models_tokens_only():
    single = RolloutCompletion(token_ids=[1, 2, 3, 4], logprobs=[-1.0] * 4, token_versions=[(5, 1), (6, 3)])
    episode = RolloutCompletion(token_ids=[1, 2, 3, 4, 5], logprobs=[-1.0, -1.0, 0.0, 0.0, -1.0],
                                segments=[2, 2, 1], token_versions=[(5, 3), (7, 2)])
    assert token_versions.tokens_by_version([single, episode], 5) == {5: 1 + 2, 6: 3, 7: 1}
    plain = RolloutCompletion(token_ids=[1, 2], logprobs=[-1.0, -1.0])
    assert token_versions.tokens_by_version([plain], 4) == {4: 2}


@pytest.mark.parametrize("fraction", [0.01, 0.5, 1.0])
def test_a_group_one_version_sampled_is_admitted_exactly_as_before(fraction):
    for step in range(6):
        for version in range(6):
            for S in range(3):
                assert admits_tokens(step, {version: 7}, S, fraction) == is_admissible(step, version, S)


def test_a_straddling_group_is_admitted_while_its_stale_share_stays_below_the_fraction():
    tokens = {3: 30, 4: 50, 5: 20}  # sampled by versions 3, 4 and 5
    assert masked_share(5, tokens, 1) == pytest.approx(0.3)  # version 3 is 2 steps old
    assert masked_share(6, tokens, 1) == pytest.approx(0.8)
    assert admits_tokens(5, tokens, 1, 0.5) and not admits_tokens(6, tokens, 1, 0.5)
    assert admits_tokens(6, tokens, 1, 0.9) and not admits_tokens(7, tokens, 1, 0.9)
    assert not admits_tokens(5, tokens, 1, 0.3)  # below, not at
    assert admits_tokens(1, {2: 0}, 0, 0.5) and not admits_tokens(3, {2: 0}, 0, 0.5)  # no tokens: its version


def test_the_data_plane_drops_a_straddling_group_at_the_step_its_share_crosses():
    groups = {"old": {0: 10}, "mixed": {0: 4, 2: 6}}
    plane = DataPlane(1, 1, lambda g: min(groups[g]), tokens_of=groups.__getitem__, max_masked_fraction=0.5,
                      current_version=2)
    for name in groups:
        assert plane.admits(name)
        plane.add(name)
    assert plane.advance(1) == []
    assert plane.advance(2) == ["old"]  # 2 - 0 > S: all of it masked; the mixed one 40% masked
    assert plane.buffer == ["mixed"]
    assert plane.advance(4) == ["mixed"]


def test_a_groups_deadline_is_the_last_step_that_admits_it():
    tokens = {3: 30, 4: 50, 5: 20}
    for fraction in (0.3, 0.5, 0.9, 1.0):
        for step in range(0, 9):
            deadline = last_admissible_step(step, tokens, 1, fraction)
            admitted = [t for t in range(step, 12) if admits_tokens(t, tokens, 1, fraction)]
            assert deadline == (max(admitted) if admitted else step - 1)
    assert last_admissible_step(2, {4: 7}, 2, 0.5) == 6  # one version: v + S


def test_with_segment_swaps_batches_take_the_groups_whose_admission_ends_soonest():
    """Leased ahead, a straddling group waits in the buffer next to one a swap never reached,
    which must train by v + S: in submission order that one ages out; earliest deadline first,
    both train. Without swaps the order stays submission order."""
    groups = {"ahead": {2: 2, 3: 8}, "unswapped": {1: 10}}  # deadlines at S=1, f=0.5: 4 and 2
    for swaps, dropped in ((True, []), (False, ["unswapped"])):
        plane = DataPlane(1, 1, lambda g: min(groups[g]), tokens_of=groups.__getitem__, max_masked_fraction=0.5,
                          current_version=3, learner_step=1, segment_swaps=swaps)
        for name in groups:
            plane.add(name)
        assert plane.advance(1) == []
        first = plane.take_batch(1)
        assert first == (["unswapped"] if swaps else ["ahead"])
        assert plane.advance(2) == [] and plane.advance(3) == dropped


def test_the_coordinator_checks_the_versions_a_worker_claims_and_admits_by_share(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, groups_per_step=1,
                       max_masked_fraction=0.5)
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    publish(state, 1)
    ok = submission(state, "a", task.lease_id, 0)
    claimed = [c.model_copy(update={"token_versions": [(0, 1), (2, len(c.token_ids) - 1)]}) for c in ok.completions]
    with pytest.raises(RequestError) as err:  # version 2 is not out yet
        state.intake.submit(ok.model_copy(update={"completions": claimed}))
    assert err.value.status == 422 and "token_versions claims version 2" in str(err.value)
    straddled = [c.model_copy(update={"token_versions": [(0, 1), (1, len(c.token_ids) - 1)]})
                 for c in ok.completions]
    assert state.intake.submit(ok.model_copy(update={"completions": straddled})).accepted
    (group,) = state.learner_desk.take_batch(0)
    assert group.completions[0].token_versions == [(0, 1), (1, 3)]  # stored and sent to the learner as sent


def test_the_summary_reports_the_staleness_of_trained_tokens_and_the_masked_share():
    records = synthetic_run(4)
    steps = [r for r in records if r["kind"] == "train_step"]
    for r, hist, masked in zip(steps, [{"0": 90, "1": 10}, {"0": 50, "1": 40, "2": 10}, {}, {"1": 100}],
                               [0, 20, 0, 180], strict=True):
        r.update(token_staleness_hist=hist, tokens_masked_stale=masked, groups_straddling=1 if masked else 0)
    summary = summarize(records)
    assert summary["token_staleness_hist"] == {"0": 140, "1": 150, "2": 10}
    assert summary["token_staleness_p50"] == 1 and summary["token_staleness_p95"] == 1
    assert summary["tokens_masked_stale"] == 200 and summary["masked_token_share"] == pytest.approx(200 / 500)
    assert summary["groups_straddling"] == 2
    assert "staleness of trained tokens" in render_text(summary) and "p50 1, p95 1" in render_text(summary)
    old = summarize(synthetic_run(2))  # records from before per-token versions: nothing to report
    assert old["token_staleness_p50"] is None and old["masked_token_share"] is None


def test_with_segment_swaps_leases_reach_as_far_ahead_as_the_measured_generations_allow():
    plane = DataPlane(2, 4, lambda v: v, current_version=0, segment_swaps=True, max_masked_fraction=0.5)
    assert plane.ahead_steps() == 0  # nothing measured yet
    plane.step_time_s = 80.0
    for held_s in (290.0, 300.0, 310.0, 330.0):
        plane.observe_generation(held_s, 5.0)
    assert plane.ahead_steps() == 1  # quartile 300 s: 80 + 5 < 0.5 * 300, 160 + 5 is not
    base = DataPlane(2, 4, lambda v: v, current_version=0)
    base.step_time_s = 80.0
    base.observe_generation(300.0, 5.0)  # not swapping: nothing observed, the window as it was
    assert base.ahead_steps() == 0
    assert (plane.window_groups(), base.window_groups()) == (16, 12)  # (S + 1 + ahead) x P groups in flight


def test_a_learner_that_waits_for_batches_leases_less_far_ahead():
    """Versions arrive once per step period: while the learner waits for batches that is longer
    than its busy time, and k steps ahead cover more of a generation, so fewer are allowed
    (the largest k with k x T + T_seg < f x T_gen = 150 s, T the period)."""
    plane = DataPlane(2, 1, lambda v: v, current_version=0, segment_swaps=True, max_masked_fraction=0.5)
    plane.step_time_s = 50.0
    for held_s in (290.0, 300.0, 310.0, 330.0):
        plane.observe_generation(held_s, 5.0)
    assert plane.ahead_steps() == 2 and plane.step_period_s() is None  # 100 + 5 < 150
    for step, now_s in enumerate((0.0, 100.0, 200.0, 300.0)):
        plane.add(step)
        plane.advance(step)
        assert plane.take_batch(step, now_s=now_s) == [step]
    assert plane.step_period_s() == 100.0 and plane.ahead_steps() == 1  # 200 + 5 is not below 150
    plane.step_time_s = 150.0  # busy longer than the batches' interval: the busy time counts
    assert plane.ahead_steps() == 0


def test_the_coordinator_measures_how_long_swapping_leases_take(tmp_path, tiny_model_dir):
    clock = FakeClock()
    sampling = SAMPLING.model_copy(update={"segment_tokens": 2})
    state = make_state(tmp_path, tiny_model_dir, clock, sampling=sampling)
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    clock.now += 30.0
    ok = submission(state, "a", task.lease_id, 0)
    state.intake.submit(ok)
    longest = max(len(c.token_ids) for c in ok.completions)
    assert state.groups.plane.segment_swaps
    assert list(state.groups.plane.generations) == [(30.0, 30.0 * min(1.0, 2 / longest))]

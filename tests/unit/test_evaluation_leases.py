"""Held-out evaluation as evaluation leases (coordinator.evaluations, evaluation_desk): what is
due, who serves it and when (version 0 and the last exactly and before rollouts, the others only
in capacity the learner does not need), one version held for a whole evaluation, the
coordinator's scoring (the check `echo2 eval` makes), bad submissions refused, lost workers'
evaluations due again, and the lease long poll that replaces polling a full window."""

from __future__ import annotations

import asyncio

import pytest
from tests.unit.coordinator_helpers import (
    KEEP_ALIKE,
    FakeClock,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
)
from tests.unit.test_coordinator_http import LEARNER, _join, _post, run_with_server

from echo2.coordinator.parts.evaluations import Evaluations
from echo2.coordinator.records.errors import RequestError
from echo2.protocol.messages import EvalSubmission, LeaseRequest


def test_due_versions_and_who_serves_them():
    board = Evaluations(eval_every=5, final_version=12, problems=4, problems_per_lease=3, max_new_tokens=4)
    assert [v for v in range(14) if board.is_due(v)] == [0, 5, 10, 12]
    for version in range(13):
        board.published(version)
    assert board.pending == {0, 5, 10, 12}
    ids = lambda i: [i]  # noqa: E731
    # version 0 is exact: a worker at version 3 cannot serve it, nor (not spare) version 5
    assert board.offer("w1", 3, spare=False, now=0.0, prompt_ids=ids) is None
    task = board.offer("w0", 0, spare=False, now=0.0, prompt_ids=ids)
    assert task.version == 0 and task.prompt_ids == [[0], [1], [2]] and board.hold_version("w0") == 0
    assert board.offer("w1", 7, spare=True, now=0.0, prompt_ids=ids) is None  # one evaluation at a time
    assert board.offer("w0", 0, spare=False, now=1.0, prompt_ids=ids) == task  # its reply was lost: the same lease
    running = board.lease_of("w0", task.lease_id)
    assert board.record(running, [True, False, True], 1.0, now=2.0) is None
    task = board.offer("w0", 0, spare=False, now=2.0, prompt_ids=ids)
    assert task.prompt_ids == [[3]]
    done = board.record(board.lease_of("w0", task.lease_id), [True], 0.5, now=3.0)
    assert (done.version, done.accuracy, done.correct, done.gen_s, done.wall_s) == (0, 0.75, 3, 1.5, 3.0)
    assert board.hold_version("w0") is None and board.result(0)["accuracy"] == 0.75
    # a spare worker at version 11 settles 5 and 10 in one evaluation at 11; 12 (the last) stays exact
    task = board.offer("w1", 11, spare=True, now=4.0, prompt_ids=ids)
    assert task.version == 11 and board.running.due == [5, 10] and board.pending == {12}


def test_lost_and_moved_workers_give_their_evaluation_back():
    board = Evaluations(eval_every=1, final_version=9, problems=2, problems_per_lease=1, max_new_tokens=4)
    board.published(0)
    board.offer("w0", 0, spare=False, now=0.0, prompt_ids=lambda i: [i])
    assert board.expire({"w0"}, lease_timeout_s=60.0, now=30.0) is None
    assert board.expire({"w0"}, lease_timeout_s=60.0, now=61.0).worker_id == "w0"  # the lease went overdue
    assert board.pending == {0} and board.running is None
    board.offer("w1", 0, spare=False, now=62.0, prompt_ids=lambda i: [i])
    assert board.moved("w1", 0) is None and board.moved("w1", 1).version == 0
    assert board.pending == {0}
    board.offer("w2", 0, spare=False, now=63.0, prompt_ids=lambda i: [i])
    assert board.expire({"w0", "w1"}, 60.0, now=64.0).worker_id == "w2"  # w2 is gone


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, eval_on_workers=True, eval_every=2,
                       final_version=4, eval_problems_per_lease=150)
    publish(state, 0)
    for worker_id in ("w0", "w1"):
        register(state, worker_id)
    past_slow_start(state, "w0", "w1")
    return state


def _answers(state, task, correct_share: float) -> list[list[int]]:
    """Completions answering the first `correct_share` of the prompts right, the rest wrong."""
    tok, eos = state.scorer.tokenizer, state.scorer.tokenizer.token_to_id("<eos>")
    start = len(state.evaluation.board.running.correct)
    out = []
    for i in range(len(task.prompt_ids)):
        answer = state.scorer.eval_problems[start + i].answer
        right = (start + i) < correct_share * len(state.scorer.eval_problems)
        out.append(tok.encode(answer if right else str(int(answer) + 1), add_special_tokens=False).ids[:3] + [eos])
    return out


def test_version_0_is_evaluated_first_by_one_worker_and_scored_by_the_coordinator(state):
    first = lease(state, "w0", 0, max_tasks=2)
    assert first.evaluation is not None and first.tasks == [] and first.hold_version == 0
    task = first.evaluation
    assert len(task.prompt_ids) == 150 and task.prompt_ids[0] == state.scorer.eval_prompt_ids(0)
    assert lease(state, "w1", 0, max_tasks=2).tasks  # the other worker feeds the learner meanwhile
    ack = state.evaluation.submit(EvalSubmission(worker_id="w0", lease_id=task.lease_id, version=0,
                                                 completions=_answers(state, task, 0.5), gen_time_s=1.5))
    assert ack.accepted and not ack.done
    second = lease(state, "w0", 0)
    assert second.evaluation is not None and len(second.evaluation.prompt_ids) == 50  # 200 held-out problems
    assert state.evaluation.submit(EvalSubmission(worker_id="w0", lease_id=second.evaluation.lease_id, version=0,
                                                  completions=_answers(state, second.evaluation, 0.5),
                                                  gen_time_s=0.5)).done
    (record,) = [e for e in event_records(state) if e["kind"] == "eval"]
    assert (record["step"], record["accuracy"], record["problems"], record["worker_id"], record["eval_s"]) == \
        (0, 0.5, 200, "w0", 2.0)
    assert state.evaluation.result(0).accuracy == 0.5 and not state.evaluation.result(2).done
    assert lease(state, "w0", 0).hold_version is None  # done: back to rollouts


def test_other_due_versions_use_only_capacity_the_learner_does_not_need(state):
    task = lease(state, "w0", 0).evaluation
    state.evaluation.board.running = None  # (version 0 settled elsewhere in this test)
    state.evaluation.board.pending.clear()
    publish(state, 1)
    publish(state, 2)
    assert state.evaluation.board.pending == {2}
    got = lease(state, "w1", 2, max_tasks=2)
    assert got.tasks and got.evaluation is None  # rollouts first: the window has room
    held = lease(state, "w1", 2, max_tasks=2)
    assert not held.tasks and held.evaluation is not None and held.evaluation.version == 2  # window full: evaluate
    assert task.lease_id != held.evaluation.lease_id


def test_bad_evaluation_submissions_are_refused_and_change_nothing(state):
    task = lease(state, "w0", 0).evaluation
    good = _answers(state, task, 1.0)

    def submit(**fields):
        body = {"worker_id": "w0", "lease_id": task.lease_id, "version": 0, "completions": good, "gen_time_s": 1.0}
        return state.evaluation.submit(EvalSubmission(**{**body, **fields}))

    for fields, status, words in (({"completions": good[:-1]}, 422, "has 149 entries; the lease has 150"),
                                  ({"completions": [[1] * 5] + good[1:]}, 422, "at most 4"),
                                  ({"completions": [[10**6]] + good[1:]}, 422, "outside the vocabulary"),
                                  ({"version": 1}, 422, "this evaluation is of version 0"),
                                  ({"lease_id": "Enope"}, 409, "is not held by 'w0'"),
                                  ({"worker_id": "w1"}, 409, "is not held by 'w1'")):
        with pytest.raises(RequestError, match=words) as refused:
            submit(**fields)
        assert refused.value.status == status
    assert state.evaluation.board.running.correct == []
    assert submit().accepted and len(state.evaluation.board.running.correct) == 150


def test_a_worker_gone_silent_loses_the_evaluation_to_another(state):
    lease(state, "w0", 0)
    state.clock.now += 10  # past worker_timeout_s for w0; w1 heartbeats
    state.registry.workers["w1"].last_seen = state.clock.now
    state.fleet_desk.sweep()
    kinds = [e["kind"] for e in event_records(state) if e["kind"].startswith("evaluation_")]
    assert kinds[-1] == "evaluation_abandoned"
    assert lease(state, "w1", 0).evaluation is not None


def test_a_full_window_is_waited_out_at_the_coordinator_not_polled(tmp_path, tiny_model_dir):
    # rollouts only here, of fixed tokens alike in every completion: kept
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), max_staleness=1, rewards=KEEP_ALIKE)
    publish(state, 0)

    async def scenario(session, url):
        headers = await _join(session, url, "w2")
        past_slow_start(state, "w2")
        body = {"worker_id": "w2", "version": 0, "max_tasks": 8}
        _, first = await _post(session, url, "/v1/lease", body, headers)
        assert len(first["tasks"]) == 2  # one step's worth: w2's own cap
        loop = asyncio.get_running_loop()
        started = loop.time()
        _, refused = await _post(session, url, "/v1/lease", {**body, "wait_s": 1.0}, headers)
        waited_s = loop.time() - started

        async def room_later():
            await asyncio.sleep(0.4)
            for task in first["tasks"]:
                done = {"worker_id": "w2", "lease_id": task["lease_id"], "version": 0, "gen_time_s": 0.1,
                        "completions": [{"token_ids": [20, 3], "logprobs": [-0.5, -0.5]}] * 2}
                await _post(session, url, "/v1/rollout", done, headers)
            async with session.post(url + "/v1/batch", json={"step": 0, "wait_s": 1}, headers=LEARNER) as resp:
                assert len((await resp.json())["groups"]) == 2

        opener = asyncio.create_task(room_later())
        started = loop.time()
        _, granted = await _post(session, url, "/v1/lease", {**body, "wait_s": 5.0}, headers)
        await opener
        return refused, waited_s, granted, loop.time() - started

    refused, waited_s, granted, opened_s = run_with_server(state, scenario)
    assert refused["tasks"] == [] and refused["reason"].startswith("holding") and 0.9 < waited_s < 3
    assert granted["tasks"] and 0.3 < opened_s < 4


def test_lease_requests_ask_for_a_long_poll_within_the_coordinators_bound(state):
    with pytest.raises(ValueError):
        LeaseRequest(worker_id="w0", version=0, wait_s=31)


def test_a_worker_evaluation_scores_what_echo2_eval_scores(tiny_model_dir, tmp_path):
    """The same held-out prompts, greedy completions and check on both roads: the HF engine's
    `greedy` scored by the coordinator, and `echo2 eval`'s evaluate()."""
    import torch

    from echo2.models.loading import load_model, load_tokenizer

    noisy = load_model(str(tiny_model_dir))  # an untrained model answers everything alike
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in noisy.parameters():
            p.add_(0.3 * torch.randn(p.shape, generator=generator))
    noisy.save_pretrained(tmp_path / "noisy")
    load_tokenizer(str(tiny_model_dir)).save_pretrained(tmp_path / "noisy")
    tiny_model_dir = tmp_path / "noisy"
    from echo2.config.task import AdditionConfig
    from echo2.coordinator.scoring.scorer import Scorer
    from echo2.models.evaluation import evaluate, sample_completions
    from echo2.models.loading import load_model, load_tokenizer
    from echo2.rollout.hf_engine import HFEngine
    from echo2.tasks import make_task
    from echo2.tasks.base import render_prompt

    task = make_task(AdditionConfig(digits=1, eval_size=40), seed=0)
    scorer = Scorer(task, str(tiny_model_dir))
    engine = HFEngine.from_pretrained(str(tiny_model_dir), "cpu", "float32")
    prompts = [scorer.eval_prompt_ids(i) for i in range(len(scorer.eval_problems))]
    completions = engine.greedy(prompts, 4)
    on_worker = [scorer.eval_correct(i, ids) for i, ids in enumerate(completions)]
    model, tokenizer = load_model(str(tiny_model_dir)), load_tokenizer(str(tiny_model_dir))
    report = evaluate(model, tokenizer, task, task.eval_problems(), max_new_tokens=4)
    assert report.correct_counts == [int(c) for c in on_worker] and report.problems == 40
    texts = sample_completions(model, tokenizer, [render_prompt(tokenizer, task, p) for p in task.eval_problems()],
                               n=1, temperature=0.0, max_new_tokens=4)
    assert texts == [scorer.tokenizer.decode(ids, skip_special_tokens=True) for ids in completions]
    assert len(set(texts)) > 1  # the untrained model still says different things: a real comparison


def test_where_evaluation_runs_follows_the_task():
    from echo2.config.evaluation import EvaluationConfig

    assert EvaluationConfig().on_workers(multi_turn=False) and not EvaluationConfig().on_workers(multi_turn=True)
    assert not EvaluationConfig(where="learner").on_workers(multi_turn=False)
    with pytest.raises(ValueError, match="evaluation.where='workers' with a multi-turn task"):
        EvaluationConfig(where="workers").on_workers(multi_turn=True)

"""Scoring off the coordinator's event loop (issue 24: 8 completions of \\boxed{9^{9^{9}}} once
froze it for 16 s and an honest worker was evicted). On a real loopback coordinator with real
scoring processes: a completion whose scoring hangs is cut off at its budget, scores 0 and
counts against its worker, its process is killed and reaped, and heartbeats are answered at
once meanwhile. On the state machine with a stand-in pool: a lease that expires during scoring
is refused with nothing applied, one submission per worker is scored at a time, a worker whose
completions keep running over budget is refused for a while, and the coordinator's own stall
evicts no one."""

from __future__ import annotations

import asyncio
import json
import os
import time

import aiohttp
import pytest
from tests.unit.coordinator_helpers import (
    FakeClock,
    answer_ids,
    event_records,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
    submission,
)
from tests.unit.slow_scoring import HANG, SLOW, hanging_recipe
from tests.unit.test_coordinator_http import TIMEOUT, _join, _post, _serve, run_with_server

from echo2.config.scoring import ScoringConfig
from echo2.config.task import AdditionConfig
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.jobs import OverBudget, rollout_jobs
from echo2.coordinator.scoring.pool import ScoringPool
from echo2.coordinator.scoring.scorer import scorer_from_recipe, scorer_recipe
from echo2.protocol.messages import EvalSubmission, RolloutCompletion

BUDGET_S = 1.5


class StandInScoring:
    """The pool's interface with chosen outcomes; `during` runs while the group is "scored"
    (the event loop serving other requests meanwhile), `gate` holds the scoring until set."""

    def __init__(self, outcomes=None, during=None, gate: asyncio.Event | None = None) -> None:
        self.outcomes, self.during, self.gate = outcomes, during, gate

    async def score(self, jobs: list[dict], give_up_after: int | None = None) -> list:
        if self.during is not None:
            self.during()
        if self.gate is not None:
            await self.gate.wait()
        await asyncio.sleep(0)
        return list(self.outcomes) if self.outcomes is not None else [1.0] * len(jobs)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def _completion(token_ids: list[int]) -> RolloutCompletion:
    return RolloutCompletion(token_ids=token_ids, logprobs=[-0.5] * len(token_ids))


def _hanging(state) -> RolloutCompletion:
    tokenizer = state.scorer.tokenizer
    return _completion(tokenizer.encode(HANG, add_special_tokens=False).ids + [tokenizer.token_to_id("<eos>")])


def _hanging_group(state, worker_id: str, lease_id: str) -> dict:
    completions = [_hanging(state), _completion(answer_ids(state, lease_id, correct=True))]
    return submission(state, worker_id, lease_id, 0, completions=completions).model_dump(mode="json")


def test_a_hung_scoring_is_cut_off_and_killed_while_heartbeats_are_answered(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    pool = ScoringPool(hanging_recipe(str(tiny_model_dir)), processes=2, timeout_s=BUDGET_S)
    metrics = tmp_path / "metrics.jsonl"

    async def main():
        runner, url = await _serve(state, metrics_path=metrics, scoring=pool)
        try:
            await pool.wait_ready(timeout_s=120)
            async with aiohttp.ClientSession(timeout=TIMEOUT) as session:
                w1 = await _join(session, url, "w1")
                _, leased = await _post(session, url, "/v1/lease", {"worker_id": "w1", "version": 0}, w1)
                lease_id = leased["tasks"][0]["lease_id"]
                rollout = asyncio.create_task(_post(session, url, "/v1/rollout", _hanging_group(state, "w1", lease_id),
                                                    w1))
                beats = []
                while not rollout.done():
                    started = time.perf_counter()
                    status, _ = await _post(session, url, "/v1/heartbeat", {"worker_id": "w1", "version": 0}, w1)
                    beats.append((status, time.perf_counter() - started))
                    await asyncio.sleep(0.05)
                killed = list(pool.killed)
                gone_at_once = [_gone(pid) for pid in killed]
                # one submission costs at most the strikes its worker has left: the rest are not run
                hung = rollout_jobs(0, [_hanging(state)])
                given_up = await pool.score(hung * 3, give_up_after=1)
                return beats, await rollout, killed, gone_at_once, given_up, set(pool.children) | set(pool.killed)
        finally:
            await runner.cleanup()

    beats, (status, reply), killed, gone_at_once, given_up, pids = asyncio.run(main())
    worst_s = max(latency for _, latency in beats)
    print(f"\n{len(beats)} heartbeats during the hung scoring, slowest {worst_s * 1000:.1f} ms")
    assert len(beats) >= 5 and {code for code, _ in beats} == {200} and worst_s < 1.0
    assert status == 200 and reply["accepted"] and reply["rewards"] == [0.0, 1.0]  # the cut-off one scores 0
    assert len(killed) == 1 and gone_at_once == [True]  # killed and reaped before the reply
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    (over,) = [r for r in records if r["kind"] == "scoring_over_budget"]
    assert (over["worker_id"], over["what"], over["completion"], over["pid"], over["strikes"]) == \
        ("w1", "rollout", 0, killed[0], 1)
    assert "scoring.timeout_s=1.5" in over["reason"]
    assert all(isinstance(outcome, OverBudget) for outcome in given_up)
    assert 1 <= sum(outcome.pid > 0 for outcome in given_up) <= 2  # those already running on the 2 processes
    assert given_up[-1].pid == 0 and given_up[-1].reason.startswith("not scored")
    assert pool.children == {} and all(_gone(pid) for pid in pids)  # every process stopped with the coordinator


def test_the_scoring_processes_build_the_coordinators_scorer_from_plain_json(tiny_model_dir):
    recipe = scorer_recipe(AdditionConfig(digits=3), 7, str(tiny_model_dir), 4)
    scorer = scorer_from_recipe(**json.loads(json.dumps(recipe))["kwargs"])
    assert recipe["factory"] == "echo2.coordinator.scoring.scorer:scorer_from_recipe"
    assert scorer.task.cfg == AdditionConfig(digits=3) and scorer.problem(5) == scorer.task.train_problem(5)


def test_a_lease_that_expires_while_its_group_is_scored_is_refused_and_nothing_applied(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, lease_timeout_s=3.0)
    publish(state, 0)
    register(state, "a")
    task = lease(state, "a", 0).tasks[0]
    req = submission(state, "a", task.lease_id, 0)
    prompt = state.leases_book.leases[task.lease_id].prompt_index

    def expire():  # the housekeeping, while the pool scores
        clock.now += 4.0
        state.fleet_desk.sweep()

    with pytest.raises(RequestError) as refused:
        asyncio.run(state.intake.submit_scored(req, StandInScoring(during=expire)))
    assert refused.value.status == 409 and "not held" in refused.value.message
    assert state.groups.buffer == [] and state.registry.workers["a"].rollouts == 0 and state.registry.workers["a"].alive
    assert list(state.leases_book.queue) == [prompt]  # back in the queue once, for someone else
    assert state.limits.busy == set()


def test_a_worker_has_one_submission_scored_at_a_time(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    publish(state, 0)
    register(state, "a")
    past_slow_start(state, "a")
    first, second = lease(state, "a", 0, max_tasks=2).tasks

    async def main():
        gate = asyncio.Event()
        scoring = asyncio.create_task(state.intake.submit_scored(submission(state, "a", first.lease_id, 0),
                                                          StandInScoring(gate=gate)))
        await asyncio.sleep(0.01)
        with pytest.raises(RequestError) as refused:
            await state.intake.submit_scored(submission(state, "a", second.lease_id, 0), StandInScoring())
        gate.set()
        return refused.value, await scoring

    refused, reply = asyncio.run(main())
    assert refused.status == 429 and "already has a submission being scored" in refused.message
    assert reply.accepted and second.lease_id in state.leases_book.leases  # the refused one changed nothing


def test_a_worker_whose_completions_keep_running_over_budget_is_refused_for_a_while(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock, groups_per_step=4,
                       scoring=ScoringConfig(strikes=3, strike_window_s=60.0))
    publish(state, 0)
    register(state, "a")
    past_slow_start(state, "a")
    tasks = lease(state, "a", 0, max_tasks=3).tasks
    cut = OverBudget(reason="over budget", pid=4321)

    def submit(task, outcomes):
        return asyncio.run(state.intake.submit_scored(submission(state, "a", task.lease_id, 0),
                                                      StandInScoring(outcomes)))

    assert submit(tasks[0], [cut, 1.0]).rewards == [0.0, 1.0]
    assert submit(tasks[1], [cut, cut]).rewards == [0.0, 0.0]
    with pytest.raises(RequestError) as refused:
        submit(tasks[2], None)
    assert refused.value.status == 429 and "coordinator.scoring.timeout_s" in refused.value.message
    records = [e for e in event_records(state) if e["kind"] == "scoring_over_budget"]
    assert [(r["completion"], r["strikes"], r["refused"], r["pid"]) for r in records] == \
        [(0, 1, False, 4321), (0, 2, False, 4321), (1, 3, True, 4321)]
    clock.now += 61.0
    assert submit(tasks[2], None).accepted  # the strikes are older than the window: admitted again


def test_an_evaluation_completion_over_budget_is_wrong_and_counts_against_its_worker(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), eval_on_workers=True, eval_every=2, final_version=4,
                       eval_problems_per_lease=2)
    publish(state, 0)
    register(state, "w0")
    task = lease(state, "w0", 0).evaluation
    req = EvalSubmission(worker_id="w0", lease_id=task.lease_id, version=0, completions=[[20, 3], [21, 3]],
                         gen_time_s=1.0)
    ack = asyncio.run(state.evaluation.submit_scored(req, StandInScoring([OverBudget("over budget"), 1.0])))
    assert ack.accepted and state.evaluation.board.running.correct == [False, True]
    (record,) = [e for e in event_records(state) if e["kind"] == "scoring_over_budget"]
    assert (record["worker_id"], record["what"], record["completion"]) == ("w0", "evaluation", 0)


def test_the_coordinators_own_stall_evicts_no_worker(tmp_path, tiny_model_dir):
    clock = FakeClock()
    state = make_state(tmp_path, tiny_model_dir, clock)  # worker_timeout_s = 5
    register(state, "a")
    clock.now += 4.0
    state.fleet_desk.excuse_stall(3.0)  # the loop did not run for 3 of those 4 s
    clock.now += 3.0
    state.fleet_desk.sweep()
    assert state.registry.workers["a"].alive
    clock.now += 2.5
    state.fleet_desk.sweep()
    assert not state.registry.workers["a"].alive  # a worker really silent is still lost


def test_the_server_notices_its_event_loop_stalled(tmp_path, tiny_model_dir):
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    register(state, "a")
    metrics = tmp_path / "metrics.jsonl"

    async def scenario(session, url):
        await asyncio.sleep(0.3)
        time.sleep(1.2)  # the coordinator's own step, blocking its loop
        await asyncio.sleep(0.6)

    run_with_server(state, scenario, metrics_path=metrics)
    records = [json.loads(line) for line in metrics.read_text().splitlines()]
    (stalled,) = [r for r in records if r["kind"] == "coordinator_stalled"]
    assert stalled["stall_s"] > 0.5 and stalled["workers_excused"] == 1 and state.registry.workers["a"].alive


def test_the_budget_is_the_scoring_process_cpu_time_not_the_event_loops(tmp_path, tiny_model_dir):
    """A completion that takes 0.3 s of CPU to score, under a 0.5 s budget, scored on one core
    that a busy coordinator loop shares: its wall time runs past the budget, its own CPU time
    does not, and it is no strike (measured on the loop it was one: honest workers drew strikes
    while a loaded coordinator crawled). A busy loop in the scorer is still cut off after about
    its budget of CPU."""
    state = make_state(tmp_path, tiny_model_dir, FakeClock())
    tokenizer = state.scorer.tokenizer
    slow = _completion(tokenizer.encode(SLOW, add_special_tokens=False).ids + [tokenizer.token_to_id("<eos>")])
    cores = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(cores)})  # the pool's process inherits it: one core for both
    pool = ScoringPool(hanging_recipe(str(tiny_model_dir)), processes=1, timeout_s=0.5)

    async def busy_loop(seconds: float) -> None:
        until = time.monotonic() + seconds
        while time.monotonic() < until:
            slice_until = time.monotonic() + 0.02
            while time.monotonic() < slice_until:
                pass
            await asyncio.sleep(0)

    async def main():
        await pool.start()
        try:
            await pool.wait_ready(timeout_s=120)
            busy = asyncio.ensure_future(busy_loop(3.0))
            started = time.monotonic()
            scored = await pool.score(rollout_jobs(0, [slow]))
            scored_s = time.monotonic() - started
            await busy
            hung = await pool.score(rollout_jobs(0, [_hanging(state)]))
            return scored, scored_s, hung, list(pool.killed)
        finally:
            await pool.stop()

    try:
        scored, scored_s, hung, killed = asyncio.run(asyncio.wait_for(main(), timeout=180))
    finally:
        os.sched_setaffinity(0, cores)
    print(f"\n0.3 s of scoring took {scored_s:.2f} s beside the busy loop")
    assert scored_s > 0.5 and isinstance(scored[0], float), (scored_s, scored)
    assert isinstance(hung[0], OverBudget) and "of CPU" in hung[0].reason and len(killed) == 1

"""The coordinator's state machine: leases, expiry, admission, batches, restart, bad input."""

from __future__ import annotations

import copy

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from tests.unit.coordinator_helpers import (
    FakeClock,
    answer_ids,
    lease,
    make_state,
    past_slow_start,
    publish,
    register,
    submission,
)

from echo2.coordinator.http.view import snapshot
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.state import CoordinatorState
from echo2.protocol.messages import Heartbeat, RegisterRequest, RolloutCompletion


@pytest.fixture
def clock():
    return FakeClock()


@pytest.fixture
def state(tmp_path, tiny_model_dir, clock):
    return make_state(tmp_path, tiny_model_dir, clock)


def test_no_work_before_a_version_is_published(state):
    register(state, "a")
    reply = lease(state, "a", 0)
    assert reply.tasks == [] and "no policy" in reply.reason


def test_lease_submit_batch_round_trip(state):
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)
    tasks = lease(state, "a", 0, max_tasks=2).tasks
    assert len(tasks) == 2 and tasks[0].prompt_ids
    assert state.learner_desk.take_batch(0) is None
    replies = [state.intake.submit(submission(state, "a", t.lease_id, 0)) for t in tasks]
    assert all(r.accepted and r.rewards == [1.0, 0.0] for r in replies)
    batch = state.learner_desk.take_batch(0)
    assert [g.lease_id for g in batch] == [t.lease_id for t in tasks]
    # asking again for the same step returns the same batch: a restarted learner replays it
    assert state.learner_desk.take_batch(0) == batch
    assert state.counters.trained == 2 and state.groups.buffer == []


def test_rewards_are_computed_by_the_coordinator(state):
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    wrong = answer_ids(state, task.lease_id, correct=False)
    bad = [RolloutCompletion(token_ids=wrong, logprobs=[-1.0] * len(wrong))] * 2
    reply = state.intake.submit(submission(state, "a", task.lease_id, 0, completions=bad))
    assert reply.rewards == [0.0, 0.0]


def test_capacity_and_stale_worker_refusal(state):
    register(state, "a")
    register(state, "b")
    past_slow_start(state, "a", "b")
    publish(state, 0)
    # S = 1, two groups per step, nothing taken: (1 + 0 + 1) x 2 = 4 groups, at most 2 per worker
    assert len(lease(state, "a", 0, max_tasks=10).tasks) == 2
    assert len(lease(state, "b", 0, max_tasks=10).tasks) == 2
    register(state, "c")
    assert lease(state, "c", 0).reason.startswith("window full")
    publish(state, 1)
    publish(state, 2)
    reply = lease(state, "c", 0)
    assert reply.tasks == [] and "too stale" in reply.reason


def test_version_from_the_future_is_refused(state):
    register(state, "a")
    publish(state, 0)
    with pytest.raises(RequestError) as err:
        lease(state, "a", 1)
    assert err.value.status == 422 and "future" in err.value.message


def test_silent_worker_leases_go_back_and_late_results_are_refused(state, clock):
    register(state, "a")
    register(state, "b")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    prompt = state.leases_book.leases[task.lease_id].prompt_index
    clock.now += 3
    state.worker_desk.heartbeat(Heartbeat(worker_id="b", version=0))
    clock.now += 3  # a silent for 6 s > worker_timeout_s = 5; b beat 3 s ago
    state.fleet_desk.sweep()
    assert not state.registry.workers["a"].alive and state.registry.workers["b"].alive
    assert list(state.leases_book.queue) == [prompt]
    with pytest.raises(RequestError) as err:
        state.intake.submit(submission(state, "a", task.lease_id, 0) if task.lease_id in state.leases_book.leases
                            else _late(task.lease_id))
    assert err.value.status == 404
    register(state, "a")  # it comes back: the old lease stays void
    with pytest.raises(RequestError) as err:
        state.intake.submit(_late(task.lease_id))
    assert err.value.status == 409
    again = lease(state, "b", 0).tasks[0]
    assert state.leases_book.leases[again.lease_id].prompt_index == prompt  # re-leased, to exactly one worker


def _late(lease_id: str):
    from echo2.protocol.messages import RolloutSubmission

    completion = RolloutCompletion(token_ids=[20, 3], logprobs=[-0.1, -0.1])
    return RolloutSubmission(worker_id="a", lease_id=lease_id, version=0, completions=[completion] * 2, gen_time_s=0.1)


def test_lease_timeout_requeues_even_with_heartbeats(state, clock):
    register(state, "a")
    publish(state, 0)
    lease(state, "a", 0)
    for _ in range(13):
        clock.now += 5
        state.worker_desk.heartbeat(Heartbeat(worker_id="a", version=0))
        state.fleet_desk.sweep()
    assert state.leases_book.leases == {} and len(state.leases_book.queue) == 1 and state.counters.leases_expired == 1


@pytest.mark.parametrize("base_version", [7, -2])
def test_a_heartbeat_claiming_a_base_from_the_future_or_below_none_is_refused(state, base_version):
    """base_version (the delta base a worker says it holds) steers its catch-up plan: a version
    not yet published is refused, and one below -1 never parses."""
    from pydantic import ValidationError

    register(state, "a")
    publish(state, 0)
    if base_version < -1:
        with pytest.raises(ValidationError):
            Heartbeat(worker_id="a", version=0, base_version=base_version)
        return
    with pytest.raises(RequestError) as err:
        state.worker_desk.heartbeat(Heartbeat(worker_id="a", version=0, base_version=base_version))
    assert err.value.status == 422 and "heartbeat.base_version" in err.value.message


BAD_SUBMISSIONS = {
    "wrong group size": lambda ok: {"completions": ok.completions[:1]},
    "token outside vocabulary": lambda ok: {"completions": [RolloutCompletion(token_ids=[10**6], logprobs=[-1.0])] * 2},
    "logprobs length": lambda ok: {"completions": [RolloutCompletion(token_ids=[20, 21], logprobs=[-1.0])] * 2},
    "positive logprob": lambda ok: {"completions": [RolloutCompletion(token_ids=[20], logprobs=[3.0])] * 2},
    "fabricated logprob": lambda ok: {"completions": [RolloutCompletion(token_ids=[20], logprobs=[-100.0])] * 2},
    "too many tokens": lambda ok: {"completions": [RolloutCompletion(token_ids=[20] * 9, logprobs=[-1.0] * 9)] * 2},
    "empty completion": lambda ok: {"completions": [RolloutCompletion(token_ids=[], logprobs=[])] * 2},
    "version from the future": lambda ok: {"version": 5},
}


@pytest.mark.parametrize("case", sorted(BAD_SUBMISSIONS))
def test_bad_submission_is_refused_and_changes_nothing(state, case):
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    ok = submission(state, "a", task.lease_id, 0)
    before = (copy.deepcopy(snapshot(state)), dict(state.leases_book.leases), list(state.groups.buffer))
    with pytest.raises(RequestError) as err:
        state.intake.submit(ok.model_copy(update=BAD_SUBMISSIONS[case](ok)))
    assert err.value.status == 422
    assert (snapshot(state), dict(state.leases_book.leases), list(state.groups.buffer)) == before
    assert state.intake.submit(ok).accepted  # the lease is still valid after the refusal


def test_stale_groups_are_dropped_not_trained(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=0, groups_per_step=1)
    register(state, "a")
    publish(state, 0)
    task = lease(state, "a", 0).tasks[0]
    state.intake.submit(submission(state, "a", task.lease_id, 0))
    assert state.learner_desk.take_batch(0) is not None
    task = lease(state, "a", 0).tasks  # S = 0 and step 0 taken: no room until version 1
    assert task == []
    publish(state, 1)
    t1 = lease(state, "a", 1).tasks[0]
    # a straggler of version 0 arriving now would be stale at step 1: simulate one buffered
    state.groups.buffer.append(state.store.batch(0)[0].model_copy(update={"lease_id": "old", "version": 0}))
    state.intake.submit(submission(state, "a", t1.lease_id, 1))
    batch = state.learner_desk.take_batch(1)
    assert [g.version for g in batch] == [1] and state.counters.dropped_stale == 1
    # the straggler was admitted when it came: expiring in the buffer does not charge its
    # worker's admitted share (the controller's credit for it)
    view = state.controller.workers["a"]
    assert view.outcomes_n == view.admitted_n == 2 and view.admitted.value == 1.0


def test_restart_keeps_buffer_and_requeues_leased_prompts(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock)
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)
    t1, t2 = lease(state, "a", 0, max_tasks=2).tasks
    state.intake.submit(submission(state, "a", t1.lease_id, 0))
    leased_prompt = state.leases_book.leases[t2.lease_id].prompt_index
    state.store.close()
    revived = make_state(tmp_path, tiny_model_dir, clock)
    assert [g.lease_id for g in revived.groups.buffer] == [t1.lease_id]
    assert list(revived.leases_book.queue) == [leased_prompt] and revived.leases_book.cursor == 2
    assert revived.versions.current == 0
    register(revived, "a")
    again = lease(revived, "a", 0).tasks[0]
    assert revived.leases_book.leases[again.lease_id].prompt_index == leased_prompt


OPS = st.lists(
    st.tuples(st.sampled_from(["lease", "submit", "batch", "publish", "tick", "sweep"]), st.integers(0, 3)),
    max_size=60,
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=OPS)
def test_every_prompt_is_in_exactly_one_place(tmp_path_factory, tiny_model_dir, ops):
    clock = FakeClock()
    state = make_state(tmp_path_factory.mktemp("prop"), tiny_model_dir, clock, max_staleness=1)
    for w in "abc":
        register(state, w)
    publish(state, 0)
    versions = {"a": 0, "b": 0, "c": 0}
    step, trained = 0, []
    for op, arg in ops:
        worker = "abc"[arg % 3]
        if op == "lease":
            if not state.registry.workers[worker].alive:
                register(state, worker)  # what a real worker does on 404
            lease(state, worker, versions[worker], max_tasks=arg + 1)
        elif op == "submit":
            live = sorted((x for x in state.leases_book.leases.values() if state.registry.workers[x.worker_id].alive),
                          key=lambda x: x.lease_id)
            if live:
                lease_ = live[arg % len(live)]
                state.intake.submit(submission(state, lease_.worker_id, lease_.lease_id, lease_.version))
        elif op == "batch":
            batch = state.learner_desk.take_batch(step)
            if batch:
                trained += [(step, g) for g in batch]
                step += 1
                publish(state, step)
        elif op == "publish":
            versions[worker] = state.versions.current
        elif op == "tick":
            clock.now += 2.0 * (arg + 1)
        else:
            state.fleet_desk.sweep()
        _check_invariants(state, trained)


def _check_invariants(state: CoordinatorState, trained: list) -> None:
    places = [("queue", i) for i in state.leases_book.queue]
    places += [("lease", lease.prompt_index) for lease in state.leases_book.leases.values()]
    places += [("buffer", g.prompt_index) for g in state.groups.buffer]
    places += [("trained", g.prompt_index) for _, g in trained]
    indices = [i for _, i in places]
    assert len(indices) == len(set(indices)), places  # never handed out or trained twice
    for step, group in trained:
        assert step - group.version <= state.cfg.train.max_staleness


def test_rejected_batch_is_retired_and_the_step_gets_a_fresh_one(tmp_path, tiny_model_dir, clock):
    state = make_state(tmp_path, tiny_model_dir, clock)
    register(state, "a")
    past_slow_start(state, "a")
    publish(state, 0)
    for task in lease(state, "a", 0, max_tasks=2).tasks:
        state.intake.submit(submission(state, "a", task.lease_id, 0))
    first = state.learner_desk.take_batch(0)
    with pytest.raises(RequestError, match="newest assigned batch is step 0"):
        state.learner_desk.reject_batch(1, "not assigned yet")
    assert state.learner_desk.reject_batch(0, "gradient norm is nan") == 2
    assert state.learner_desk.reject_batch(0, "a retry whose answer was lost") == 0  # idempotent
    assert state.counters.rejected_by_learner == 2 and state.counters.trained == 0
    assert state.learner_desk.take_batch(0) is None  # never the poisoned groups again
    for task in lease(state, "a", 0, max_tasks=2).tasks:
        state.intake.submit(submission(state, "a", task.lease_id, 0))
    second = state.learner_desk.take_batch(0)
    assert second and not {g.lease_id for g in second} & {g.lease_id for g in first}
    state.store.close()
    revived = make_state(tmp_path, tiny_model_dir, clock)  # the new batch is the step's for good
    assert revived.learner_desk.take_batch(0) == second and revived.counters.rejected_by_learner == 2


def test_one_worker_cannot_lease_the_whole_window(tmp_path, tiny_model_dir, clock):
    """A worker that claims to be fast (or just asks) holds at most one step's worth of leases;
    the rest of the staleness window stays for the others."""
    state = make_state(tmp_path, tiny_model_dir, clock, max_staleness=3, groups_per_step=2)
    register(state, "greedy")
    register(state, "honest")
    past_slow_start(state, "greedy", "honest")  # a new id's allowance is test_lease_trust's
    publish(state, 0)
    assert len(lease(state, "greedy", 0, max_tasks=100).tasks) == 2
    refused = lease(state, "greedy", 0, max_tasks=100)
    assert refused.tasks == [] and "holding 2 leases" in refused.reason
    assert len(lease(state, "honest", 0, max_tasks=100).tasks) == 2


def test_registrations_are_rate_limited_per_source_address(state, clock):
    for i in range(60):  # a burst of a minute's worth is fine: a fleet behind one NAT
        state.worker_desk.register(RegisterRequest(worker_id=f"n{i}", engine="hf"), source="10.0.0.1")
    with pytest.raises(RequestError, match="too many registrations from 10.0.0.1") as err:
        state.worker_desk.register(RegisterRequest(worker_id="n60", engine="hf"), source="10.0.0.1")
    assert err.value.status == 429
    state.worker_desk.register(RegisterRequest(worker_id="elsewhere", engine="hf"), source="10.0.0.2")  # not shared
    clock.now += 1.0  # one more a second
    state.worker_desk.register(RegisterRequest(worker_id="n60", engine="hf"), source="10.0.0.1")


def test_gone_workers_that_did_nothing_are_forgotten(state, clock):
    publish(state, 0)
    for i in range(50):
        state.worker_desk.register(RegisterRequest(worker_id=f"fake{i}", engine="hf"), source=f"10.1.0.{i}")
    register(state, "real")
    task = lease(state, "real", 0).tasks[0]
    assert state.intake.submit(submission(state, "real", task.lease_id, 0)).accepted
    clock.now += state.cfg.coordinator.worker_timeout_s + 1
    state.fleet_desk.sweep()  # all time out
    assert len(state.registry.workers) == 51 and not any(w.alive for w in state.registry.workers.values())
    clock.now += state.cfg.coordinator.forget_workers_after_s + 1
    state.fleet_desk.sweep()
    assert list(state.registry.workers) == ["real"]  # it did work: kept for the run's accounting
    assert set(state.registry.credentials.values()) == {"real"} and not state.registry.join_buckets


def test_registration_tells_workers_the_runs_lora_settings(tmp_path, tiny_model_dir, clock):
    """A vLLM worker must reserve adapter room when it builds its engine, before any version."""
    lora = {"r": 8, "alpha": 16.0, "target_modules": ["q_proj", "v_proj"]}
    state = make_state(tmp_path, tiny_model_dir, clock, config={"grpo": {"lora": lora}})
    registered = state.worker_desk.register(RegisterRequest(worker_id="a", engine="vllm"))
    assert registered.lora.model_dump(mode="json") == lora
    plain = make_state(tmp_path / "plain", tiny_model_dir, clock)
    assert plain.worker_desk.register(RegisterRequest(worker_id="a", engine="vllm")).lora is None


def test_a_restarted_coordinator_still_plans_deltas_for_workers_behind(tmp_path, tiny_model_dir, clock):
    """The forms the learner's origin serves survive a coordinator restart: a worker two
    versions behind is sent the deltas (two small fetches), not made to wait for an anchor."""
    import numpy as np
    from safetensors.numpy import save
    from tests.unit.coordinator_helpers import LEARNER_KEY, LEARNER_KEY_HEX, version_info

    from echo2.broadcast.signing import sign_manifest
    from echo2.config.broadcast import BroadcastConfig
    from echo2.coordinator.records.store import Store
    from echo2.protocol.manifest import build_manifest, content_index
    from echo2.protocol.messages import VersionInfo

    def delta(version: int) -> VersionInfo:  # a delta of `version` against version - 1 (its bytes do not matter here)
        content = save({"w": np.full(4, version, dtype=np.float32)})
        manifest = build_manifest(version, bytes(40), 16, base_version=version - 1, codec="sub-zstd",
                                  content=content_index(content), content_bytes=len(content))
        return VersionInfo(version=version, signed=sign_manifest(manifest, LEARNER_KEY), origin_url="http://learner:1",
                           published_at=1.0)

    def restarted() -> CoordinatorState:
        state = make_state(tmp_path, tiny_model_dir, clock)  # the same store
        cfg = state.cfg.model_copy(update={"broadcast": BroadcastConfig(deltas=True)})
        state.store.close()
        state = CoordinatorState(cfg, Store(tmp_path / "coordinator.db"), state.scorer, clock=clock)
        register(state, "a")
        return state

    def next_fetch(state) -> tuple[int, str] | None:
        reply = state.worker_desk.heartbeat(Heartbeat(worker_id="a", version=0))
        fetch = reply.fetch or (reply.latest if reply.assignment is not None else None)  # none: the newest itself
        return None if fetch is None else (fetch.version, fetch.signed.unverified_manifest().form)

    state = restarted()
    state.learner_desk.publish(version_info(0), LEARNER_KEY_HEX)
    for version in (1, 2):
        state.learner_desk.publish(delta(version), LEARNER_KEY_HEX)
    assert next_fetch(state) == (1, "delta")
    state.store.close()

    state = restarted()  # the coordinator restarts; the learner and its origin do not
    assert next_fetch(state) == (1, "delta") and not state.versions.dissemination.anchor_wanted
    # the learner restarts too: it publishes the newest again, and its new origin serves no delta
    state.learner_desk.publish(delta(2).model_copy(update={"origin_url": "http://learner:2"}), LEARNER_KEY_HEX)
    assert next_fetch(state) is None and state.versions.dissemination.anchor_wanted
    assert state.store.offers() == [state.versions.dissemination.stored_offers()[2, "delta"]]

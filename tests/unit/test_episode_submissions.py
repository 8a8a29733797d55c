"""The coordinator and multi-turn episodes: leases carry the episode seed, registration the task,
rewards come from the coordinator's replay, and a worker whose actions do not reproduce the
transcript it submitted is refused (so is one claiming a reward it did not earn). Each lease
carries a sampler seed too, kept with the group for the learner's audit of the actions."""

from __future__ import annotations

import random

import pytest
from tests.unit.coordinator_helpers import FakeClock, event_records, lease, make_state, publish

from echo2.config.run import load_run_config
from echo2.coordinator.records.errors import RequestError
from echo2.coordinator.scoring.scorer import make_scorer
from echo2.envs.play import play
from echo2.protocol.messages import (
    RegisterRequest,
    RolloutCompletion,
    RolloutSubmission,
    SamplingParams,
    TrainGroup,
)
from echo2.tasks import make_task

SAMPLING = SamplingParams(temperature=1.0, max_new_tokens=4, group_size=3)


@pytest.fixture
def state(tmp_path, tiny_model_dir):
    cfg = load_run_config(None, ["task.name=poker", "task.game=leduc", "task.opponent=calling_station"])
    scorer = make_scorer(make_task(cfg.task, cfg.seed), str(tiny_model_dir), SAMPLING.max_new_tokens)
    s = make_state(tmp_path, tiny_model_dir, FakeClock(), sampling=SAMPLING, scorer=scorer)
    reply = s.worker_desk.register(RegisterRequest(worker_id="a", engine="hf"))
    assert reply.task.name == "poker" and reply.task.game == "leduc"  # what the worker plays
    publish(s, 0)
    return s


def play_lease(state, task, letters="cb"):
    """What an honest worker does: G episodes from the lease's seed, actions from a policy."""
    scorer, rng = state.scorer, random.Random(1)
    episodes = [scorer.task.episode(scorer.codec, task.episode_seed, task.sampling.max_new_tokens)
                for _ in range(task.sampling.group_size)]
    assert episodes[0].prompt_ids == task.prompt_ids
    play(episodes, lambda batch: [(scorer.codec.encode(rng.choice(letters)) + [scorer.codec.eos_id], [-0.4, -0.2])
                                  for _ in batch])
    return episodes


def submit(state, task, completions):
    return state.intake.submit(RolloutSubmission(worker_id="a", lease_id=task.lease_id, version=0,
                                                 completions=completions, gen_time_s=0.1))


def wire(episodes, **changes):
    return [RolloutCompletion(token_ids=e.token_ids, logprobs=e.logprobs, segments=e.segments).model_copy(
        update=changes) for e in episodes]


def test_an_honest_group_is_scored_by_replay(state):
    task = lease(state, "a", 0).tasks[0]
    assert task.episode_seed == state.scorer.task.train_seed(state.leases_book.leases[task.lease_id].prompt_index)
    episodes = play_lease(state, task)
    reply = submit(state, task, wire(episodes))
    assert reply.accepted and reply.rewards == [e.reward for e in episodes]
    group = TrainGroup.model_validate(state.groups.buffer[-1])
    assert group.prompt_ids == task.prompt_ids and group.completions[0].segments == episodes[0].segments
    replayed = [e for e in event_records(state) if e["kind"] == "episodes_replayed"]
    assert replayed[-1]["episodes"] == SAMPLING.group_size and replayed[-1]["replay_s"] > 0


def test_an_episode_lease_carries_a_sampler_seed_its_group_keeps(state):
    """The worker draws every action with it; the learner's audit checks them against it."""
    task = lease(state, "a", 0).tasks[0]
    assert task.episode_seed is not None and task.sampling_seed == state.leases_book.seed_of(task.lease_id)
    assert submit(state, task, wire(play_lease(state, task))).accepted
    assert TrainGroup.model_validate(state.groups.buffer[-1]).sampling_seed == task.sampling_seed
    following = lease(state, "a", 0).tasks[0]
    assert following.sampling_seed == state.leases_book.seed_of(following.lease_id) != task.sampling_seed


def test_a_free_sampling_workers_episodes_carry_no_seed(tmp_path, tiny_model_dir):
    """Audited by log-probs only (audit.require_seeded_sampler = false lets it in), as for
    single-turn groups."""
    cfg = load_run_config(None, ["task.name=poker", "task.game=leduc", "task.opponent=calling_station"])
    scorer = make_scorer(make_task(cfg.task, cfg.seed), str(tiny_model_dir), SAMPLING.max_new_tokens)
    lenient = make_state(tmp_path, tiny_model_dir, FakeClock(), sampling=SAMPLING, scorer=scorer,
                         require_seeded_sampler=False)
    lenient.worker_desk.register(RegisterRequest(worker_id="v", engine="vllm", sampler="free"))
    publish(lenient, 0)
    task = lease(lenient, "v", 0).tasks[0]
    reply = lenient.intake.submit(RolloutSubmission(worker_id="v", lease_id=task.lease_id, version=0, gen_time_s=0.1,
                                             completions=wire(play_lease(lenient, task))))
    assert reply.accepted and TrainGroup.model_validate(lenient.groups.buffer[-1]).sampling_seed is None


def test_a_transcript_its_actions_do_not_reproduce_is_refused(state):
    task = lease(state, "a", 0).tasks[0]
    episodes = play_lease(state, task)
    victim = max(episodes, key=lambda e: len(e.segments))
    assert len(victim.segments) >= 3
    ids = list(victim.token_ids)
    action = state.scorer.codec.decode_action(ids[:victim.segments[0]])
    # the first action flipped, the rest of the transcript (the environment's answers) kept
    ids[0] = state.scorer.codec.encode("b" if action == "c" else "c")[0]
    doctored = wire(episodes)
    doctored[episodes.index(victim)] = RolloutCompletion(token_ids=ids, logprobs=victim.logprobs,
                                                         segments=victim.segments)
    with pytest.raises(RequestError) as refused:
        submit(state, task, doctored)
    assert refused.value.status == 422 and "does not replay" in refused.value.message
    assert [e for e in event_records(state) if e["kind"] == "replay_refused"][-1]["worker_id"] == "a"
    assert not state.groups.buffer  # nothing of the group is trained
    assert submit(state, task, wire(episodes)).accepted  # the honest transcript still is


def test_a_claimed_win_that_was_not_played_is_refused(state):
    """A worker cannot stop a losing hand early or splice in a winning ending."""
    task = lease(state, "a", 0).tasks[0]
    episodes = play_lease(state, task)
    long = max(episodes, key=lambda e: len(e.segments))
    cut = RolloutCompletion(token_ids=long.token_ids[:long.segments[0]], logprobs=long.logprobs[:long.segments[0]],
                            segments=long.segments[:1])
    with pytest.raises(RequestError, match="before the episode ended"):
        submit(state, task, [cut] + wire(episodes)[1:])


@pytest.mark.parametrize(("change", "message"), [
    ({"segments": []}, "expected an odd number"),
    ({"segments": [1, 1]}, "expected an odd number"),
    ({"logprobs": None}, "environment tokens carry log-probs"),
])
def test_malformed_episodes_are_refused_before_any_replay(state, change, message):
    task = lease(state, "a", 0).tasks[0]
    episodes = play_lease(state, task)
    e = max(episodes, key=lambda e: len(e.segments))
    if "logprobs" in change:
        change = {"logprobs": [-0.3] * len(e.token_ids)}  # hides values in the environment's tokens
    bad = [RolloutCompletion(token_ids=e.token_ids, logprobs=e.logprobs, segments=e.segments).model_copy(
        update=change)] + wire(episodes)[1:]
    with pytest.raises(RequestError, match=message):
        submit(state, task, bad)


def test_a_single_turn_task_refuses_segments(tmp_path, tiny_model_dir):
    from tests.unit.coordinator_helpers import register, submission

    s = make_state(tmp_path, tiny_model_dir, FakeClock())
    register(s, "a")
    publish(s, 0)
    task = lease(s, "a", 0).tasks[0]
    assert task.episode_seed is None
    honest = submission(s, "a", task.lease_id, 0)
    marked = [c.model_copy(update={"segments": [len(c.token_ids)]}) for c in honest.completions]
    with pytest.raises(RequestError, match="single-turn"):
        s.intake.submit(honest.model_copy(update={"completions": marked}))

"""Episodes through the chat template: the transcript alternates the model's actions and the
environment's answers (segments, log-probs 0 for the environment), budgets of turns and tokens
end it, and a replay from the seed reproduces an honest transcript and refuses a doctored one."""

from __future__ import annotations

import random

import pytest

from echo2.config.run import load_run_config
from echo2.envs.episode import EpisodeError, ReplayMismatch, replay
from echo2.envs.play import play
from echo2.envs.transcript import Codec
from echo2.tasks import make_task


def poker(*overrides):
    cfg = load_run_config(None, ["task.name=poker", *overrides])
    return make_task(cfg.task, cfg.seed)


def scripted(codec, rng, letters="cbf"):
    """A policy that answers with a random letter (legal or not) and the end-of-sequence token."""
    def generate(batch):
        return [(codec.encode(rng.choice(letters)) + [codec.eos_id], [-0.7, -0.1]) for _ in batch]
    return generate


def played(task, codec, seeds, max_action_tokens=4, letters="cb"):
    episodes = [task.episode(codec, seed, max_action_tokens) for seed in seeds]
    play(episodes, scripted(codec, random.Random(0), letters))
    return episodes


def test_transcript_alternates_actions_and_environment_answers(tiny_model_dir):
    task = poker("task.game=leduc", "task.opponent=calling_station")
    codec = Codec.from_source(str(tiny_model_dir), task.cfg)
    episodes = played(task, codec, range(20))
    multi = [e for e in episodes if len(e.segments) >= 3]
    assert multi, "a calling station lets every hand reach a second action"
    for e in episodes:
        assert e.finished and len(e.segments) % 2 == 1 and sum(e.segments) == len(e.token_ids) == len(e.logprobs)
        start = 0
        for index, length in enumerate(e.segments):
            piece, lps = e.token_ids[start:start + length], e.logprobs[start:start + length]
            if index % 2 == 0:
                assert piece[-1] == codec.eos_id and lps == [-0.7, -0.1]
            else:
                text = codec.tokenizer.decode(piece, skip_special_tokens=False)
                assert text.startswith("<|end|>\n<|user|>") and text.endswith("<|end|>\n<|assistant|>")
                assert text.split("<|end|>")[1][-1] in "JQK" and " legal " in text
                assert set(lps) == {0.0}
            start += length
    prompt = codec.tokenizer.decode(episodes[0].prompt_ids, skip_special_tokens=False)
    assert " pot 2 call 0 legal cb board - hand " in prompt and "\nOne letter: f fold" in prompt
    assert prompt.startswith("<|user|>") and prompt.endswith("<|assistant|>")


def test_budgets_end_an_episode(tiny_model_dir):
    guess = make_task(load_run_config(None, ["task.name=guess_number", "task.high=1000", "task.max_guesses=50",
                                             "task.max_turns=3"]).task, 0)
    codec = Codec.from_source(str(tiny_model_dir), guess.cfg)
    by_turns = played(guess, codec, range(5), letters="0123456789")
    # single digits rarely find a number up to 1000: three guesses, then the turn budget
    assert any(e.ended == "turns" and e.turns == 3 for e in by_turns)
    tight = make_task(load_run_config(None, ["task.name=guess_number", "task.high=1000", "task.max_guesses=50",
                                             "task.max_episode_tokens=40"]).task, 0)
    by_tokens = played(tight, codec, range(5), letters="0123456789")
    assert any(e.ended == "tokens" for e in by_tokens)
    assert all(len(e.token_ids) <= 40 for e in by_tokens)
    episode = tight.episode(codec, 1, max_action_tokens=3)
    with pytest.raises(EpisodeError, match="allows 1..3"):
        episode.act(codec.encode("1234"))
    with pytest.raises(EpisodeError, match="end-of-sequence token inside"):
        episode.act([codec.eos_id] + codec.encode("1"))


def test_an_honest_transcript_replays_to_the_same_reward(tiny_model_dir):
    task = poker("task.game=leduc")
    codec = Codec.from_source(str(tiny_model_dir), task.cfg)
    seeds = [task.train_seed(i) for i in range(30)]
    episodes = played(task, codec, seeds, letters="cbf")
    assert {e.illegal for e in episodes} == {True, False}
    for seed, e in zip(seeds, episodes, strict=True):
        again = replay(task.episode(codec, seed, 4), e.token_ids, e.segments)
        assert again.reward == e.reward and again.token_ids == e.token_ids and again.actions == e.actions


def doctor(task, codec, seeds):
    """A multi-turn honest episode and its seed."""
    for seed, e in zip(seeds, played(task, codec, seeds), strict=True):
        if len(e.segments) >= 3:
            return seed, e
    raise AssertionError("no multi-turn episode")


def test_a_doctored_transcript_is_refused(tiny_model_dir):
    task = poker("task.game=leduc", "task.opponent=calling_station")
    codec = Codec.from_source(str(tiny_model_dir), task.cfg)
    seed, honest = doctor(task, codec, range(10))
    ids, segments = honest.token_ids, honest.segments
    first_env = slice(segments[0], segments[0] + segments[1])

    def fresh():
        return task.episode(codec, seed, 4)

    # an environment answer the environment never gave (a better card, say)
    forged = list(ids)
    answer = codec.tokenizer.decode(forged[first_env], skip_special_tokens=False)
    at = answer.index(" hand ") + 6
    forged[first_env] = codec.encode(answer[:at] + ("K" if answer[at] != "K" else "Q") + answer[at + 1:])
    with pytest.raises(ReplayMismatch, match="segment 1"):
        replay(fresh(), forged, segments)
    # another action under the same answers
    swapped = list(ids)
    swapped[0] = codec.encode("c" if codec.decode_action(ids[:segments[0]]) == "b" else "b")[0]
    with pytest.raises(ReplayMismatch):
        replay(fresh(), swapped, segments)
    # stopping before the episode ended (a hand that was going badly, say)
    cut = sum(segments[:1])
    with pytest.raises(ReplayMismatch, match="before the episode ended"):
        replay(fresh(), ids[:cut], segments[:1])
    # going on after it ended
    with pytest.raises(ReplayMismatch, match="goes on"):
        replay(fresh(), ids + ids[:segments[0]] * 2, segments + [segments[0]] * 2)
    with pytest.raises(ReplayMismatch, match="summing"):
        replay(fresh(), ids, segments[:-1])
    # another seed's deal under the same actions
    with pytest.raises(ReplayMismatch):
        for other in range(seed + 1, seed + 40):
            replay(task.episode(codec, other, 4), ids, segments)


def test_without_a_chat_template_the_action_follows_each_observation(tiny_model_dir):
    task = poker("task.chat_template=false", "task.instruction=''", "task.opponent=calling_station")
    codec = Codec.from_source(str(tiny_model_dir), task.cfg)
    for e in played(task, codec, range(10)):
        assert codec.tokenizer.decode(e.prompt_ids).startswith("opp ")
        assert codec.tokenizer.decode(e.prompt_ids)[-6:-1] == "hand "
        start = 0
        for index, length in enumerate(e.segments):
            if index % 2:
                text = codec.tokenizer.decode(e.token_ids[start:start + length])
                assert text.startswith("\nopp ") and text[-6:-1] == "hand ", text
            start += length

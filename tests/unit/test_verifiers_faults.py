"""A verifiers environment that misbehaves is bounded and reported, and the episode goes on:
a tool that raises or hangs answers the model with one error line (after `tool_timeout_s` for
the hang), a flood is cut to `max_tool_output_chars`, and a reward function that raises scores
the episode 0 with the error recorded. The same transcript replays at the coordinator, its
tools failing the same way."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

pytest.importorskip("verifiers.v1")

from echo2.envs.verifiers_env import VerifiersEpisodes, VerifiersSpec  # noqa: E402
from echo2.models.tiny import build_char_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
CALLS = ['<tool_call>{"name": "bad_boom", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "bad_flood", "arguments": {}}</tool_call>',
         '<tool_call>{"name": "bad_hang", "arguments": {"seconds": 3}}</tool_call>',
         "ok"]


@pytest.fixture(scope="module")
def faulty(tmp_path_factory):
    tokenizer_dir = tmp_path_factory.mktemp("tok")
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tokenizer_dir)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), previous]))  # the tool server's import
    spec = VerifiersSpec("tests.unit.vf_faulty_env", {}, max_turns=6, max_new_tokens=96, tool_parser="hermes-text",
                         tool_timeout_s=1.0, max_tool_output_chars=50, episode_timeout_s=60.0)
    try:
        with VerifiersEpisodes(spec, str(tokenizer_dir)) as episodes:
            yield episodes, tokenizer
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous


def _scripted(tokenizer):
    def answer(calls):
        out = []
        for call in calls:
            turn = tokenizer.decode(call.prompt_ids).count("<|assistant|>") - 1
            ids = [*tokenizer.encode(CALLS[turn], add_special_tokens=False), tokenizer.eos_token_id]
            out.append((ids, [-0.5] * len(ids)))
        return out
    return answer


def test_failing_flooding_and_hanging_tools_are_one_bounded_line_each(faulty):
    episodes, tokenizer = faulty
    started = time.monotonic()
    [episode] = episodes.play([0], _scripted(tokenizer))
    assert time.monotonic() - started < 30
    assert episode.reward == 1.0 and episode.ended == "agent_completed" and len(episode.segments) == 7
    answers = [tokenizer.decode(episode.token_ids[sum(episode.segments[:i]):sum(episode.segments[:i + 1])])
               for i in (1, 3, 5)]
    assert "Error executing tool boom: kaput" in answers[0]  # the MCP server's own error line
    assert "x" * 50 in answers[1] and "x" * 51 not in answers[1]
    assert "error: bad_hang took longer than 1 s" in answers[2]
    assert episodes.replay(0, [episode]) == [1.0]


def test_a_reward_function_that_raises_scores_zero_and_says_why(faulty):
    episodes, tokenizer = faulty
    [episode] = episodes.play([1], _scripted(tokenizer))
    assert episode.reward == 0.0 and len(episode.segments) == 7
    assert any("the reward function broke" in error for error in episode.errors), episode.errors


def test_an_episode_past_its_deadline_is_reported_failed_not_scored_as_a_wrong_answer(tmp_path):
    """verifiers ends an episode whose deadline expires as `agent_timeout` with reward 0 and no
    error; the learner's evaluation then read a loaded machine's slow turns as wrong answers."""
    tokenizer = build_char_tokenizer()
    tokenizer.save_pretrained(tmp_path)
    previous = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), previous]))
    spec = VerifiersSpec("tests.unit.vf_faulty_env", {}, max_turns=6, max_new_tokens=96, tool_parser="hermes-text",
                         tool_timeout_s=1.0, max_tool_output_chars=50, episode_timeout_s=2.0)
    scripted = _scripted(tokenizer)

    def slow(calls):  # the model's turn outlasts the episode's deadline
        time.sleep(3.0)
        return scripted(calls)

    try:
        with VerifiersEpisodes(spec, str(tmp_path)) as episodes:
            [late] = episodes.play([0], slow)
            [on_time] = episodes.play([0], scripted)
    finally:
        if previous is None:
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = previous
    assert late.reward == 0.0 and late.ended.endswith("_timeout")
    assert any("task.episode_timeout_s" in error for error in late.errors), late.errors
    assert not on_time.errors and on_time.reward == 1.0

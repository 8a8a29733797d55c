"""A worker-trusted verifiers environment (task.trust = "worker-trusted"): tools the coordinator
cannot run. The worker records what each tool call answered and sends it; the coordinator's
replay gives the tool calls those answers, still renders every environment token itself and
still computes the reward with the environment's own reward functions. Only workers holding
the trusted-worker token join such a run, and the summary names them."""

from __future__ import annotations

from dataclasses import replace

import pytest

pytest.importorskip("verifiers.v1")

from tests.unit.coordinator_helpers import FakeClock, lease, make_state, publish  # noqa: E402
from tests.unit.test_verifiers_play import CALCULATOR, scripted, tool_call  # noqa: E402

from echo2.coordinator.parts.credentials import Secrets, holds_trusted_token  # noqa: E402
from echo2.coordinator.records.errors import RequestError  # noqa: E402
from echo2.envs.episode import ReplayMismatch  # noqa: E402
from echo2.envs.tool_records import TOOL_ANSWERS, TOOL_PLAYBACK  # noqa: E402
from echo2.envs.verifiers_env import VerifiersEpisodes, VerifiersSpec  # noqa: E402
from echo2.models.tiny import build_char_tokenizer  # noqa: E402
from echo2.protocol.messages import RegisterRequest  # noqa: E402
from echo2.report.summary import summarize  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_char_tokenizer().save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


def _episodes(tokenizer_dir: str, trust: str) -> VerifiersEpisodes:
    return VerifiersEpisodes(VerifiersSpec(CALCULATOR, {"count": 20}, max_turns=3, max_new_tokens=96,
                                           tool_parser="hermes-text", trust=trust), tokenizer_dir)


@pytest.fixture(scope="module")
def trusted(tokenizer_dir):
    with _episodes(tokenizer_dir, "worker-trusted") as episodes:
        yield episodes


@pytest.fixture(scope="module")
def replayable(tokenizer_dir):
    with _episodes(tokenizer_dir, "replayable") as episodes:
        yield episodes


def _played(episodes: VerifiersEpisodes, tokenizer, index: int, *, tool_says: str | None = None):
    """One tool episode: the model calls the calculator, then answers with what the tool said
    (`tool_says`: what a worker claims it said instead, rendered as the worker's environment
    tokens and recorded as its tool answer)."""
    task = episodes.task(index)
    a, b = task.data.prompt.removeprefix("Compute ").removesuffix(".").split("+")
    call = tool_call(a, b)
    [episode] = episodes.play([index], scripted(tokenizer, lambda _, p: p.rsplit("<|tool|>", 1)[-1].split("<|end|>")[0]
                                                if "<|tool|>" in p else call))
    if tool_says is None:
        return task, episode
    start, (first, between, _) = episode.segments[0], episode.segments
    text = tokenizer.decode(episode.token_ids[start:start + between]).replace(task.data.answer, tool_says)
    forged = tokenizer.encode(text, add_special_tokens=False)
    answer = [*tokenizer.encode(tool_says, add_special_tokens=False), tokenizer.eos_token_id]
    return task, replace(episode, token_ids=episode.token_ids[:start] + forged + answer,
                         logprobs=episode.logprobs[:start] + [0.0] * len(forged) + [-0.5] * len(answer),
                         segments=[first, len(forged), len(answer)], tool_answers=[tool_says])


def test_a_worker_trusted_episode_is_replayed_with_the_tool_answers_its_worker_recorded(trusted, tokenizer):
    task, episode = _played(trusted, tokenizer, 0)
    assert episode.tool_answers == [task.data.answer]  # what the calculator answered, recorded
    assert episode.reward == 1.0 and trusted.replay(0, [episode]) == [1.0]
    assert not TOOL_ANSWERS and not TOOL_PLAYBACK  # nothing left behind by the episodes


def test_the_workers_tool_answer_is_taken_but_the_reward_is_still_the_environments(trusted, replayable, tokenizer):
    """A worker claims the calculator said one more than it did, and its model answers that: the
    replayable environment runs the tool itself and refuses the episode; the worker-trusted one
    takes the answer as recorded, and its reward function still scores the final answer wrong."""
    wrong = str(int(trusted.task(1).data.answer) + 1)
    _, claimed = _played(trusted, tokenizer, 1, tool_says=wrong)
    assert trusted.replay(1, [claimed]) == [0.0]
    with pytest.raises(ReplayMismatch, match="did not give"):
        replayable.replay(1, [claimed])


def test_tool_answers_that_do_not_render_the_episodes_tokens_are_refused(trusted, tokenizer):
    task, episode = _played(trusted, tokenizer, 2)
    wrong = str(int(task.data.answer) + 1)
    with pytest.raises(ReplayMismatch):  # the answers say one thing, the trained tokens another
        trusted.replay(2, [replace(episode, tool_answers=[wrong])])
    with pytest.raises(ReplayMismatch):  # no answer for the call the episode made
        trusted.replay(2, [replace(episode, tool_answers=[])])


def test_only_workers_holding_the_trusted_worker_token_join_a_worker_trusted_run(tmp_path, tiny_model_dir):
    task = {"name": "verifiers", "environment": CALCULATOR, "trust": "worker-trusted", "args": {"count": 20},
            "tool_parser": "hermes-text", "max_turns": 3, "eval_size": 4}
    state = make_state(tmp_path, tiny_model_dir, FakeClock(), config={"task": task})
    with pytest.raises(RequestError) as refused:
        state.worker_desk.register(RegisterRequest(worker_id="untrusted", engine="hf"))
    assert refused.value.status == 403 and "ECHO2_TRUSTED_TOKEN" in refused.value.message
    state.worker_desk.register(RegisterRequest(worker_id="trusted", engine="hf"), trusted=True)
    publish(state, 0)
    assert lease(state, "trusted", 0).tasks  # it works; the untrusted id never got a credential
    records = [{**event.record(), "time": 1.0, "role": "coordinator"} for event in state.events]  # as written
    assert summarize(records)["rewards_rest_on_workers"] == ["trusted"]


def test_the_trusted_worker_token_is_compared_in_constant_time_and_must_stand_apart():
    secrets = Secrets(join="j" * 16, learner="l" * 16, operator="o" * 16, trusted="t" * 16)
    assert holds_trusted_token(secrets, "t" * 16) and not holds_trusted_token(secrets, "t" * 15)
    assert not holds_trusted_token(Secrets(join="j" * 16, learner="l" * 16, operator="o" * 16), "")
    with pytest.raises(ValueError, match="trusted-worker token"):
        Secrets(join="j" * 16, learner="l" * 16, operator="o" * 16, trusted="j" * 16)


def test_tool_answers_are_refused_where_the_coordinator_runs_the_tools():
    from echo2.coordinator.scoring.validation import check_submission
    from echo2.protocol.messages import RolloutCompletion, RolloutSubmission, SamplingParams

    sampling = SamplingParams(temperature=1.0, max_new_tokens=8, group_size=1)
    episode = RolloutCompletion(token_ids=[1, 2, 3], logprobs=[-0.5, 0.0, -0.5], segments=[1, 1, 1],
                                tool_answers=["42"])
    req = RolloutSubmission(worker_id="w", lease_id="l", version=0, completions=[episode], gen_time_s=0.1)
    assert "send none" in check_submission(req, sampling, vocab_size=10, max_episode_tokens=16)
    assert check_submission(req, sampling, vocab_size=10, max_episode_tokens=16, tool_answers=True) is None

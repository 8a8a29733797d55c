"""verifiers environments played through echo2's turn server (echo2.envs.verifiers_*), with the
tiny model's tokenizer and a scripted model: verifiers' own agent loop, renderer, MCP tool
server and reward functions run for real; only the model's choices are scripted. Episodes come
back as echo2 transcripts of the engine's exact ids, the reward is the environment's, and a
replay from the submitted completions recomputes it and refuses an environment segment the
environment did not give."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest

pytest.importorskip("verifiers.v1")

from echo2.envs.episode import ReplayMismatch  # noqa: E402
from echo2.envs.verifiers_env import (  # noqa: E402
    EnvironmentLoadError,
    VerifiersEpisodes,
    VerifiersSpec,
    load_tasks,
    renderer_config,
)
from echo2.envs.verifiers_renderer import ExactRenderer  # noqa: E402
from echo2.models.tiny import build_char_tokenizer  # noqa: E402

ADDITION = "echo2.envs.verifiers_examples.addition"
CALCULATOR = "echo2.envs.verifiers_examples.calculator"


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("tok")
    build_char_tokenizer().save_pretrained(out)
    return str(out)


@pytest.fixture(scope="module")
def tokenizer(tokenizer_dir):
    from transformers import PreTrainedTokenizerFast

    return PreTrainedTokenizerFast.from_pretrained(tokenizer_dir)


def scripted(tokenizer, reply):
    """A model that answers each call with `reply(episode, prompt text)` and its end-of-sequence
    token, cut to the call's budget; log-prob -0.5 per token."""

    def answer(calls):
        actions = []
        for call in calls:
            ids = tokenizer.encode(reply(call.episode, tokenizer.decode(call.prompt_ids)), add_special_tokens=False)
            ids = [*ids, tokenizer.eos_token_id][:call.max_tokens]
            actions.append((ids, [-0.5] * len(ids)))
        return actions

    return answer


def tool_call(a: str, b: str) -> str:
    return '<tool_call>{"name": "calc_add", "arguments": {"a": ' + a + ', "b": ' + b + "}}</tool_call>"


@pytest.fixture(scope="module")
def addition(tokenizer_dir):
    spec = VerifiersSpec(ADDITION, {"count": 20}, max_turns=2, max_new_tokens=16)
    with VerifiersEpisodes(spec, tokenizer_dir) as episodes:
        yield episodes


@pytest.fixture(scope="module")
def calculator(tokenizer_dir):
    spec = VerifiersSpec(CALCULATOR, {"count": 20}, max_turns=3, max_new_tokens=96, tool_parser="hermes-text")
    with VerifiersEpisodes(spec, tokenizer_dir) as episodes:
        yield episodes


def test_a_single_turn_episode_is_the_template_prompt_and_the_engines_ids_rewarded_by_the_environment(
        addition, tokenizer):
    task = addition.task(3)
    answers = {0: task.data.answer, 1: "0", 2: f"so {task.data.answer}"}
    played = addition.play([3, 3, 3], scripted(tokenizer, lambda k, _: answers[k]))
    assert [e.reward for e in played] == [1.0, 0.0, 1.0]
    assert all(e.ended == "agent_completed" and not e.errors for e in played)
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": task.data.prompt}], tokenize=True,
                                             add_generation_prompt=True, return_dict=False)
    for k, episode in enumerate(played):
        assert episode.prompt_ids == list(rendered)
        assert episode.token_ids == [*tokenizer.encode(answers[k], add_special_tokens=False), tokenizer.eos_token_id]
        assert episode.segments == [len(episode.token_ids)] and all(episode.model_mask)
        assert episode.logprobs == [-0.5] * len(episode.token_ids)


def test_the_replay_recomputes_the_reward_and_ignores_the_workers(addition, tokenizer):
    task = addition.task(5)
    played = addition.play([5, 5], scripted(tokenizer, lambda k, _: task.data.answer if k == 0 else "1000"))
    claimed = [replace(played[0], reward=0.0), replace(played[1], reward=1.0)]  # a worker's lie both ways
    assert addition.replay(5, claimed) == [1.0, 0.0]


def test_a_tool_episode_keeps_the_sampled_ids_and_masks_the_tool_result(calculator, tokenizer):
    task = calculator.task(0)
    a, b = task.data.prompt.removeprefix("Compute ").removesuffix(".").split("+")
    call = tool_call(a, b)
    reply = scripted(tokenizer, lambda _, prompt: task.data.answer if "<|tool|>" in prompt else call)
    [episode] = calculator.play([0], reply)
    assert episode.reward == 1.0 and episode.ended == "agent_completed", episode
    first, between, last = (episode.token_ids[:episode.segments[0]],
                            episode.token_ids[episode.segments[0]:sum(episode.segments[:2])],
                            episode.token_ids[sum(episode.segments[:2]):])
    assert len(episode.segments) == 3
    assert first == [*tokenizer.encode(call, add_special_tokens=False), tokenizer.eos_token_id]  # as sampled
    assert tokenizer.decode(between) == f"<|end|>\n<|tool|>{task.data.answer}<|end|>\n<|assistant|>"
    assert last == [*tokenizer.encode(task.data.answer, add_special_tokens=False), tokenizer.eos_token_id]
    mask = episode.model_mask
    assert [m for m, t in zip(mask, episode.token_ids, strict=True) if m] == mask[:len(first)] + mask[-len(last):]
    assert sum(mask) == len(first) + len(last) and not any(mask[len(first):len(first) + len(between)])
    assert [lp for lp, m in zip(episode.logprobs, mask, strict=True) if not m] == [0.0] * len(between)
    assert calculator.replay(0, [episode]) == [1.0]


def test_re_rendering_the_conversation_would_not_give_the_sampled_ids(calculator, tokenizer):
    """The tiny template closes an assistant turn with <|end|>, the model with <eos>: a full
    re-render of turn 1 (what verifiers' client does with the template's own renderer) is not
    what was sampled, so echo2's renderer extends the sampled ids instead."""
    task = calculator.task(0)
    a, b = task.data.prompt.removeprefix("Compute ").removesuffix(".").split("+")
    call = tool_call(a, b)
    [episode] = calculator.play([0], scripted(tokenizer, lambda _, p: task.data.answer if "<|tool|>" in p else call))
    sampled = episode.prompt_ids + episode.token_ids[:episode.segments[0]]
    messages = [{"role": "system", "content": task.data.system_prompt}, {"role": "user", "content": task.data.prompt},
                {"role": "assistant", "content": call}, {"role": "tool", "content": task.data.answer}]
    re_rendered = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True, return_dict=False)
    assert list(re_rendered[:len(sampled)]) != sampled
    assert tokenizer.eos_token_id in sampled and tokenizer.eos_token_id not in re_rendered

    # verifiers' client with a renderer that cannot extend a turn re-renders it: refused, not trained
    spec = VerifiersSpec(CALCULATOR, {"count": 2}, max_turns=3, max_new_tokens=96, tool_parser="hermes-text",
                         renderer=f"{__name__}:ReRendering")
    with VerifiersEpisodes(spec, calculator.tokenizer_dir) as re_rendering:
        [refused] = re_rendering.play([0], scripted(tokenizer, lambda _, p: task.data.answer if "<|tool|>" in p
                                                    else call))
    assert refused.segments == episode.segments[:1] and "does not extend" in refused.errors[0]


class ReRendering(ExactRenderer):
    """echo2's renderer without its bridge: verifiers' client then re-renders every turn."""

    def bridge_to_next_turn(self, *args, **kwargs):
        return None


def test_a_tool_result_the_environment_did_not_give_is_refused_by_the_replay(calculator, tokenizer):
    task = calculator.task(1)
    a, b = task.data.prompt.removeprefix("Compute ").removesuffix(".").split("+")
    call = tool_call(a, b)
    [episode] = calculator.play([1], scripted(tokenizer, lambda _, p: task.data.answer if "<|tool|>" in p else call))
    start = episode.segments[0]
    forged = tokenizer.encode(str(int(task.data.answer) + 1), add_special_tokens=False)
    between = tokenizer.encode(tokenizer.decode(episode.token_ids[start:start + episode.segments[1]]).replace(
        task.data.answer, tokenizer.decode(forged)), add_special_tokens=False)
    altered = replace(episode, token_ids=episode.token_ids[:start] + between + episode.token_ids[start + len(between):],
                      segments=[episode.segments[0], len(between), episode.segments[2]])
    with pytest.raises(ReplayMismatch, match="did not give"):
        calculator.replay(1, [altered])
    cut = replace(episode, token_ids=episode.token_ids[:start], logprobs=episode.logprobs[:start],
                  segments=episode.segments[:1])
    with pytest.raises(ReplayMismatch, match="turn 2, but the transcript ends after 1"):
        calculator.replay(1, [cut])


def test_the_episode_token_budget_ends_an_episode_and_cuts_its_completion(calculator, tokenizer):
    [episode] = calculator.play([0], scripted(tokenizer, lambda _, p: "x" * 80), max_episode_tokens=40)
    assert episode.segments == [40] and episode.reward == 0.0


def test_bad_environments_are_one_line_naming_the_field():
    with pytest.raises(EnvironmentLoadError, match="task.environment = 'no_such_env_module': cannot import"):
        load_tasks("no_such_env_module", {})
    with pytest.raises(EnvironmentLoadError, match="exactly one Taskset subclass in its __all__"):
        load_tasks("json", {})
    with pytest.raises(EnvironmentLoadError, match="task.args.digits: Input should be a valid integer"):
        load_tasks(ADDITION, {"digits": "many"})
    with pytest.raises(EnvironmentLoadError, match="has no tasks"):
        load_tasks(ADDITION, {"count": 0})
    with pytest.raises(EnvironmentLoadError, match="task.tool_parser = 'nonesuch' is not a tool parser"):
        renderer_config("default", "nonesuch")
    with pytest.raises(EnvironmentLoadError, match="does not match any of the expected tags"):
        renderer_config("nope", None)


def test_a_second_turn_server_in_the_process_plays_concurrent_episodes(tokenizer_dir, tokenizer):
    """renderers' module-wide lock, waited on by one turn server's loop, used to fail the next
    server's concurrent first calls (the learner's second evaluation played them unanswered)."""
    spec = VerifiersSpec(ADDITION, {"count": 20}, max_turns=1, max_new_tokens=16)
    threads = []
    for _ in range(3):
        with VerifiersEpisodes(spec, tokenizer_dir) as episodes:
            answer = episodes.task(4).data.answer
            played = episodes.play([4, 4, 4, 4], scripted(tokenizer, lambda _k, _p, said=answer: said))
            assert [e.reward for e in played] == [1.0] * 4 and not any(e.errors for e in played)
        threads.append(threading.active_count())
    assert threads[2] == threads[1]  # each server's threads end with it (an evaluation makes one each time)


def test_episodes_share_one_interception_server_and_make_no_tls_context_each(tokenizer_dir, tokenizer, monkeypatch):
    """verifiers starts an interception server (an HTTP server with its own model client) for an
    episode unless its agent is given one, and httpx loads certifi's bundle for every client it
    builds: tens of milliseconds an episode each, beside a sub-second generation."""
    import ssl

    from verifiers.v1.interception import InterceptionServer

    started, bundles = [], []
    enter, load = InterceptionServer.__aenter__, ssl.SSLContext.load_verify_locations

    async def counted_enter(self):
        started.append(self)
        return await enter(self)

    def counted_load(self, *args, **kwargs):
        bundles.append(args)
        return load(self, *args, **kwargs)

    monkeypatch.setattr(InterceptionServer, "__aenter__", counted_enter)
    monkeypatch.setattr(ssl.SSLContext, "load_verify_locations", counted_load)
    spec = VerifiersSpec(ADDITION, {"count": 20}, max_turns=1, max_new_tokens=16)
    with VerifiersEpisodes(spec, tokenizer_dir) as episodes:
        answer = episodes.task(2).data.answer
        for _ in range(3):
            played = episodes.play([2, 2, 2], scripted(tokenizer, lambda _k, _p, said=answer: said))
            assert [e.reward for e in played] == [1.0] * 3 and not any(e.errors for e in played)
    assert len(started) == 1  # the one the episodes share, not one for each of the nine
    assert len(bundles) <= 2  # the shared client's and, if no test before made it, the agent loop's

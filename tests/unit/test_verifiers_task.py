"""`[task] name = "verifiers"`: the config must say how far episodes can be checked, the held-out
tasks are never trained on, the training order is the run seed's, and a taskset too small to
hold out `eval_size` tasks is one line before any process starts."""

from __future__ import annotations

import threading
import time

import pytest

pytest.importorskip("verifiers.v1")

from echo2.config.run import load_run_config  # noqa: E402
from echo2.envs.verifiers_env import EnvironmentLoadError  # noqa: E402
from echo2.tasks import make_task  # noqa: E402

ADDITION = "task.environment=echo2.envs.verifiers_examples.addition"


def _task(*overrides: str, seed: int = 0):
    return make_task(load_run_config(None, ["task.name=verifiers", ADDITION, *overrides]).task, seed=seed)


def test_the_trust_level_must_be_said():
    with pytest.raises(ValueError, match="task.trust: Field required"):
        load_run_config(None, ["task.name=verifiers", ADDITION])
    with pytest.raises(ValueError, match="task.trust: Input should be 'replayable' or 'worker-trusted'"):
        load_run_config(None, ["task.name=verifiers", ADDITION, "task.trust=trusted"])
    assert load_run_config(None, ["task.name=verifiers", ADDITION, "task.trust=worker-trusted"]).task.trust == \
        "worker-trusted"


def test_held_out_tasks_are_never_trained_and_the_order_is_the_seeds():
    task = _task("task.trust=replayable", "task.eval_size=10", "task.args={count = 50}")
    task.check()
    assert task.eval_indices() == list(range(10))
    trained = [task.train_index(i) for i in range(40)]
    assert sorted(trained) == list(range(10, 50))  # each training task once per pass, none held out
    assert [task.train_index(i) for i in range(40, 80)] == trained  # the stream wraps around
    assert trained == [_task("task.trust=replayable", "task.eval_size=10", "task.args={count = 50}").train_index(i)
                       for i in range(40)]
    other = _task("task.trust=replayable", "task.eval_size=10", "task.args={count = 50}", seed=1)
    assert [other.train_index(i) for i in range(40)] != trained


def test_a_taskset_with_nothing_left_to_train_on_is_refused_before_the_run():
    task = _task("task.trust=replayable", "task.eval_size=50", "task.args={count = 50}")
    with pytest.raises(EnvironmentLoadError, match="50 tasks and task.eval_size = 50 are held out"):
        task.check()
    with pytest.raises(EnvironmentLoadError, match="task.tool_parser = 'nope'"):
        _task("task.trust=replayable", "task.tool_parser=nope").check()


def test_the_coordinator_makes_lease_prompts_ahead_on_a_thread_not_on_its_event_loop(tiny_model_dir):
    from echo2.coordinator.scoring.agent_replay import PROMPTS_AHEAD, AgentScorer

    task = _task("task.trust=replayable", "task.eval_size=4", "task.args={count = 200}")
    scorer = AgentScorer(task, str(tiny_model_dir), 16)
    episodes = scorer.episodes
    assert episodes.known_first_prompt(task.train_index(1)) is None  # only the first is made at start
    first = scorer.prompt_ids(0)  # a lease asks: the next PROMPTS_AHEAD are made on a thread
    assert scorer._rendering is not None and scorer._rendering.daemon
    deadline = time.monotonic() + 60
    while episodes.known_first_prompt(task.train_index(PROMPTS_AHEAD)) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    made = [episodes.known_first_prompt(task.train_index(i)) for i in range(1, PROMPTS_AHEAD + 1)]
    assert all(prompt is not None for prompt in made)
    assert episodes.known_first_prompt(task.train_index(PROMPTS_AHEAD + 1)) is None  # no further than asked

    played_on = []  # a lease for a made prompt plays nothing where it is asked
    episodes.play = lambda *args, **kwargs: played_on.append(threading.current_thread().name)
    assert scorer.prompt_ids(5) == made[4] and scorer.prompt_ids(0) == first
    assert threading.current_thread().name not in played_on
    assert made[4] != first  # each prompt is its own task's


def test_agent_evaluation_plays_in_waves_of_one_generation_batch():
    """Played all at once, every episode's turn waited for every other's generation and that wait
    counted against the episode's deadline."""
    from contextlib import contextmanager

    import torch

    from echo2.envs.verifiers_play import PlayedEpisode
    from echo2.models.agent_evaluation import evaluate_agent

    waves = []

    class Episodes:
        def play(self, indices, answer):
            waves.append(list(indices))
            return [PlayedEpisode(segments=[3], token_ids=[1, 2, 3], reward=float(i % 2)) for i in indices]

    class Task:
        def eval_indices(self):
            return list(range(7))

        @contextmanager
        def episodes(self, tokenizer_source, max_new_tokens):
            yield Episodes()

    class Tokenizer:
        pad_token_id, eos_token_id = 0, 1

    report = evaluate_agent(torch.nn.Linear(1, 1), Tokenizer(), Task(), 8, tokenizer_source="unused", batch_size=3)
    assert waves == [[0, 1, 2], [3, 4, 5], [6]]
    assert report["episodes"] == 7 and report["accuracy"] == 3 / 7 and report["failed"] == 0

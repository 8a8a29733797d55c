"""`[task] name = "verifiers"`: the config must say how far episodes can be checked, the held-out
tasks are never trained on, the training order is the run seed's, and a taskset too small to
hold out `eval_size` tasks is one line before any process starts."""

from __future__ import annotations

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
    with pytest.raises(ValueError, match="task.trust: Input should be 'replayable'"):
        load_run_config(None, ["task.name=verifiers", ADDITION, "task.trust=worker-trusted"])


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

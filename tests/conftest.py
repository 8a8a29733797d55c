"""Shared fixtures: a tiny model + character tokenizer saved with save_pretrained (built once per
session, in code, no downloads) and small run configs."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from echo2.config.run import ModelConfig, RunConfig

TINY_MODEL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)

# One warm-start cache for the session: runs with the same model/task/warm-start settings
# prepare once, as a user's second run does (prepare's own cache logic is what is exercised).
# An environment variable, not a module global: test modules import this file as
# `tests.conftest`, a second module object next to the one pytest loaded.
_CACHE_ENV = "ECHO2_TEST_WARMSTART_CACHE"


@pytest.fixture(scope="session", autouse=True)
def shared_warmstart_cache(tmp_path_factory):
    path = tmp_path_factory.mktemp("warmstart_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(_CACHE_ENV, str(path))
        yield path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """An untrained tiny Qwen3 model and its tokenizer, as a user's checkpoint directory."""
    from echo2.models.tiny import save_tiny

    out = tmp_path_factory.mktemp("tiny_model")
    save_tiny(TINY_MODEL, out, seed=0)
    return out


def small_run_config(run_dir: Path, **sections) -> RunConfig:
    """A run that prepares in seconds: tiny model, a short warm start, few steps, no TensorBoard
    files or plots."""
    data = {
        "run_dir": str(run_dir),
        "cache_dir": os.environ.get(_CACHE_ENV) or str(run_dir.parent / "cache"),
        "model": TINY_MODEL.model_dump(),
        # 1-digit addition after 200 warm-start steps: right about a third of the time, so
        # groups carry reward variance and every step really changes the weights
        "warmstart": {"steps": 200, "batch_size": 32, "lr": 1e-2},
        "task": {"digits": 1, "eval_size": 50},
        "sampling": {"max_new_tokens": 4, "group_size": 4},
        "grpo": {"prompts_per_step": 4},
        # batch_wait_s: the learner's long poll for a batch. A run stopped by the test (SIGTERM to
        # `echo2 run`) otherwise leaves the coordinator answering a gone learner's 20 s poll
        # past the launcher's 10 s grace: killed, without its final record, 12 s per stop
        "train": {"steps": 6, "checkpoint_every": 3, "eval_every": 3, "batch_wait_s": 2.0},
        "coordinator": {"auth_token": "test-token-0123456789"},
        "workers": {"count": 2},
        # the launcher's TensorBoard sink imports torch before it starts the coordinator, and
        # the end-of-run plots import matplotlib after the learner is done: about 12 s of every
        # `echo2 run` on a loaded 2-core box. Off here; test_run's staleness test, which asserts
        # both, turns them on
        "report": {"tensorboard": False, "plots": False},
    }
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if isinstance(value, dict) else value
    return RunConfig.model_validate(data)

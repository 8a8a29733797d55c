"""Shared fixtures: a tiny model + character tokenizer saved with save_pretrained (built once per
session, in code, no downloads) and small run configs; and, under pytest-xdist, the lock that
lets a test marked `exclusive` run alone."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
import tempfile
from contextlib import ExitStack, contextmanager
from pathlib import Path

import pytest

from echo2.config.run import ModelConfig, RunConfig

TINY_MODEL = ModelConfig(hidden_size=32, num_layers=1, num_heads=2, intermediate_size=64)

# One warm-start cache for the session: runs with the same model/task/warm-start settings
# prepare once, as a user's second run does (prepare's own cache logic is what is exercised).
# An environment variable, not a module global: test modules import this file as
# `tests.conftest`, a second module object next to the one pytest loaded. Under pytest-xdist
# the workers of one session share it (see prepare_into_cache).
_CACHE_ENV = "ECHO2_TEST_WARMSTART_CACHE"


@pytest.fixture(scope="session", autouse=True)
def shared_warmstart_cache(tmp_path_factory):
    if os.environ.get("PYTEST_XDIST_WORKER"):
        path = tmp_path_factory.getbasetemp().parent / "warmstart_cache"  # the session's, not the worker's
        path.mkdir(exist_ok=True)
    else:
        path = tmp_path_factory.mktemp("warmstart_cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(_CACHE_ENV, str(path))
        yield path


@contextmanager
def _flock(path: Path, mode: int):
    with open(path, "a") as handle:
        fcntl.flock(handle, mode)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def prepare_into_cache(config: Path, cfg: RunConfig) -> None:
    """Make sure the session's warm-start cache holds the base model of `cfg` (its TOML at
    `config`): if not, `echo2 prepare` builds it in a scratch run dir, under a lock. The runs
    then only copy it from the cache: two runs preparing one key at once (two xdist workers, or
    runs side by side) would both write its cache entry, and one of them would fail."""
    cache = os.environ.get(_CACHE_ENV)
    if not cache or Path(cfg.cache_dir) != Path(cache):
        return
    from echo2.models.prepare import cache_path, prepared_info

    with _flock(Path(cache) / "prepare.lock", fcntl.LOCK_EX):
        if prepared_info(cfg, cache_path(cfg)) is not None:
            return
        scratch = tempfile.mkdtemp(prefix=".prepare-", dir=cache)
        try:
            done = subprocess.run([sys.executable, "-m", "echo2", "prepare", "--config", str(config),
                                   "--set", f"run_dir={scratch}"], capture_output=True, text=True, timeout=600)
            assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        finally:
            shutil.rmtree(scratch, ignore_errors=True)


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
        # dynamic sampling off: a fifth of these groups score alike and would be generated again
        # (a fifth more generation in every run); its unit tests and the lying-worker run (on) cover it
        "grpo": {"prompts_per_step": 4, "drop_uninformative_groups": False},
        # batch_wait_s: the learner's long poll for a batch. A run stopped by the test (SIGTERM to
        # `echo2 run`) otherwise leaves the coordinator answering a gone learner's 20 s poll
        # past the launcher's 10 s grace: killed, without its final record, 12 s per stop
        "train": {"steps": 6, "checkpoint_every": 3, "eval_every": 3, "batch_wait_s": 2.0},
        # one scoring process: a tiny task's rewards take microseconds, and each process is a
        # Python start-up on a 2-core box
        "coordinator": {"auth_token": "test-token-0123456789", "scoring": {"processes": 1}},
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


# ---- pytest-xdist: `make test` runs the suite on 2 workers (-n 2) ----
# A test marked `exclusive` runs alone on the machine: every test holds a shared flock on a file
# all workers of the session see, an exclusive test holds it exclusively. A turnstile lock in
# front keeps a waiting exclusive test from being starved by the other worker's shared ones.
# Without xdist (pytest run serially) nothing is locked.


def pytest_collection_modifyitems(config, items):
    """Tests that start real processes (marker `integration`) first, in their files' order: under
    xdist's loadfile scheduling the long files then run while the many short unit files fill the
    gaps, instead of one long file finishing alone at the end."""
    items.sort(key=lambda item: 0 if item.get_closest_marker("integration") else 1)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    if not os.environ.get("PYTEST_XDIST_WORKER"):
        return (yield)
    root = item.config._tmp_path_factory.getbasetemp().parent  # shared by the session's workers
    exclusive = item.get_closest_marker("exclusive") is not None
    with ExitStack() as held:
        with _flock(root / "turnstile.lock", fcntl.LOCK_EX):
            held.enter_context(_flock(root / "machine.lock", fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH))
        return (yield)

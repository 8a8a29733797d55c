"""`echo2 run` on an OpenEnv environment (task name "openenv") with the tiny model and real
processes: the shipped guess-the-number environment in-process, and behind OpenEnv's own server
(one on this machine, as a user runs one beside the coordinator and each worker). Every episode a
worker played is replayed at the coordinator (its reward the environment's, from the replay),
every trained token is accounted for, and the learner evaluates held-out episodes by playing them."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import processes, records, write_config
from tests.reliability.accounting import accounting
from tests.sshd import free_port

from echo2.config.run import RunConfig

pytest.importorskip("openenv.core.env_server")
# whole runs of every process: the system tier (make test-system), as the verifiers environments';
# tests/unit/test_openenv.py covers the episodes, the replay and the server in make test
pytestmark = [pytest.mark.integration, pytest.mark.system]

ROOT = Path(__file__).resolve().parents[2]
TASK = {"name": "openenv", "trust": "replayable", "args": {"high": 8, "max_guesses": 4}, "eval_size": 8,
        "demo_actions": [str(n) for n in range(1, 9)], "max_turns": 4, "max_episode_tokens": 120,
        "chat_template": False, "instruction": ""}


@pytest.mark.parametrize("where", ["in-process", "server"])
def test_the_openenv_guess_environment_trains_through_echo2_run(tmp_path, where):
    source = {"environment": "echo2.envs.openenv_examples.guess:GuessEnvironment"}
    server = None
    if where == "server":
        port = free_port()
        serve = ["-m", "echo2.envs.openenv_examples.serve", "--port", str(port), "--high", "8", "--max-guesses", "4"]
        server = subprocess.Popen([sys.executable, *serve], env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        source = {"environment": "", "url": f"http://127.0.0.1:{port}"}
    try:
        if server is not None:
            wait_for_port(port, server)
        run_and_check(tmp_path, {**TASK, **source})
    finally:
        if server is not None:
            server.terminate()
            server.wait(timeout=10)


def wait_for_port(port: int, server: subprocess.Popen) -> None:
    import socket

    deadline = time.monotonic() + 60
    while True:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "the OpenEnv server did not start"
            time.sleep(0.3)


def run_and_check(tmp_path: Path, task: dict) -> None:
    small = small_run_config(tmp_path / "run", warmstart={"steps": 40, "batch_size": 16, "lr": 3e-3},
                             workers={"count": 1}, sampling={"max_new_tokens": 3, "group_size": 4},
                             train={"steps": 3, "checkpoint_every": 2, "eval_every": 3})
    cfg = RunConfig.model_validate({**small.model_dump(), "task": task})
    config = write_config(tmp_path / "openenv.toml", cfg)
    with processes() as start:
        proc = start(["run", "--config", str(config)], tmp_path / "run.log")
        assert proc.wait(timeout=300) == 0, (tmp_path / "run.log").read_text()[-3000:]
    run_dir = cfg.run_path
    assert [r["step"] for r in records(run_dir, "train_step")] == [0, 1, 2]
    replayed = records(run_dir, "episodes_replayed")
    assert replayed and sum(r["episodes"] for r in replayed) >= 3 * cfg.grpo.prompts_per_step * cfg.sampling.group_size
    assert not records(run_dir, "replay_refused")
    books = accounting(run_dir, max_staleness=cfg.train.max_staleness)
    assert books["rollouts_lost"] == 0 and books["duplicates"] == 0, books
    evals = records(run_dir, "eval")
    assert evals and all(0.0 <= r["accuracy"] <= 1.0 for r in evals)
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["accuracy_after"] is not None

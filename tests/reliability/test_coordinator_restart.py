"""The coordinator SIGKILLed mid-run and started again on the same run dir: accepted rollouts,
assigned batches and the prompt cursor survive, leased prompts go back to the queue, workers
join again by themselves, the learner rides it out, and the run completes with nothing lost,
nothing trained twice and staleness within S."""

from __future__ import annotations

import signal
import socket

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import last_step, processes, records, wait_for, write_config
from tests.reliability.accounting import accounting, assert_sound

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a minute-long run (docs/development.md)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_killed_coordinator_restarts_and_the_run_completes(tmp_path):
    steps = 20
    cfg = small_run_config(tmp_path / "crestart", train={"steps": steps, "checkpoint_every": 5, "max_staleness": 1},
                           coordinator={"port": _free_port(), "heartbeat_interval_s": 0.3, "worker_timeout_s": 2.0})
    config = write_config(tmp_path / "crestart.toml", cfg)
    run_dir, metrics = str(cfg.run_path), str(cfg.run_path / "metrics.jsonl")
    url = f"http://127.0.0.1:{cfg.coordinator.port}"
    with processes() as start:
        assert start(["prepare", "--config", str(config)], tmp_path / "prepare.log").wait(timeout=180) == 0
        coordinator = start(["coordinator", "--run-dir", run_dir], tmp_path / "coordinator1.log")
        for i in range(2):
            start(["worker", "--coordinator", url, "--metrics", metrics, "--set", f"worker_id=w{i}"],
                  tmp_path / f"w{i}.log")
        learner = start(["learner", "--run-dir", run_dir], tmp_path / "learner.log")
        wait_for(lambda: last_step(cfg.run_path) >= 6, 180, "learner step 6", alive=learner)
        coordinator.send_signal(signal.SIGKILL)
        coordinator.wait(timeout=10)
        killed_at = records(cfg.run_path)[-1]["time"]
        start(["coordinator", "--run-dir", run_dir], tmp_path / "coordinator2.log")
        assert learner.wait(timeout=300) == 0, (tmp_path / "learner.log").read_text()[-3000:]

    assert_sound(accounting(cfg.run_path, max_staleness=1), steps)
    rejoined = [r for r in records(cfg.run_path, "worker_registered") if r["time"] > killed_at]
    assert {r["worker_id"] for r in rejoined} == {"w0", "w1"}  # both joined the new coordinator
    assert any(r["step"] > 6 for r in records(cfg.run_path, "train_step") if r["time"] > killed_at)

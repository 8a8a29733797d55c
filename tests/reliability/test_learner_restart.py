"""Killing the learner and starting it again on the same run dir resumes from its checkpoint:
the replayed steps republish bit-identical versions (same batches from the coordinator, same
optimizer and RNG state), and the run completes with every step trained once."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import coordinator_url, last_step, processes, records, wait_for, write_config
from tests.reliability.accounting import accounting, assert_sound

pytestmark = [pytest.mark.integration, pytest.mark.system]  # a minute-long run (docs/development.md)


def _digests(run_dir: Path, before: float | None = None, after: float | None = None) -> dict[int, str]:
    out = {}
    for r in records(run_dir, "version_published"):
        if r["role"] == "learner" and (before is None or r["time"] < before) and (after is None or r["time"] > after):
            out[r["version"]] = r["manifest_digest"]
    return out


def test_learner_resumes_from_checkpoint(tmp_path):
    cfg = small_run_config(tmp_path / "restart", train={"steps": 20, "checkpoint_every": 5, "max_staleness": 1})
    config = write_config(tmp_path / "restart.toml", cfg)
    run_dir, metrics = str(cfg.run_path), str(cfg.run_path / "metrics.jsonl")
    logs = tmp_path
    with processes() as start:
        assert start(["prepare", "--config", str(config)], logs / "prepare.log").wait(timeout=120) == 0
        coordinator = start(["coordinator", "--run-dir", run_dir], logs / "coordinator.log")
        url = wait_for(lambda: coordinator_url(cfg.run_path), 60, "coordinator address", alive=coordinator)
        for i in range(2):
            start(["worker", "--coordinator", url, "--metrics", metrics, "--set", f"worker_id=w{i}"],
                  logs / f"w{i}.log")
        learner = start(["learner", "--run-dir", run_dir], logs / "learner1.log")
        wait_for(lambda: last_step(cfg.run_path) >= 8, 180, "learner step 8", alive=learner)
        learner.send_signal(signal.SIGKILL)
        learner.wait(timeout=10)
        killed_at = records(cfg.run_path)[-1]["time"]
        before = _digests(cfg.run_path, before=killed_at)
        again = start(["learner", "--run-dir", run_dir], logs / "learner2.log")
        assert again.wait(timeout=240) == 0, (logs / "learner2.log").read_text()[-3000:]

    resumed = records(cfg.run_path, "learner_resumed")
    assert len(resumed) == 1
    step = resumed[0]["step"]
    assert step >= 5 and step % 5 == 0
    after = _digests(cfg.run_path, after=killed_at)
    replayed = sorted(set(before) & set(after))
    assert replayed and replayed[0] == step  # it republished from the checkpoint's version on
    assert all(before[v] == after[v] for v in replayed), "a replayed version differs"
    assert len(set(after.values())) == len(after)  # every step really changed the weights
    trained = {r["step"]: r for r in records(cfg.run_path, "train_step")}
    assert sorted(trained) == list(range(20))
    prompts = [p for r in trained.values() for p in r["prompt_indices"]]
    assert len(prompts) == len(set(prompts))
    assert_sound(accounting(cfg.run_path, max_staleness=1), 20)

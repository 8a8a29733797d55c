"""`echo2 run` with the learner sharded over 2 ranks (learner.ranks = 2: torchrun, FSDP2, gloo)
trains every step, publishes every version, writes sharded checkpoints and ends in the accuracy
band of the same run with a 1-rank learner.

The band: both runs start from the same base and are evaluated greedily on the same 50 held-out
problems; what differs is the order rollouts arrive in (asynchronous workers), so the two runs
train on different batches. A 6-step run moves accuracy by a few points at most (0.48 -> 0.44 and
0.46 measured here), so 0.15 (about two standard errors of a 50-problem estimate) tells a learner
that trains like the plain one from one that breaks the model (which falls toward 0)."""

from __future__ import annotations

import json

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import processes, records, write_config

pytestmark = [pytest.mark.integration, pytest.mark.system]  # three learner processes and four workers
BAND = 0.15


def _start(start, tmp_path, ranks: int):
    cfg = small_run_config(tmp_path / f"ranks{ranks}", learner={"ranks": ranks})
    config = write_config(tmp_path / f"ranks{ranks}.toml", cfg)
    return cfg, start(["run", "--config", str(config)], tmp_path / f"ranks{ranks}.log")


def _finished(tmp_path, ranks: int, cfg, proc) -> dict:
    assert proc.wait(timeout=240) == 0, (tmp_path / f"ranks{ranks}.log").read_text()[-3000:]
    assert [r["step"] for r in records(cfg.run_path, "train_step")] == list(range(cfg.train.steps))
    published = [r["version"] for r in records(cfg.run_path, "version_published") if r["role"] == "learner"]
    assert published == list(range(cfg.train.steps + 1))
    summary = json.loads((cfg.run_path / "summary.json").read_text())
    return {"cfg": cfg, "summary": summary}


def test_two_rank_learner_run_lands_in_the_one_rank_band(tmp_path):
    with processes() as start:  # side by side: they share only the warm-start cache (write_config fills it)
        started = {ranks: _start(start, tmp_path, ranks) for ranks in (1, 2)}
        one, two = (_finished(tmp_path, ranks, *started[ranks]) for ranks in (1, 2))
    cfg = two["cfg"]
    learner_log = (cfg.run_path / "logs" / "learner.log").read_text()
    assert "sharded over 2 ranks" in learner_log
    for step in (3, 6):  # checkpoint_every 3: written by both ranks, sharded
        meta = json.loads((cfg.run_path / "checkpoints" / f"step_{step:07d}" / "meta.json").read_text())
        assert meta == {**meta, "step": step, "format": "dcp", "ranks": 2}
    before = [run["summary"]["accuracy_before"] for run in (one, two)]
    after = [run["summary"]["accuracy_after"] for run in (one, two)]
    assert before[0] == before[1]  # the same base model, evaluated the same way on 1 and 2 ranks
    assert abs(after[1] - after[0]) <= BAND, (before, after)
    assert after[1] >= before[1] - BAND, (before, after)

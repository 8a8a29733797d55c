"""The verifiers environments on SmolLM2-135M-Instruct (a real BPE tokenizer and ChatML
template): short `echo2 run`s of the shipped addition and calculator environments. Every episode
a worker played replays at the coordinator token for token, every audited group passes the
rollout audit (the engine's ids, its log-probs, the seeded sampler's tokens, in multi-turn
episodes too), and the learner evaluates by playing the held-out tasks."""

from __future__ import annotations

import json

import pytest
from tests.integration.runs import processes, records, write_config

from echo2.config.run import load_run_config

pytest.importorskip("verifiers.v1")
pytestmark = pytest.mark.real_model
CONFIGS = {"addition": "configs/verifiers_addition.toml", "calculator": "configs/verifiers_calculator.toml"}


# the calculator's multi-turn episodes take about 5 minutes on 2 CPU cores, every group of the
# new workers checked by the audit: the run's own wait (600 s) bounds it, not pytest's 300 s
@pytest.mark.timeout(660)
@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_a_verifiers_environment_trains_smollm2(tmp_path, smollm2, name):
    cfg = load_run_config(CONFIGS[name], [f"run_dir={tmp_path / name}", "train.steps=4",
                                          "train.eval_every=4", "train.checkpoint_every=4", "task.eval_size=16",
                                          "grpo.prompts_per_step=4", "sampling.group_size=4",
                                          "report.plots=false", "report.tensorboard=false"])
    config = write_config(tmp_path / f"{name}.toml", cfg)
    with processes() as start:
        proc = start(["run", "--config", str(config)], tmp_path / f"{name}.log")
        assert proc.wait(timeout=600) == 0, (tmp_path / f"{name}.log").read_text()[-3000:]
    run = cfg.run_path
    assert [r["step"] for r in records(run, "train_step")] == [0, 1, 2, 3]
    assert not records(run, "replay_refused") and not records(run, "worker_quarantined")
    audits = records(run, "audit")
    assert sum(a["groups_audited"] for a in audits) > 0 and sum(a["groups_failed"] for a in audits) == 0
    evals = records(run, "eval")
    assert {r["step"] for r in evals} == {0, 4} and all(r["problems"] == 16 for r in evals)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["steps"] == 4

"""`echo2 run` on verifiers environments (task name "verifiers") with the tiny model and real
processes: the shipped single-turn addition environment here, the calculator tool environment in
test_verifiers_tool_run.py (a file each, so the two runs go to different test processes). Every
group a worker played is replayed at the coordinator (its reward the environment's, from the
replay), every trained token is accounted for, and the learner evaluates the held-out tasks by
playing them."""

from __future__ import annotations

import json

import pytest
from tests.conftest import small_run_config
from tests.integration.runs import processes, records, write_config
from tests.reliability.accounting import accounting

from echo2.config.run import RunConfig

pytest.importorskip("verifiers.v1")
# a whole run of every process (55 s beside the rest of make test): the system tier (make
# test-system), as the calculator's; tests/unit/test_verifiers_*.py cover the environment's
# episodes, replay and evaluation in make test
pytestmark = [pytest.mark.integration, pytest.mark.system]

ENVIRONMENTS = {
    "addition": {"environment": "echo2.envs.verifiers_examples.addition", "args": {"digits": 1, "count": 60},
                 "max_turns": 1, "max_episode_tokens": 8},
    "calculator": {"environment": "echo2.envs.verifiers_examples.calculator", "args": {"digits": 2, "count": 60},
                   "max_turns": 3, "max_episode_tokens": 160, "tool_parser": "hermes-text"},
}


def test_the_verifiers_addition_environment_trains_through_echo2_run(tmp_path):
    run_and_check(tmp_path, "addition")


def run_and_check(tmp_path, name: str, trust: str = "replayable") -> dict:
    small = small_run_config(tmp_path / name, warmstart={"steps": 0}, workers={"count": 1},
                             sampling={"max_new_tokens": 6 if name == "addition" else 48, "group_size": 4},
                             train={"steps": 3, "checkpoint_every": 2, "eval_every": 3})
    cfg = RunConfig.model_validate({**small.model_dump(), "task": {"name": "verifiers", "trust": trust,
                                                                    "eval_size": 4, **ENVIRONMENTS[name]}})
    config = write_config(tmp_path / f"{name}.toml", cfg)
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
    assert evals and all(r["problems"] == 4 and 0.0 <= r["accuracy"] <= 1.0 for r in evals)
    assert len(evals) >= 2 and all(r["episodes_failed"] == 0 for r in evals)  # each evaluation's own turn server
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["steps"] == 3 and summary["accuracy_after"] is not None
    return summary

"""`echo2 eval` runs the learner's own evaluation: on a run's checkpoint it reproduces the
accuracy the learner logged for the same weights, and with n samples it reports pass@k that
is consistent (pass@1 <= pass@k <= pass@n)."""

from __future__ import annotations

import json

from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config

from echo2.cli import main
from echo2.config.run_dir import write_resolved
from echo2.learner.train import Learner
from echo2.models.loading import load_tokenizer
from echo2.report.metrics import read_metrics


def _run_with_checkpoints(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir, task={"eval_size": 30}, train={"eval_every": 2},
                         evaluation={"where": "learner"})
    write_resolved(cfg)
    Learner(cfg, "", learner_token="", io=FakeIO([addition_batch(tokenizer, s) for s in (1, 2)])).train()
    return cfg


def test_eval_of_a_checkpoint_reproduces_the_learners_accuracy(tmp_path, tiny_model_dir, capsys):
    cfg = _run_with_checkpoints(tmp_path, tiny_model_dir)
    logged = {r["step"]: r for r in read_metrics(cfg.run_path / "metrics.jsonl") if r["kind"] == "eval"}
    assert main(["eval", "--checkpoint", str(cfg.run_path / "checkpoints" / "step_0000002"), "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["problems"] == 30 == logged[2]["problems"]
    assert result["pass_at_k"]["1"] == logged[2]["accuracy"]


def test_eval_with_samples_reports_pass_at_k(tmp_path, tiny_model_dir, capsys):
    assert main(["eval", "--checkpoint", str(tiny_model_dir), "--task", "addition", "--set", "task.digits=1",
                 "--set", "task.eval_size=12", "--set", "sampling.max_new_tokens=3", "--n", "6", "--k", "2",
                 "--temperature", "1.5"]) == 0
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert "pass@6" in out.err  # the table
    passk = {int(k): v for k, v in result["pass_at_k"].items()}
    assert sorted(passk) == [1, 2, 6] and result["samples_per_problem"] == 6 and result["temperature"] == 1.5
    assert passk[1] <= passk[2] <= passk[6]
    assert main(["eval", "--checkpoint", str(tiny_model_dir), "--task", "addition", "--n", "2", "--k", "3"]) == 2
    assert "each k must be between 1 and --n 2" in capsys.readouterr().err
    assert main(["eval", "--checkpoint", str(tiny_model_dir)]) == 2
    assert "say which task" in capsys.readouterr().err

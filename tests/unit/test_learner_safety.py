"""A learner fed garbage stays sane: fabricated behaviour log-probs leave the model finite (their
tokens are left out and counted), a step with a non-finite gradient is skipped with the
optimizer untouched and its batch handed back, and no NaN model is ever published or saved."""

from __future__ import annotations

import math

import pytest
import torch
from tests.unit.learner_fakes import FakeIO, addition_batch, learner_config

from echo2.learner.checkpoint import latest_checkpoint, save_checkpoint
from echo2.learner.train import Learner
from echo2.models.loading import load_tokenizer
from echo2.models.weights import NonFiniteError
from echo2.report.metrics import read_metrics
from echo2.report.summary import summarize


def _records(cfg, kind):
    return [r for r in read_metrics(cfg.run_path / "metrics.jsonl") if r["kind"] == kind]


def test_fabricated_behaviour_logprobs_leave_the_model_finite(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    batches = [addition_batch(tokenizer, 1, behaviour=-100.0), addition_batch(tokenizer, 2, behaviour=-1e4)]
    cfg = learner_config(tmp_path / "run", tiny_model_dir)
    io = FakeIO(batches)
    learner = Learner(cfg, "", learner_token="", io=io)
    learner.train()
    assert all(torch.isfinite(p).all() for p in learner.model.parameters())
    assert [v for v, _ in io.published] == [0, 1, 2] and io.rejected == []
    steps = _records(cfg, "train_step")
    assert [s["log_ratio_outliers"] for s in steps] == [2, 2]  # one token per group, left out
    assert all(math.isfinite(s["loss"]) and math.isfinite(s["grad_norm"]) for s in steps)
    summary = summarize(read_metrics(cfg.run_path / "metrics.jsonl"))
    assert summary["log_ratio_outlier_tokens"] == 4 and summary["steps_skipped"] == 0


def test_nan_gradient_skips_the_step_publishes_and_saves_nothing(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    good = [addition_batch(tokenizer, seed) for seed in (1, 2)]
    poisoned = addition_batch(tokenizer, 9)

    cfg = learner_config(tmp_path / "run", tiny_model_dir)
    io = FakeIO([poisoned, *good])
    learner = Learner(cfg, "", learner_token="", io=io)
    state_before = {k: v.clone() for k, v in learner.model.state_dict().items()}
    weight = learner.model.model.layers[0].mlp.up_proj.weight
    fired = []

    def nan_once(grad):
        if not fired:
            fired.append(True)
            return grad * float("nan")
        return grad

    weight.register_hook(nan_once)
    learner.train()

    # the poisoned batch went back; step 0 was trained on the next batch
    assert io.rejected and io.rejected[0][0] == 0 and "gradient norm is nan" in io.rejected[0][1]
    assert io.asked == [0, 0, 1]
    assert [v for v, _ in io.published] == [0, 1, 2]
    assert io.published[0][1] == _payload_of(state_before, learner, io)
    skipped = _records(cfg, "step_skipped")
    assert len(skipped) == 1 and skipped[0]["step"] == 0
    assert [c["step"] for c in _records(cfg, "checkpoint")] == [1, 2]
    assert summarize(read_metrics(cfg.run_path / "metrics.jsonl"))["steps_skipped"] == 1

    # the skip left no trace: a learner that never saw the poisoned batch ends bit-identical
    clean_io = FakeIO(good)
    clean = Learner(learner_config(tmp_path / "clean", tiny_model_dir), "", learner_token="", io=clean_io)
    clean.train()
    assert [d for _, d in clean_io.published] == [d for _, d in io.published]
    for (name, a), (_, b) in zip(learner.model.state_dict().items(), clean.model.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def _payload_of(state, learner, io) -> bytes:
    from echo2.models.weights import model_payload

    learner_state = {k: v.clone() for k, v in learner.model.state_dict().items()}
    learner.model.load_state_dict(state)
    try:
        return bytes(model_payload(learner.model, learner.wire_dtype))
    finally:
        learner.model.load_state_dict(learner_state)


def test_a_run_of_skips_stops_the_learner_with_a_clear_error(tmp_path, tiny_model_dir):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    cfg = learner_config(tmp_path / "run", tiny_model_dir, train={"max_consecutive_skips": 2})
    io = FakeIO([addition_batch(tokenizer, seed) for seed in range(3)])
    learner = Learner(cfg, "", learner_token="", io=io)
    learner.model.model.layers[0].mlp.up_proj.weight.register_hook(lambda g: g * float("inf"))
    with pytest.raises(RuntimeError, match="2 steps in a row"):
        learner.train()
    assert [v for v, _ in io.published] == [0] and len(io.rejected) == 2
    assert latest_checkpoint(cfg.run_path / "checkpoints") is None


def test_a_non_finite_model_is_never_published_or_saved(tmp_path, tiny_model_dir):
    cfg = learner_config(tmp_path / "run", tiny_model_dir)
    io = FakeIO([])
    learner = Learner(cfg, "", learner_token="", io=io)
    with torch.no_grad():
        learner.model.model.norm.weight[3] = float("nan")
    with pytest.raises(NonFiniteError, match="model.norm.weight"):
        learner._publish(1)
    assert io.published == []
    with pytest.raises(NonFiniteError, match="model.norm.weight"):
        save_checkpoint(tmp_path / "ckpt", 1, learner.model, learner.optimizer)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())

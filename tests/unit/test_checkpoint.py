"""Exact resume: training k steps, checkpointing, restoring into fresh objects and training the
rest gives bit-identical weights and optimizer state to an uninterrupted run on the same batches."""

from __future__ import annotations

import random

import torch

from echo2.config.run import GRPOConfig
from echo2.learner.checkpoint import latest_checkpoint, save_checkpoint
from echo2.learner.checkpoint_reader import load_checkpoint
from echo2.learner.step import train_step
from echo2.models.loading import load_model, load_tokenizer
from echo2.protocol.messages import RolloutCompletion, TrainGroup


def _batches(tokenizer, steps: int) -> list[list[TrainGroup]]:
    rng = random.Random(0)
    batches = []
    for step in range(steps):
        groups = []
        for g in range(3):
            prompt = tokenizer.encode(f"{rng.randint(0, 99)}+{rng.randint(0, 99)}=", add_special_tokens=False)
            completions = []
            for _ in range(4):
                ids = [rng.randint(4, 40) for _ in range(rng.randint(1, 4))] + [tokenizer.eos_token_id]
                completions.append(RolloutCompletion(token_ids=ids, logprobs=[-rng.random() * 3 for _ in ids]))
            groups.append(TrainGroup(lease_id=f"{step}-{g}", prompt_index=step * 3 + g, prompt_ids=prompt,
                                     version=max(0, step - 1), worker_id="w", rewards=[rng.random() for _ in range(4)],
                                     completions=completions))
        batches.append(groups)
    return batches


def _fresh(model_dir):
    model = load_model(str(model_dir))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def test_resume_is_bit_exact(tiny_model_dir, tmp_path):
    tokenizer = load_tokenizer(str(tiny_model_dir))
    batches = _batches(tokenizer, 6)
    cfg = GRPOConfig()
    pad = tokenizer.pad_token_id

    straight, opt = _fresh(tiny_model_dir)
    for step, batch in enumerate(batches):
        train_step(straight, opt, batch, step=step, cfg=cfg, temperature=1.0, pad_id=pad)

    first, opt1 = _fresh(tiny_model_dir)
    for step, batch in enumerate(batches[:3]):
        train_step(first, opt1, batch, step=step, cfg=cfg, temperature=1.0, pad_id=pad)
    save_checkpoint(tmp_path, 3, first, opt1)
    for step, batch in enumerate(batches[3:5], start=3):  # work lost in a crash after the checkpoint
        train_step(first, opt1, batch, step=step, cfg=cfg, temperature=1.0, pad_id=pad)
    del first, opt1

    resumed, opt2 = _fresh(tiny_model_dir)
    path = latest_checkpoint(tmp_path)
    assert path is not None and path.name == "step_0000003"
    start = load_checkpoint(path, resumed, opt2)
    for step, batch in enumerate(batches[start:], start=start):
        train_step(resumed, opt2, batch, step=step, cfg=cfg, temperature=1.0, pad_id=pad)

    for (name, a), (_, b) in zip(straight.state_dict().items(), resumed.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    exp_a = [s["exp_avg"] for s in opt.state_dict()["state"].values()]
    exp_b = [s["exp_avg"] for s in opt2.state_dict()["state"].values()]
    assert all(torch.equal(a, b) for a, b in zip(exp_a, exp_b, strict=True))


def test_half_written_checkpoint_is_ignored(tiny_model_dir, tmp_path):
    model, opt = _fresh(tiny_model_dir)
    save_checkpoint(tmp_path, 2, model, opt)
    (tmp_path / ".step_0000004.tmp").mkdir()  # a crash while writing step 4
    (tmp_path / "step_0000005").mkdir()  # no meta.json: incomplete
    assert latest_checkpoint(tmp_path).name == "step_0000002"

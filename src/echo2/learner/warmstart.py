"""Supervised warm start: a short fine-tune that stands in for the pretrained base model a real
user brings, so RL starts from a policy that is sometimes right and has something to improve."""

from __future__ import annotations

import torch

from echo2.config.run import WarmStartConfig
from echo2.tasks.base import TaskAdapter, render_prompt

# the SFT stream starts far past the RL prompt indices (10M) so the two never share generated
# problems; the early-stop check draws from past the SFT stream
SFT_OFFSET = 10_000_000
CHECK_OFFSET = 20_000_000


def sft_batch(tokenizer, task: TaskAdapter, start: int, size: int) -> tuple[torch.Tensor, ...]:
    """Right-padded prompt+answer+EOS sequences with labels only on the answer tokens."""
    rows, labels = [], []
    for index in range(start, start + size):
        problem = task.train_problem(index)
        prompt_ids = tokenizer.encode(render_prompt(tokenizer, task, problem), add_special_tokens=False)
        answer_ids = tokenizer.encode(task.reference_completion(problem), add_special_tokens=False)
        answer_ids.append(tokenizer.eos_token_id)
        rows.append(prompt_ids + answer_ids)
        labels.append([-100] * len(prompt_ids) + answer_ids)
    width = max(len(r) for r in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids, mask, lab


def warm_start(model, tokenizer, task: TaskAdapter, cfg: WarmStartConfig, seed: int, progress=None,
               accuracy=None) -> tuple[float, int]:
    """Run up to cfg.steps AdamW steps of next-token loss on reference answers; returns the last
    loss and the steps taken. `accuracy()` (greedy accuracy on training problems) is asked every
    cfg.check_every steps when cfg.stop_at_accuracy is set, and the warm start ends once it
    reaches that."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for step in range(cfg.steps):
        ids, mask, labels = sft_batch(tokenizer, task, SFT_OFFSET + step * cfg.batch_size, cfg.batch_size)
        loss = model(input_ids=ids, attention_mask=mask, labels=labels).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        loss_value = float(loss.detach())
        if progress is not None:
            progress(step + 1, loss_value)
        if cfg.stop_at_accuracy is not None and accuracy is not None and (step + 1) % cfg.check_every == 0:
            reached = accuracy()
            model.train()
            if reached >= cfg.stop_at_accuracy:
                return loss_value, step + 1
    return loss_value, cfg.steps

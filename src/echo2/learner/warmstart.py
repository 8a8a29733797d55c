"""Supervised warm start: a short fine-tune that stands in for the pretrained base model a real
user brings, so RL starts from a policy that is sometimes right and has something to improve."""

from __future__ import annotations

import random

import torch

from echo2.config.run import WarmStartConfig
from echo2.envs.task import EnvTask
from echo2.envs.transcript import Codec
from echo2.learner.batching import loss_mask
from echo2.protocol.messages import RolloutCompletion
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
    return _padded(rows, labels, tokenizer.pad_token_id)


def env_sft_batch(tokenizer, task: EnvTask, *, start: int, size: int,
                  max_action_tokens: int) -> tuple[torch.Tensor, ...]:
    """Right-padded transcripts of episodes played by each environment's `demo_action` (a random
    legal move) with labels only on the actions and their EOS: the format, not the strategy."""
    codec = Codec.from_tokenizer(tokenizer, task.cfg)
    rows, labels = [], []
    for index in range(start, start + size):
        episode = task.episode(codec, task.train_seed(index), max_action_tokens)
        rng = random.Random(index)
        while not episode.finished:
            action = codec.encode(episode.env.demo_action(rng))[:max_action_tokens - 1] + [codec.eos_id]
            episode.act(action)
        mask = loss_mask(RolloutCompletion(token_ids=episode.token_ids, logprobs=episode.logprobs,
                                           segments=episode.segments))
        rows.append(episode.prompt_ids + episode.token_ids)
        labels.append([-100] * len(episode.prompt_ids) + [t if m else -100 for t, m in zip(episode.token_ids, mask,
                                                                                              strict=True)])
    return _padded(rows, labels, tokenizer.pad_token_id)


def _padded(rows: list[list[int]], labels: list[list[int]], pad: int) -> tuple[torch.Tensor, ...]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad] * (width - len(r)) for r in rows])
    lab = torch.tensor([r + [-100] * (width - len(r)) for r in labels])
    mask = (torch.arange(width)[None, :] < torch.tensor([len(r) for r in rows])[:, None]).long()
    return ids, mask, lab


def warm_start(model, tokenizer, task: TaskAdapter | EnvTask, cfg: WarmStartConfig, *, seed: int,
               progress=None, accuracy=None, max_action_tokens: int = 8) -> tuple[float, int]:
    """Run up to cfg.steps AdamW steps of next-token loss on reference answers (multi-turn tasks:
    on the actions of episodes played with random legal moves); returns the last loss and the
    steps taken. `accuracy()` (greedy accuracy on training problems) is asked every
    cfg.check_every steps when cfg.stop_at_accuracy is set, and the warm start ends once it
    reaches that."""
    torch.manual_seed(seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, weight_decay=0.0)
    model.train()
    loss_value = float("nan")
    for step in range(cfg.steps):
        start = SFT_OFFSET + step * cfg.batch_size
        if task.kind == "episode":
            ids, mask, labels = env_sft_batch(tokenizer, task, start=start, size=cfg.batch_size,
                                              max_action_tokens=max_action_tokens)
        else:
            ids, mask, labels = sft_batch(tokenizer, task, start, cfg.batch_size)
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

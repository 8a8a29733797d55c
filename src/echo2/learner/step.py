"""One GRPO optimizer step on a batch of rollout groups from the coordinator."""

from __future__ import annotations

import time
from collections import Counter

import torch

from echo2.config.run import GRPOConfig
from echo2.learner.grpo import group_advantages, grpo_loss
from echo2.learner.logprobs import completion_logprobs, pack
from echo2.protocol.messages import TrainGroup


def _flatten(groups: list[TrainGroup]):
    prompts, completions, behav, rewards, group_ids = [], [], [], [], []
    for gi, group in enumerate(groups):
        for completion, reward in zip(group.completions, group.rewards, strict=True):
            prompts.append(group.prompt_ids)
            completions.append(completion.token_ids)
            behav.append(completion.logprobs)
            rewards.append(reward)
            group_ids.append(gi)
    return prompts, completions, behav, rewards, group_ids


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: list[TrainGroup],
    step: int,
    cfg: GRPOConfig,
    temperature: float,
    pad_id: int,
    ref_model: torch.nn.Module | None = None,
) -> dict:
    started = time.perf_counter()
    prompts, completions, behav, rewards, group_ids = _flatten(groups)
    batch = pack(prompts, completions, pad_id)
    horizon = batch.completion_ids_BT.shape[1]
    behav_BT = torch.tensor([b + [0.0] * (horizon - len(b)) for b in behav])
    rewards_B = torch.tensor(rewards)
    adv_B = group_advantages(rewards_B, torch.tensor(group_ids))
    model.train()
    logp_BT = completion_logprobs(model, batch, temperature)
    ref_BT = None
    if ref_model is not None:
        with torch.no_grad():
            ref_BT = completion_logprobs(ref_model, batch, temperature)
    out = grpo_loss(logp_BT, behav_BT, adv_B, batch.completion_mask_BT, cfg, ref_BT)
    optimizer.zero_grad(set_to_none=True)
    out.loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm)
    optimizer.step()
    stale = Counter(step - g.version for g in groups)
    return {
        "loss": float(out.loss.detach()),
        "grad_norm": float(grad_norm),
        "reward_mean": float(rewards_B.mean()),
        "tokens": int(batch.completion_mask_BT.sum()),
        "staleness_hist": {str(k): v for k, v in sorted(stale.items())},
        "staleness_max": max(stale),
        "prompt_indices": [g.prompt_index for g in groups],
        "train_s": time.perf_counter() - started,
        **out.metrics,
    }

"""GRPO as pure tensor functions: group-normalised advantages and the token-level clipped
objective with off-policy correction against the worker's behaviour log-probs.

Shapes: B sequences, T completion positions (right-padded), G completions per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from echo2.config.run import GRPOConfig


def group_advantages(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    """(r - mean_group) / (std_group + eps). A group whose rewards are all equal carries no
    signal and gets zero advantage (rather than a division blow-up)."""
    num_groups = int(group_ids_B.max()) + 1
    counts = torch.zeros(num_groups).index_add_(0, group_ids_B, torch.ones_like(rewards_B))
    sums = torch.zeros(num_groups).index_add_(0, group_ids_B, rewards_B)
    mean_B = (sums / counts)[group_ids_B]
    sq = torch.zeros(num_groups).index_add_(0, group_ids_B, (rewards_B - mean_B) ** 2)
    # unbiased std as in the GRPO paper; groups of one have no spread
    std_B = torch.sqrt(sq / (counts - 1).clamp(min=1))[group_ids_B]
    return torch.where(std_B > 0, (rewards_B - mean_B) / (std_B + eps), torch.zeros_like(rewards_B))


@dataclass
class LossOutput:
    loss: torch.Tensor
    metrics: dict[str, float]


def grpo_loss(
    logp_BT: torch.Tensor,
    behav_logp_BT: torch.Tensor,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    cfg: GRPOConfig,
    ref_logp_BT: torch.Tensor | None = None,
) -> LossOutput:
    """Token-level GRPO loss, averaged over all completion tokens of the batch.

    "clip": ratio r = pi/pi_behav, PPO min(r A, clip(r, 1-lo, 1+hi) A), and for A < 0 the
    objective is floored at tis_cap * A (dual clip): a stale token whose ratio exploded cannot
    push an unbounded gradient.
    "tis": decoupled objective; the proximal policy is the current one before this update
    (one optimizer step per batch), so its clipped ratio is 1 in value and the truncated
    importance weight min(pi_prox/pi_behav, tis_cap) carries the off-policy correction.
    """
    mask = mask_BT.to(logp_BT.dtype)
    ntok = mask.sum().clamp(min=1)
    adv_BT = adv_B[:, None].expand_as(logp_BT)
    log_ratio = logp_BT - behav_logp_BT
    if cfg.loss == "clip":
        per_tok = _clip_objective(log_ratio, adv_BT, cfg)
    else:
        per_tok = _tis_objective(logp_BT, behav_logp_BT, adv_BT, cfg)
    loss_BT = -per_tok
    if ref_logp_BT is not None and cfg.kl_coef > 0:
        loss_BT = loss_BT + cfg.kl_coef * _k3(ref_logp_BT - logp_BT)
    loss = (loss_BT * mask).sum() / ntok
    return LossOutput(loss=loss, metrics=_metrics(log_ratio.detach(), mask, ntok, cfg))


def _clip_objective(log_ratio: torch.Tensor, adv_BT: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    obj = torch.minimum(ratio * adv_BT, clipped * adv_BT)
    return torch.where(adv_BT < 0, torch.maximum(obj, cfg.tis_cap * adv_BT), obj)


def _tis_objective(logp_BT, behav_logp_BT, adv_BT, cfg: GRPOConfig) -> torch.Tensor:
    prox_BT = logp_BT.detach()
    weight = torch.exp(prox_BT - behav_logp_BT).clamp(max=cfg.tis_cap)
    ratio = torch.exp(logp_BT - prox_BT)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    return weight * torch.minimum(ratio * adv_BT, clipped * adv_BT)


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Unbiased, non-negative KL estimator exp(x) - 1 - x (Schulman's k3)."""
    return torch.exp(log_ratio) - 1 - log_ratio


def _metrics(log_ratio: torch.Tensor, mask: torch.Tensor, ntok: torch.Tensor, cfg: GRPOConfig) -> dict[str, float]:
    ratio = torch.exp(log_ratio)
    clipped = ((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).to(mask.dtype)
    return {
        # KL(behaviour || current) on the batch: how far the stale policy drifted
        "mismatch_kl": float((_k3(log_ratio) * mask).sum() / ntok),
        "clip_frac": float((clipped * mask).sum() / ntok),
        "ratio_max": float(torch.where(mask > 0, ratio, torch.zeros_like(ratio)).max()),
    }

"""GRPO as pure tensor functions: group-normalised advantages and the token-level clipped
objective with off-policy correction against the worker's behaviour log-probs.

Shapes: B sequences, T completion positions (right-padded), G completions per group.
"""

from __future__ import annotations

import math
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


# |log pi - log pi_behav| beyond this is no stale policy but a broken or fabricated log-prob: a
# real token sampled with probability e^-20 (2e-9) essentially never occurs. Such tokens are left
# out of the loss (and counted), and the log-ratio is clamped before exp so fp32 cannot overflow:
# exp(20) = 4.9e8, while an unclamped behaviour log-prob of -100 gave inf, and inf * 0 in the
# backward pass turned every weight into NaN.
MAX_LOG_RATIO = 20.0


@dataclass
class LossOutput:
    loss: torch.Tensor
    sums: dict[str, float]
    """Additive statistics (token counts and sums; `ratio_max` is a max) so micro-batches of one
    step combine exactly; `reduce_stats` turns them into the step's metrics."""


def grpo_loss(
    logp_BT: torch.Tensor,
    behav_logp_BT: torch.Tensor,
    adv_B: torch.Tensor,
    mask_BT: torch.Tensor,
    *,
    cfg: GRPOConfig,
    ref_logp_BT: torch.Tensor | None = None,
    num_tokens: float | None = None,
) -> LossOutput:
    """Token-level GRPO loss: the sum over completion tokens divided by `num_tokens`, the
    completion tokens of the whole step (default: those in `mask_BT`), so the losses of a step's
    micro-batches add up to the full-batch loss. `adv_B` holds one advantage per row, or one per
    token (the shape of `logp_BT`, which may be a flat [N] of tokens).

    "clip": ratio r = pi/pi_behav, PPO min(r A, clip(r, 1-lo, 1+hi) A), and for A < 0 the
    objective is floored at tis_cap * A (dual clip): a stale token whose ratio exploded cannot
    push an unbounded gradient.
    "tis": decoupled objective; the proximal policy is the current one before this update
    (one optimizer step per batch), so its clipped ratio is 1 in value and the truncated
    importance weight min(pi_prox/pi_behav, tis_cap) carries the off-policy correction.
    Tokens with |log r| > MAX_LOG_RATIO are left out of both (see MAX_LOG_RATIO).
    """
    raw_log_ratio = (logp_BT - behav_logp_BT).detach()
    outlier = raw_log_ratio.abs() > MAX_LOG_RATIO
    mask = mask_BT.to(logp_BT.dtype)
    kept = mask * (~outlier).to(mask.dtype)
    ntok = torch.as_tensor(num_tokens if num_tokens is not None else mask.sum(), dtype=logp_BT.dtype).clamp(min=1)
    adv_BT = (adv_B[:, None] if adv_B.dim() < logp_BT.dim() else adv_B).expand_as(logp_BT)
    log_ratio = (logp_BT - behav_logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    if cfg.loss == "clip":
        per_tok = _clip_objective(log_ratio, adv_BT, cfg)
    else:
        per_tok = _tis_objective(logp_BT, behav_logp_BT, adv_BT, cfg)
    loss_BT = -per_tok
    if ref_logp_BT is not None and cfg.kl_coef > 0:
        loss_BT = loss_BT + cfg.kl_coef * _k3((ref_logp_BT - logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    # where, not multiply: a masked token's loss may be inf and inf * 0 is NaN
    loss = torch.where(kept > 0, loss_BT, torch.zeros_like(loss_BT)).sum() / ntok
    return LossOutput(loss=loss, sums=_sums(log_ratio.detach(), kept, mask, outlier, cfg=cfg))


def _clip_objective(log_ratio: torch.Tensor, adv_BT: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    obj = torch.minimum(ratio * adv_BT, clipped * adv_BT)
    return torch.where(adv_BT < 0, torch.maximum(obj, cfg.tis_cap * adv_BT), obj)


def _tis_objective(logp_BT, behav_logp_BT, adv_BT, cfg: GRPOConfig) -> torch.Tensor:
    prox_BT = logp_BT.detach()
    weight = torch.exp((prox_BT - behav_logp_BT).clamp(max=math.log(cfg.tis_cap)))
    ratio = torch.exp(logp_BT - prox_BT)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    return weight * torch.minimum(ratio * adv_BT, clipped * adv_BT)


def _k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """Unbiased, non-negative KL estimator exp(x) - 1 - x (Schulman's k3)."""
    return torch.exp(log_ratio) - 1 - log_ratio


def _sums(log_ratio, kept, mask, outlier, *, cfg: GRPOConfig) -> dict[str, float]:
    ratio = torch.exp(log_ratio)
    clipped = ((ratio < 1 - cfg.clip_low) | (ratio > 1 + cfg.clip_high)).to(kept.dtype)
    return {
        "tokens": float(mask.sum()),
        "mismatch_kl_sum": float((_k3(log_ratio) * kept).sum()),
        "clipped_tokens": float((clipped * kept).sum()),
        "ratio_max": float(torch.where(kept > 0, ratio, torch.zeros_like(ratio)).max()) if kept.numel() else 0.0,
        "log_ratio_outliers": float((outlier.to(mask.dtype) * mask).sum()),
    }


def reduce_stats(parts: list[dict[str, float]]) -> dict[str, float]:
    """One step's metrics from its micro-batches' sums."""
    tokens = sum(p["tokens"] for p in parts)
    kept = max(1.0, tokens - sum(p["log_ratio_outliers"] for p in parts))
    return {
        # KL(behaviour || current) on the batch: how far the stale policy drifted
        "mismatch_kl": sum(p["mismatch_kl_sum"] for p in parts) / kept,
        "clip_frac": sum(p["clipped_tokens"] for p in parts) / kept,
        "ratio_max": max((p["ratio_max"] for p in parts), default=0.0),
        # tokens whose behaviour log-prob was impossibly far from the learner's: left out
        "log_ratio_outliers": int(sum(p["log_ratio_outliers"] for p in parts)),
    }

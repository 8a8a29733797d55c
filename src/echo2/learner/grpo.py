"""GRPO as pure tensor functions: group-normalised advantages and the step's loss under the
named objective (learner/objectives.py), with off-policy correction against the worker's
behaviour log-probs.

Shapes: B sequences, T completion positions (right-padded), G completions per group.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from echo2.config.grpo import GRPOConfig
from echo2.learner.objectives import MAX_LOG_RATIO, token_objective

__all__ = ["MAX_LOG_RATIO", "LossOutput", "group_advantages", "grpo_loss", "reduce_stats"]


def group_advantages(rewards_B: torch.Tensor, group_ids_B: torch.Tensor, eps: float = 1e-6,
                     scale: str = "group") -> torch.Tensor:
    """r - mean_group, divided by (std_group + eps) for `scale` "group" (GRPO), by (std of every
    reward of the step + eps) for "batch", by nothing for "none" (Dr. GRPO). A group whose
    rewards are all equal carries no signal and gets zero advantage (rather than a division
    blow-up); so does every row when the whole batch's rewards are equal under "batch"."""
    num_groups = int(group_ids_B.max()) + 1
    zeros = torch.zeros(num_groups, dtype=rewards_B.dtype)
    counts = zeros.clone().index_add_(0, group_ids_B, torch.ones_like(rewards_B))
    sums = zeros.clone().index_add_(0, group_ids_B, rewards_B)
    mean_B = (sums / counts)[group_ids_B]
    centred_B = rewards_B - mean_B
    if scale == "none":
        return centred_B
    if scale == "batch":  # unbiased, as TRL's nanstd
        std = float(rewards_B.std()) if rewards_B.numel() > 1 else 0.0
        return centred_B / (std + eps) if std > 0 else torch.zeros_like(rewards_B)
    sq = zeros.clone().index_add_(0, group_ids_B, centred_B ** 2)
    # unbiased std as in the GRPO paper; groups of one have no spread
    std_B = torch.sqrt(sq / (counts - 1).clamp(min=1))[group_ids_B]
    return torch.where(std_B > 0, centred_B / (std_B + eps), torch.zeros_like(rewards_B))


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
    token_weight: torch.Tensor | None = None,
    seq_ids: torch.Tensor | None = None,
    prox_logp_BT: torch.Tensor | None = None,
) -> LossOutput:
    """The step's loss over these tokens: -sum_t weight_t objective_t (cfg.loss, see
    learner/objectives.py). `token_weight`: each token's weight (`sequence_weights` of its
    completion), so the losses of a step's micro-batches add up to the full-batch loss; default
    1 / `num_tokens` (the completion tokens of the whole step; default: those in `mask_BT`).
    `adv_B` holds one advantage per row, or one per token (the shape of `logp_BT`, which may be
    a flat [N] of tokens). `seq_ids`: each token's completion (default: its row of [B, T]).
    `prox_logp_BT`: the policy before the update (`token_objective`; default: `logp_BT` itself).

    Tokens with |log pi - log pi_behav| > MAX_LOG_RATIO are left out (see MAX_LOG_RATIO).
    """
    raw_log_ratio = (logp_BT - behav_logp_BT).detach()
    outlier = raw_log_ratio.abs() > MAX_LOG_RATIO
    mask = mask_BT.to(logp_BT.dtype)
    kept = mask * (~outlier).to(mask.dtype)
    adv_BT = (adv_B[:, None] if adv_B.dim() < logp_BT.dim() else adv_B).expand_as(logp_BT)
    if seq_ids is None:
        seq_ids = _row_ids(logp_BT)
    if token_weight is None:
        ntok = torch.as_tensor(num_tokens if num_tokens is not None else mask.sum(), dtype=logp_BT.dtype)
        token_weight = torch.ones_like(logp_BT) / ntok.clamp(min=1)
    loss_BT = -token_objective(logp_BT, behav_logp_BT, adv_BT, kept=kept, seq_ids=seq_ids, cfg=cfg,
                               prox_logp=prox_logp_BT)
    if ref_logp_BT is not None and cfg.kl_coef > 0:
        loss_BT = loss_BT + cfg.kl_coef * _k3((ref_logp_BT - logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))
    # where, not multiply: a masked token's loss may be inf and inf * 0 is NaN
    loss = (torch.where(kept > 0, loss_BT, torch.zeros_like(loss_BT)) * token_weight.to(loss_BT.dtype)).sum()
    log_ratio = (logp_BT - behav_logp_BT).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    return LossOutput(loss=loss, sums=_sums(log_ratio.detach(), kept, mask, outlier, cfg=cfg))


def _row_ids(logp_BT: torch.Tensor) -> torch.Tensor:
    """Each position's row: its completion, for [B, T] inputs (a flat [N] is one completion
    unless the caller says otherwise)."""
    if logp_BT.dim() < 2:
        return torch.zeros(logp_BT.shape, dtype=torch.long, device=logp_BT.device)
    rows = torch.arange(logp_BT.shape[0], device=logp_BT.device)
    return rows.view(-1, *([1] * (logp_BT.dim() - 1))).expand(logp_BT.shape)


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

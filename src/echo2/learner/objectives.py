"""The named GRPO objectives (grpo.loss) as pure tensor functions: what each token contributes
(`token_objective`, to be maximised) and how a step's tokens are weighted into one loss
(`sequence_weights`). `learner.grpo.grpo_loss` puts them together with the safety every
objective shares: the log-ratio to the behaviour policy clamped before `exp`, tokens beyond
MAX_LOG_RATIO left out, an importance weight capped at tis_cap (or the dual clip), and a step
whose loss or gradient is not finite skipped (learner.step).

Notation: pi the policy being trained, pi_prox the same policy before this step's update (its
log-probs detached: echo2 takes one optimizer step per batch), pi_b the worker's behaviour
policy, r = pi / pi_prox (1 in value, its gradient that of log pi), w = min(pi_prox / pi_b, C)
the truncated importance weight (C = tis_cap), A the advantage, eps_lo / eps_hi = clip_low /
clip_high, |o_i| the trained tokens of completion i, B the completions of the step, L_max the
longest completion allowed (sampling.max_new_tokens).

- "tis":  sum_t w min(r A, clip(r, 1-eps_lo, 1+eps_hi) A) / sum_i |o_i|. Decoupled PPO with
  truncated importance sampling (Hilton et al., arXiv 2110.00641; Yao et al., "Off-policy RL
  for LLMs", TIS). echo2's default.
- "dapo": the same formula: TRL's loss_type="dapo" (token-level normalisation over the batch,
  asymmetric clip eps_hi > eps_lo; DAPO, arXiv 2503.14476) with its vLLM importance correction
  (vllm_importance_sampling_mode="token_truncate", cap C). Equal to "tis" in loss and gradient.
- "bnpo": TRL's loss_type="bnpo", normalised by the tokens of the local batch; a step here is
  one batch, so it equals "dapo".
- "grpo": per completion the mean over its tokens, then the mean over completions:
  (1/B) sum_i (1/|o_i|) sum_t w min(r A, clip(r) A) (GRPO, DeepSeekMath, arXiv 2402.03300;
  TRL's loss_type="grpo").
- "dr_grpo": sum_t w min(r A, clip(r) A) / (B L_max), a constant normaliser, and by default no
  std scaling of advantages (Dr. GRPO, arXiv 2503.20783; TRL's loss_type="dr_grpo").
- "gspo": a sequence-level ratio s_i = exp(mean_t log(pi / pi_prox)) and weight w_i =
  min(exp(mean_t log(pi_prox / pi_b)), C) (both length-normalised: geometric means over the
  completion's tokens), (1/B) sum_i w_i min(s_i A_i, clip(s_i) A_i) (GSPO, arXiv 2507.18071;
  TRL's importance_sampling_level="sequence" with loss_type="grpo").
- "cispo": sum_t sg[min(pi / pi_b, C)] A log pi / sum_i |o_i|: the clipped importance weight
  times the log-prob, the gradient through log pi only, so a token past the cap still carries
  gradient at the capped weight (CISPO, MiniMax-M1, arXiv 2506.13585; TRL's loss_type="cispo"
  with the behaviour log-probs as old_per_token_logps and epsilon_high = C).
- "clip": PPO's min(rho A, clip(rho, 1-eps_lo, 1+eps_hi) A) on rho = pi / pi_b, floored at C A
  for A < 0 (dual clip, Ye et al., arXiv 1912.09729), normalised like "tis". A stale token the
  policy already learned falls outside the clip range and carries no gradient.

With one optimizer step per batch r = 1, so the clip of "tis", "dapo", "bnpo", "grpo",
"dr_grpo" and "gspo" never binds and "cispo" has the gradient of "tis": these differ in how
tokens are weighted (per token, per completion, by a constant, per sequence) and in where the
importance weight is taken, which is what the clip-free names in the peers' recipes mean too
when they take one step per batch.
"""

from __future__ import annotations

import math
from typing import get_args

import torch

from echo2.config.grpo import GRPOConfig, Objective

__all__ = ["OBJECTIVES", "sequence_weights", "token_objective"]

OBJECTIVES: tuple[str, ...] = get_args(Objective)
PER_COMPLETION = frozenset({"grpo", "gspo"})
"""Objectives that average each completion's tokens, then the completions."""


def sequence_weights(objective: str, trained_tokens_S: torch.Tensor, *,
                     max_new_tokens: int | None = None) -> torch.Tensor:
    """The weight of each token of completion s in the step's loss (a sum over tokens): 1 / (sum
    of |o_i|) for token-level objectives, 1 / (B |o_s|) for per-completion ones, 1 / (B L_max)
    for "dr_grpo" (L_max: `max_new_tokens`, or the longest completion if that is longer or not
    given, e.g. a multi-turn episode's several turns)."""
    lengths = trained_tokens_S.to(torch.float64)
    count = max(1, lengths.numel())
    if objective in PER_COMPLETION:
        weights = 1.0 / (count * lengths.clamp(min=1.0))
    elif objective == "dr_grpo":
        longest = float(lengths.max()) if lengths.numel() else 0.0
        weights = torch.full_like(lengths, 1.0 / (count * max(1.0, longest, float(max_new_tokens or 0))))
    else:
        weights = torch.full_like(lengths, 1.0 / max(1.0, float(lengths.sum())))
    return weights


def token_objective(logp: torch.Tensor, behav_logp: torch.Tensor, adv: torch.Tensor, *, kept: torch.Tensor,
                    seq_ids: torch.Tensor, cfg: GRPOConfig, prox_logp: torch.Tensor | None = None) -> torch.Tensor:
    """Each token's term of the objective (maximised; the loss is its negative). `kept`: the
    tokens trained (masked ones and log-ratio outliers are 0); `seq_ids`: each token's
    completion, for the sequence-level ratio of "gspo". `prox_logp`: pi_prox, the policy before
    the update; None: `logp` detached, as the learner's one optimizer step per batch has it (a
    caller taking several steps on one batch passes the log-probs from before the first, and
    the clip of the decoupled objectives then binds)."""
    log_ratio = (logp - behav_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    if cfg.loss == "clip":
        return _clip(log_ratio, adv, cfg)
    if cfg.loss == "cispo":
        weight = torch.exp(log_ratio.clamp(max=math.log(cfg.tis_cap))).detach()
        return weight * adv * logp
    prox = logp.detach() if prox_logp is None else prox_logp.detach()
    if cfg.loss == "gspo":
        log_s = _sequence_mean(logp - prox, kept, seq_ids)
        log_w = _sequence_mean((prox - behav_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO), kept, seq_ids)
    else:
        log_s, log_w = logp - prox, (prox - behav_logp).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
    weight = torch.exp(log_w.clamp(max=math.log(cfg.tis_cap)))
    ratio = torch.exp(log_s)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    return weight * torch.minimum(ratio * adv, clipped * adv)


# |log pi - log pi_behav| beyond this is no stale policy but a broken or fabricated log-prob: a
# real token sampled with probability e^-20 (2e-9) essentially never occurs. Such tokens are left
# out of the loss (and counted), and the log-ratio is clamped before exp so fp32 cannot overflow:
# exp(20) = 4.9e8, while an unclamped behaviour log-prob of -100 gave inf, and inf * 0 in the
# backward pass turned every weight into NaN.
MAX_LOG_RATIO = 20.0


def _clip(log_ratio: torch.Tensor, adv: torch.Tensor, cfg: GRPOConfig) -> torch.Tensor:
    ratio = torch.exp(log_ratio)
    clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
    obj = torch.minimum(ratio * adv, clipped * adv)
    return torch.where(adv < 0, torch.maximum(obj, cfg.tis_cap * adv), obj)


def _sequence_mean(x: torch.Tensor, kept: torch.Tensor, seq_ids: torch.Tensor) -> torch.Tensor:
    """Each token's completion's mean of `x` over its kept tokens, in the shape of `x`."""
    flat_x, flat_kept, flat_ids = x.reshape(-1), kept.reshape(-1).to(x.dtype), seq_ids.reshape(-1)
    count = int(flat_ids.max()) + 1 if flat_ids.numel() else 0
    zeros = torch.zeros(count, dtype=x.dtype, device=x.device)
    # where, not multiply: an outlier's x may be inf, and inf * 0 is NaN
    sums = zeros.index_add(0, flat_ids, torch.where(flat_kept > 0, flat_x, torch.zeros_like(flat_x)))
    counts = zeros.index_add(0, flat_ids, flat_kept)
    return (sums / counts.clamp(min=1.0))[flat_ids].reshape(x.shape)

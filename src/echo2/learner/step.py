"""One GRPO optimizer step on a batch of rollout groups from the coordinator: micro-batches by
token budget with gradient accumulation (the step equals the full-batch step), and a step whose
loss or gradient is not finite is skipped with the optimizer untouched; a batch of only
uninformative groups is a step that changes nothing."""

from __future__ import annotations

import math
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import torch

from echo2.config.run import GRPOConfig
from echo2.config.worker import SlowdownClock, slowdown_idle_s
from echo2.learner.audit import group_mean_abs_diff
from echo2.learner.batching import Samples, flatten, token_staleness
from echo2.learner.distributed import SINGLE, Ranks, full_value
from echo2.learner.grpo import group_advantages, grpo_loss, reduce_stats
from echo2.learner.logprobs import token_logprobs
from echo2.learner.objectives import sequence_weights
from echo2.learner.passes import build_pass, choose_layout, plan_passes, processed_tokens
from echo2.learner.precision import CPU_FP32, Precision, peak_memory_bytes
from echo2.policy.rewards import is_uninformative
from echo2.protocol.messages import TrainGroup


def train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    groups: list[TrainGroup],
    *,
    step: int,
    cfg: GRPOConfig,
    temperature: float,
    pad_id: int,
    ref_model: torch.nn.Module | None = None,
    precision: Precision = CPU_FP32,
    audit_tolerance: float | None = None,
    ranks: Ranks = SINGLE,
    max_new_tokens: int | None = None,
    max_staleness: int | None = None,
) -> dict:
    """Returns the step's metrics; `skipped` is True when nothing was applied. `group_abs_diff`
    is each group's mean |learner - behaviour| log-prob per token, measured on the way; with
    `audit_tolerance`, a group generated at this version (`step`) above it fails the rollout
    audit and the step is skipped (`skip_kind` "audit") so its tokens are never trained.
    `max_new_tokens`: sampling.max_new_tokens, the L_max of loss = "dr_grpo". `max_staleness`:
    S, above which a token's staleness masks it out of the loss (None: no token is masked).

    With several ranks, each takes its share of the micro-batches and the metrics are summed
    over ranks, so every rank returns the same dict (and takes the same decision to skip)."""
    started = time.perf_counter()
    samples = flatten(groups, step=step, max_staleness=max_staleness)
    adv_B, weight_S, uninformative, learns = _weights(groups, samples, cfg, max_new_tokens)
    total_tokens = sum(samples.trained_tokens(i) for i in range(len(samples)))
    layout = choose_layout(model, cfg.share_prompts, ranks.sharded)
    plan = plan_passes(samples, cfg.micro_batch_tokens, layout)
    model.train()
    optimizer.zero_grad(set_to_none=True)
    passes = _run_passes(model, ref_model, samples, plan=plan, adv_B=adv_B.to(precision.device),
                         weight_S=weight_S.to(precision.device), cfg=cfg, temperature=temperature, pad_id=pad_id,
                         precision=precision, ranks=ranks, layout=layout)
    # nothing to learn (the coordinator's stall guard let these through): the step is taken and
    # its version published unchanged, with AdamW's moments and weight decay left alone
    group_abs_diff = group_mean_abs_diff(samples, passes.abs_diff_S, len(groups))
    if not passes.problem and audit_tolerance is not None:
        passes.problem = _audit_problem(groups, group_abs_diff, step, audit_tolerance)
        passes.skip_kind = "audit" if passes.problem else ""
    grad_norm = float("nan")
    if not passes.problem:
        grad_norm = full_value(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
        if not math.isfinite(grad_norm):
            passes.problem, passes.skip_kind = f"gradient norm is {grad_norm}", "non_finite"
    if not passes.problem and learns:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # a skipped step leaves no gradient behind either
    return {**_step_metrics(groups, samples, step=step, passes=passes, total_tokens=total_tokens,
                            micro_batches=len(plan), layout=layout),
            "uninformative_groups": uninformative, "updated": not passes.problem and learns,
            "group_abs_diff": group_abs_diff, "grad_norm": grad_norm, "train_s": time.perf_counter() - started,
            "peak_memory_bytes": peak_memory_bytes(precision.device)}


def emulate_slower_learner(slowdown: float, clock: SlowdownClock, wall_s: float, cpu_s: float) -> None:
    """learner.slowdown (EMULATION ONLY): idle inside the step, so it lasts as on a learner
    `slowdown` times slower (config.worker.slowdown_idle_s)."""
    time.sleep(slowdown_idle_s(slowdown, clock, wall_s, cpu_s))


def _weights(groups: list[TrainGroup], samples: Samples, cfg: GRPOConfig,
             max_new_tokens: int | None) -> tuple[torch.Tensor, torch.Tensor, int, bool]:
    """Each completion's advantage and weight in the loss (the objective's, over the tokens the
    model chose: environment tokens are context only), and how many groups are uninformative.
    With grpo.drop_uninformative_groups such a group (every reward equal; the coordinator's
    stall guard lets one through now and then) weighs nothing and counts in no normaliser or
    batch std, so the step equals the step without it; it is still computed, so the rollout
    audit checks it."""
    alike_G = [is_uninformative(g.rewards) for g in groups]
    keep_G = [not (cfg.drop_uninformative_groups and alike) for alike in alike_G]
    keep_S = torch.tensor([keep_G[g] for g in samples.group_ids], dtype=torch.bool)
    rewards_S, group_ids_S = torch.tensor(samples.rewards), torch.tensor(samples.group_ids)
    trained_S = torch.tensor([samples.trained_tokens(i) for i in range(len(samples))])
    adv_S = torch.zeros_like(rewards_S)
    weight_S = torch.zeros(len(samples), dtype=torch.float64)
    if keep_S.any():
        adv_S[keep_S] = group_advantages(rewards_S[keep_S], group_ids_S[keep_S], scale=cfg.advantage_scale)
        weight_S[keep_S] = sequence_weights(cfg.loss, trained_S[keep_S], max_new_tokens=max_new_tokens)
    return adv_S, weight_S, alike_G.count(True), any(keep_G)


SkipKind = Literal["non_finite", "audit"]
"""Why a step was skipped: a non-finite loss or gradient, or a group that failed the rollout audit."""


@dataclass
class _Passes:
    """What a step's forward/backward passes gave: per-pass stats, their sums, and the first
    problem (a non-finite loss) that makes the step skip."""
    parts: list[dict] = field(default_factory=list)
    loss: float = 0.0
    entropy_sum: float = 0.0
    abs_diff_S: torch.Tensor | None = None
    problem: str = ""
    skip_kind: SkipKind | Literal[""] = ""


def _run_passes(model: torch.nn.Module, ref_model: torch.nn.Module | None, samples: Samples, *, plan: list,
                adv_B: torch.Tensor, weight_S: torch.Tensor, cfg: GRPOConfig, temperature: float,
                pad_id: int, precision: Precision, ranks: Ranks, layout: str) -> _Passes:
    out = _Passes(abs_diff_S=torch.zeros(len(samples)))
    for indices, counted in ranks.share(plan):
        part = _accumulate(model, ref_model, samples, indices, adv_B=adv_B, weight_S=weight_S,
                           cfg=cfg, temperature=temperature, pad_id=pad_id, precision=precision,
                           abs_diff_S=out.abs_diff_S if counted else torch.zeros(len(samples)),
                           weight=1.0 if counted else 0.0, always_backward=ranks.sharded, layout=layout)
        if not counted:
            continue
        out.parts.append(part)
        out.loss += part["loss"]
        out.entropy_sum += part["entropy_sum"]
        if not math.isfinite(part["loss"]) and not out.problem:
            out.problem = f"loss is {part['loss']} in micro-batch {len(out.parts)} of {len(plan)}"
            out.skip_kind = "non_finite"
            if not ranks.sharded:  # every pass is a collective under FSDP: sharded ranks run them all
                break
    if ranks.sharded:
        out.loss, out.entropy_sum, out.parts, out.abs_diff_S = _reduce_over_ranks(
            ranks, loss=out.loss, entropy_sum=out.entropy_sum, parts=out.parts, abs_diff_S=out.abs_diff_S)
        if not math.isfinite(out.loss) and not out.problem:
            out.problem, out.skip_kind = f"loss is {out.loss} on another rank", "non_finite"
    return out


def _audit_problem(groups: list[TrainGroup], group_abs_diff: list[float], step: int, tolerance: float) -> str:
    """The rollout audit of the groups generated at this version: why the step is skipped, or ""."""
    failed = [g for g, d in zip(groups, group_abs_diff, strict=True) if g.version == step and d > tolerance]
    if not failed:
        return ""
    return (f"rollout audit: {len(failed)} group(s) at version {step} differ from the learner's log-probs by more "
            f"than {tolerance:g} nats per token (workers {sorted({g.worker_id for g in failed})})")


def _step_metrics(groups: list[TrainGroup], samples: Samples, *, step: int, passes: _Passes,
                  total_tokens: int, micro_batches: int, layout: str) -> dict:
    stale = Counter(step - g.version for g in groups)
    by_staleness = token_staleness(samples, step)
    return {
        "skipped": bool(passes.problem),
        "skip_reason": passes.problem,
        "skip_kind": passes.skip_kind,
        "loss": passes.loss,
        "reward_mean": sum(samples.rewards) / len(samples),
        "tokens": total_tokens,
        "entropy": passes.entropy_sum / max(1, total_tokens),
        "micro_batches": micro_batches,
        "layout": layout,
        # what the passes computed, padding excluded (a shared prompt counts once): learner tokens/s
        "prompt_tokens_computed": int(sum(p["prompt_tokens"] for p in passes.parts)),
        "completion_tokens_computed": int(sum(p["completion_tokens"] for p in passes.parts)),
        "staleness_hist": {str(k): v for k, v in sorted(stale.items())},
        "staleness_max": max(stale),
        # per token: a group that straddled versions is as old as its oldest tokens, its trained
        # tokens younger; those older than S were masked (kept as context)
        "token_staleness_hist": {str(k): v for k, v in by_staleness.items()},
        "tokens_masked_stale": samples.masked_stale,
        "groups_straddling": sum(any(c.token_versions for c in g.completions) for g in groups),
        "prompt_indices": [g.prompt_index for g in groups],
        "lease_ids": [g.lease_id for g in groups],
        "groups_by_worker": dict(Counter(g.worker_id for g in groups)),
        **reduce_stats(passes.parts),
    }


def _reduce_over_ranks(ranks: Ranks, *, loss: float, entropy_sum: float, parts: list[dict],
                       abs_diff_S: torch.Tensor) -> tuple[float, float, list[dict], torch.Tensor]:
    """The step's sums over every rank's micro-batches: one part holding the sums (ratio_max
    the maximum), as reduce_stats takes them."""
    keys = ("tokens", "mismatch_kl_sum", "clipped_tokens", "log_ratio_outliers", "prompt_tokens", "completion_tokens")
    local = torch.tensor([loss, entropy_sum, *(sum(p[k] for p in parts) for k in keys)], dtype=torch.float64)
    total = ranks.sum(local).tolist()
    ratio_max = float(ranks.max(torch.tensor([max((p["ratio_max"] for p in parts), default=0.0)]))[0])
    part = {**dict(zip(keys, total[2:], strict=True)), "ratio_max": ratio_max}
    return total[0], total[1], [part], ranks.sum(abs_diff_S)


def _accumulate(model, ref_model, samples: Samples, indices: list[int], *, adv_B: torch.Tensor,
                weight_S: torch.Tensor, cfg: GRPOConfig, temperature: float, pad_id: int, precision: Precision,
                abs_diff_S: torch.Tensor, weight: float = 1.0, always_backward: bool = False,
                layout: str = "padded") -> dict:
    """Forward and backward of one micro-batch; each token's loss is weighted for the whole step
    (`weight_S`, the objective's weight per completion), so the accumulated gradients are those
    of the full batch. `weight` 0: a pass that only
    keeps a sharded rank in step with the others (its gradients are zero). `always_backward`:
    also a non-finite loss goes backward (sharded ranks must all run every pass; the step is
    skipped anyway)."""
    device = precision.device
    mb = build_pass(samples, indices, pad_id, layout).to(device)
    prompt_tokens, completion_tokens = processed_tokens(mb, [len(samples.prompts[i]) for i in indices])
    behav_N = torch.tensor([x for i in indices for x in samples.behaviour_logprobs[i]], device=device)
    mask_N = torch.tensor([x for i in indices for x in samples.loss_masks[i]], device=device)
    with precision.autocast():
        logp_N, entropy_N = token_logprobs(model, mb, temperature, cfg.logprob_chunk_tokens)
        ref_N = None
        if ref_model is not None:
            with torch.no_grad():
                ref_N, _ = token_logprobs(ref_model, mb, temperature, cfg.logprob_chunk_tokens)
    with torch.no_grad():  # the rollout audit's measure, at no extra cost
        abs_diff_S.index_add_(0, mb.sample_N.cpu(), ((logp_N.detach().float() - behav_N).abs() * mask_N).cpu())
    out = grpo_loss(logp_N, behav_N, adv_B[mb.sample_N], mask_N, cfg=cfg, ref_logp_BT=ref_N,
                    token_weight=weight_S[mb.sample_N], seq_ids=mb.sample_N)
    loss = float(out.loss.detach())
    if math.isfinite(loss) or always_backward:
        (out.loss * weight if weight != 1.0 else out.loss).backward()
    return {"loss": loss, "entropy_sum": float((entropy_N * mask_N).sum()), "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens, **out.sums}

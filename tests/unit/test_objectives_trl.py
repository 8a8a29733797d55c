"""Each named objective (grpo.loss) against the implementation users trust: TRL's GRPOTrainer
loss (`GRPOTrainer._compute_loss`, trl 1.16.0) on the same tensors, in fp64: the log-probs of
tokens sampled from a stale behaviour policy under it, under the current policy, under the
policy before the update and under a reference, advantages, and completion masks of uneven
lengths. Loss and gradient must agree within 1e-6.

The off-policy path both ways: the behaviour policy is off the current one by ratios past both
clip ranges and the cap. echo2 takes one optimizer step per batch, so its proximal policy (TRL's
old_per_token_logps for the decoupled objectives) is the current one and the clip never binds
there; a second test gives both a proximal policy a step earlier, where it does.

Where echo2 and TRL differ on purpose:
- gspo's importance weight is length-normalised (the geometric mean of the token ratios, as
  GSPO normalises its ratio); TRL's sequence-level correction ("sequence_truncate") takes their
  product, which drifts exponentially with the completion's length. TRL is given the normalised
  weight, and a test shows the two differ;
- the importance correction is TRL's "token_truncate" formula (`_generate_and_score_completions`
  computes it from a generation, which needs a model and an engine), applied as written there.

TRL's method runs unchanged; only its inputs are supplied: the trainer attributes its
`__init__` copies from a real `trl.GRPOConfig`, and the per-token log-probs its model call
would return (the tensor whose gradient is compared). How echo2's names map onto TRL's:

- tis, dapo: loss_type="dapo" with the vLLM importance correction "token_truncate" (old log-probs
  = the policy before the update, capped at tis_cap);
- bnpo, grpo, dr_grpo: loss_type of the same name, the same correction;
- gspo: loss_type="grpo", importance_sampling_level="sequence", the correction per sequence
  (echo2's length-normalised weight, whose own formula is checked below);
- cispo: loss_type="cispo", the behaviour log-probs as old log-probs, epsilon_high = tis_cap;
- clip: loss_type="dapo", the behaviour log-probs as old log-probs, delta = tis_cap (TRL's
  two-sided clip is the dual clip for delta > 1 + clip_high).
"""

from __future__ import annotations

import math
from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch
from trl import GRPOConfig as TRLConfig
from trl import GRPOTrainer

from echo2.config.grpo import GRPOConfig
from echo2.learner.grpo import group_advantages, grpo_loss
from echo2.learner.objectives import OBJECTIVES, sequence_weights

B, T, G = 6, 7, 3
LENGTHS = [7, 3, 5, 1, 6, 4]
CFG = {"clip_low": 0.2, "clip_high": 0.28, "tis_cap": 2.0}
TRL_NAME = {"tis": "dapo", "dapo": "dapo", "bnpo": "bnpo", "grpo": "grpo", "dr_grpo": "dr_grpo", "gspo": "grpo",
            "cispo": "cispo", "clip": "dapo"}


V = 12
"""Vocabulary of the sampled tokens."""
DECOUPLED = ("tis", "dapo", "bnpo", "grpo", "dr_grpo", "gspo")
"""The objectives with a proximal policy (cispo and clip take the behaviour policy as TRL's old)."""


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    """Tokens drawn from a behaviour policy (a stale version: the current logits plus noise), and
    their log-probs under it and under the current, proximal and reference policies."""
    gen = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=torch.float64)

    def noise(scale: float) -> torch.Tensor:
        return torch.randn(B, T, V, generator=gen, dtype=torch.float64) * scale

    current = noise(2.0)
    logits = {"logp": current, "behav": current + noise(1.5), "prox": current + noise(0.5), "ref": current + noise(0.3)}
    tokens = torch.multinomial(torch.softmax(logits["behav"], -1).view(-1, V), 1, generator=gen).view(B, T, 1)
    x = {name: torch.log_softmax(z, -1).gather(-1, tokens).squeeze(-1) for name, z in logits.items()}
    return {**x, "adv": torch.randn(B, generator=gen, dtype=torch.float64), "mask": mask}


def _beyond(log_ratio: torch.Tensor, mask: torch.Tensor) -> dict[str, int]:
    """How many trained tokens have a ratio below the low clip, above the high one, above the cap."""
    ratio, on = torch.exp(log_ratio), mask > 0
    return {"below": int((on & (ratio < 1 - CFG["clip_low"])).sum()),
            "above": int((on & (ratio > 1 + CFG["clip_high"])).sum()),
            "capped": int((on & (ratio > CFG["tis_cap"])).sum())}


def _echo2(objective: str, x: dict, kl_coef: float, prox: torch.Tensor | None = None) -> tuple[float, torch.Tensor]:
    cfg = GRPOConfig(loss=objective, kl_coef=kl_coef, **CFG)
    logp = x["logp"].clone().requires_grad_(True)
    weights = sequence_weights(objective, x["mask"].sum(-1), max_new_tokens=T)
    out = grpo_loss(logp, x["behav"], x["adv"], x["mask"], cfg=cfg, ref_logp_BT=x["ref"] if kl_coef else None,
                    token_weight=weights[:, None].expand(B, T), prox_logp_BT=prox)
    (grad,) = torch.autograd.grad(out.loss, logp)
    return float(out.loss.detach()), grad


def _trl_trainer(objective: str, logp: torch.Tensor, kl_coef: float, tmp_path) -> SimpleNamespace:
    """The attributes GRPOTrainer.__init__ sets from its config that _compute_loss reads."""
    args = TRLConfig(output_dir=str(tmp_path / "trl"), use_cpu=True, bf16=False, report_to=[],
                     loss_type=TRL_NAME[objective], epsilon=CFG["clip_low"],
                     epsilon_high=CFG["tis_cap"] if objective == "cispo" else CFG["clip_high"],
                     delta=CFG["tis_cap"] if objective == "clip" else None, beta=kl_coef,
                     importance_sampling_level="sequence" if objective == "gspo" else "token",
                     use_bias_correction_kl=False,  # echo2's k3 KL carries no importance weight
                     num_generations=G, per_device_train_batch_size=B, max_completion_length=T)
    identity = SimpleNamespace(num_processes=1, gather=lambda t: t, gather_for_metrics=lambda t: t,
                               reduce=lambda t, reduction="sum": t, sync_gradients=True)
    corrected = objective not in ("cispo", "clip")
    return SimpleNamespace(
        args=args, loss_type=args.loss_type, epsilon_low=args.epsilon, epsilon_high=args.epsilon_high,
        beta=args.beta, importance_sampling_level=args.importance_sampling_level,
        max_completion_length=args.max_completion_length, top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold, aux_loss_enabled=False,
        use_vllm=corrected, vllm_importance_sampling_correction=corrected,
        _entropy_bonus_enabled=args.entropy_coef != 0.0 or args.use_adaptive_entropy,
        model=SimpleNamespace(training=True), current_gradient_accumulation_steps=1, accelerator=identity,
        _metrics={"train": defaultdict(list), "eval": defaultdict(list)},
        _get_per_token_logps_and_entropies=lambda *a, **k: (logp, torch.zeros_like(logp), None),
    )


def _trl(objective: str, x: dict, kl_coef: float, tmp_path, prox: torch.Tensor | None = None
         ) -> tuple[float, torch.Tensor]:
    logp = x["logp"].clone().requires_grad_(True)
    trainer = _trl_trainer(objective, logp, kl_coef, tmp_path)
    prox = x["logp"] if prox is None else prox  # the policy before the update, as TRL's old_per_token_logps
    inputs = {"prompt_ids": torch.zeros(B, 1, dtype=torch.long), "prompt_mask": torch.ones(B, 1),
              "completion_ids": torch.zeros(B, T, dtype=torch.long), "completion_mask": x["mask"],
              "advantages": x["adv"], "num_items_in_batch": x["mask"].sum(), "ref_per_token_logps": x["ref"]}
    if objective in ("cispo", "clip"):
        inputs["old_per_token_logps"] = x["behav"]
    else:
        inputs["old_per_token_logps"] = prox
        inputs["importance_sampling_ratio"] = _importance_weights(objective, prox, x)
    loss = GRPOTrainer._compute_loss(trainer, None, inputs)
    (grad,) = torch.autograd.grad(loss, logp)
    return float(loss.detach()), grad


def _importance_weights(objective: str, prox: torch.Tensor, x: dict) -> torch.Tensor:
    """TRL's "token_truncate" correction, min(pi_old / pi_b, C) with the masked log-ratio as in
    `_generate_and_score_completions`; for gspo per sequence, from the geometric mean over the
    completion's tokens (echo2's length normalisation, see the module docstring)."""
    log_w = (prox - x["behav"]) * x["mask"]
    if objective == "gspo":
        log_w = (log_w.sum(-1) / x["mask"].sum(-1)).unsqueeze(-1)
    return torch.exp(log_w).clamp(max=CFG["tis_cap"])


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_each_objective_equals_trl_in_loss_and_gradient(objective, kl_coef, tmp_path):
    for seed in range(3):
        x = _tensors(seed)
        beyond = _beyond(x["logp"] - x["behav"], x["mask"])
        assert min(beyond.values()) > 0, beyond  # off-policy past both clips and the cap
        ours, ours_grad = _echo2(objective, x, kl_coef)
        theirs, theirs_grad = _trl(objective, x, kl_coef, tmp_path)
        assert ours == pytest.approx(theirs, abs=1e-6, rel=0), (objective, seed)
        assert torch.allclose(ours_grad, theirs_grad, atol=1e-6, rtol=0), (objective, seed, ours_grad - theirs_grad)
        assert ours_grad.abs().sum() > 0  # the comparison is not between two zeros
        assert (ours_grad[x["mask"] == 0] == 0).all()  # padding carries nothing


@pytest.mark.parametrize("objective", DECOUPLED)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_with_a_proximal_policy_a_step_earlier_the_clip_binds_as_in_trl(objective, kl_coef, tmp_path):
    """TRL's num_iterations > 1: old_per_token_logps from before the first of several steps on
    a batch. The ratio to it leaves the clip range, the clipped tokens carry no gradient, and
    loss and gradient still equal TRL's, importance correction included."""
    for seed in range(3):
        x = _tensors(seed)
        clipped = _beyond(x["logp"] - x["prox"], x["mask"])
        assert clipped["below"] > 0 and clipped["above"] > 0, clipped
        ours, ours_grad = _echo2(objective, x, kl_coef, prox=x["prox"])
        theirs, theirs_grad = _trl(objective, x, kl_coef, tmp_path, prox=x["prox"])
        assert ours == pytest.approx(theirs, abs=1e-6, rel=0), (objective, seed)
        assert torch.allclose(ours_grad, theirs_grad, atol=1e-6, rtol=0), (objective, seed, ours_grad - theirs_grad)
        if objective != "gspo" and kl_coef == 0:  # per token: the clip that binds zeroes the token's gradient
            ratio, adv = torch.exp(x["logp"] - x["prox"]), x["adv"][:, None].expand(B, T)
            binds = (x["mask"] > 0) & (((adv > 0) & (ratio > 1 + CFG["clip_high"]))
                                       | ((adv < 0) & (ratio < 1 - CFG["clip_low"])))
            assert binds.any() and (ours_grad[binds] == 0).all()
            # where neither clip nor cap binds r w = pi / pi_b either way: the clip is the difference
            assert not torch.allclose(ours_grad, _echo2(objective, x, kl_coef)[1], atol=1e-6)


def test_gspo_weight_is_length_normalised_where_trls_sequence_correction_is_a_product():
    """On purpose: TRL's "sequence_truncate" weight is exp(sum_t log(pi_old / pi_b)), which for
    a long completion runs to 0 or the cap whatever the per-token mismatch; echo2's is the
    geometric mean, exp(mean_t ...), as GSPO normalises its ratio by length."""
    x = _tensors(4)
    log_diff = (x["logp"] - x["behav"]) * x["mask"]
    trl_product = torch.exp(log_diff.sum(-1)).clamp(max=CFG["tis_cap"])
    echo2_mean = _importance_weights("gspo", x["logp"], x).squeeze(-1)
    longer = x["mask"].sum(-1) > 1
    assert not torch.allclose(trl_product[longer], echo2_mean[longer], atol=1e-3)
    assert torch.allclose(trl_product[~longer], echo2_mean[~longer])  # one token: the same weight


def test_the_objectives_differ_where_their_formulas_do():
    """Same tensors, different weighting: the families give different gradients, the names that
    are one formula in echo2 (one optimizer step per batch) give the same."""
    x = _tensors(7)
    grads = {name: _echo2(name, x, 0.0)[1] for name in OBJECTIVES}
    for same in ("dapo", "bnpo", "cispo"):
        assert torch.allclose(grads[same], grads["tis"], atol=1e-12), same
    distinct = ["tis", "grpo", "dr_grpo", "gspo", "clip"]
    for i, a in enumerate(distinct):
        for b in distinct[i + 1:]:
            assert not torch.allclose(grads[a], grads[b], atol=1e-6), (a, b)


def test_gspo_against_the_papers_formula():
    """GSPO (arXiv 2507.18071, eq. 5-7) with the behaviour policy as pi_old: J = 1/G sum_i
    min(s_i A_i, clip(s_i, 1-eps_lo, 1+eps_hi) A_i), s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|).
    echo2 splits s_i into the ratio to the proximal policy (1 in value) times the weight
    min(s_i^old, C): equal in value while s_i^old <= C, and in gradient d s_i = s_i mean_t d log pi."""
    x = _tensors(3)
    x["behav"] = x["logp"] + (x["behav"] - x["logp"]) * 0.1  # within the clip: nothing truncated
    logp = x["logp"].clone().requires_grad_(True)
    log_s = ((logp - x["behav"]) * x["mask"]).sum(-1) / x["mask"].sum(-1)
    s = torch.exp(log_s)
    paper = -torch.minimum(s * x["adv"], s.clamp(0.8, 1.28) * x["adv"]).mean()
    (paper_grad,) = torch.autograd.grad(paper, logp)
    ours, ours_grad = _echo2("gspo", x, 0.0)
    assert ours == pytest.approx(float(paper.detach()), abs=1e-9)
    # the paper's clip zeroes gradients outside the trust region; inside it they agree
    inside = ((s > 0.8) & (s < 1.28)).detach()
    assert inside.any()
    assert torch.allclose(ours_grad[inside], paper_grad[inside], atol=1e-9)


@pytest.mark.parametrize("scale", ["group", "batch", "none"])
def test_advantage_scaling_against_trls_formula(scale):
    """TRL (_generate_and_score_completions): A = r - mean_group, divided by std_group + eps
    ("group"), std of the batch + eps ("batch"), or nothing; std unbiased."""
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 0.5, 0.0, 0.25], dtype=torch.float64)
    groups = torch.arange(3).repeat_interleave(3)
    eps = 1e-4
    centred = rewards - rewards.view(-1, 3).mean(1).repeat_interleave(3)
    if scale == "group":
        expected = centred / (rewards.view(-1, 3).std(1).repeat_interleave(3) + eps)
    elif scale == "batch":
        expected = centred / (rewards.std() + eps)
    else:
        expected = centred
    got = group_advantages(rewards, groups, eps=eps, scale=scale)
    assert torch.allclose(got, expected, atol=1e-12)
    assert (got[3:6] == 0).all()  # the zero-variance group teaches nothing under every scaling


def test_dr_grpo_defaults_to_unscaled_advantages_and_a_constant_normaliser():
    assert GRPOConfig(loss="dr_grpo").advantage_scale == "none"
    assert GRPOConfig(loss="dr_grpo", advantage_scaling="group").advantage_scale == "group"
    assert GRPOConfig().advantage_scale == "group"
    weights = sequence_weights("dr_grpo", torch.tensor([3.0, 9.0]), max_new_tokens=8)
    assert torch.allclose(weights, torch.full((2,), 1 / (2 * 9.0), dtype=torch.float64))  # longer than 8: 9
    assert math.isclose(float(sequence_weights("grpo", torch.tensor([2.0, 4.0]))[1]), 1 / 8)

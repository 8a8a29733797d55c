"""Each named objective (grpo.loss) against the implementation users trust: TRL's GRPOTrainer
loss (`GRPOTrainer._compute_loss`, trl 1.16.0) on the same tensors, in fp64: the current
policy's log-probs, the behaviour (sampling) log-probs, advantages, a reference policy, and
completion masks of uneven lengths. Loss and gradient must agree within 1e-6.

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


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1.0] * n + [0.0] * (T - n) for n in LENGTHS], dtype=torch.float64)
    logp = -torch.rand(B, T, generator=gen, dtype=torch.float64) * 3 - 0.05
    # behaviour log-probs up to 1.5 nats away: ratios from 0.2 to 4.5, past both clips and the cap
    behav = logp + (torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.5) * 3.0
    ref = logp + (torch.rand(B, T, generator=gen, dtype=torch.float64) - 0.5) * 0.5
    adv = torch.randn(B, generator=gen, dtype=torch.float64)
    return {"logp": logp, "behav": behav, "ref": ref, "adv": adv, "mask": mask}


def _echo2(objective: str, x: dict, kl_coef: float) -> tuple[float, torch.Tensor]:
    cfg = GRPOConfig(loss=objective, kl_coef=kl_coef, **CFG)
    logp = x["logp"].clone().requires_grad_(True)
    weights = sequence_weights(objective, x["mask"].sum(-1), max_new_tokens=T)
    out = grpo_loss(logp, x["behav"], x["adv"], x["mask"], cfg=cfg, ref_logp_BT=x["ref"] if kl_coef else None,
                    token_weight=weights[:, None].expand(B, T))
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


def _trl(objective: str, x: dict, kl_coef: float, tmp_path) -> tuple[float, torch.Tensor]:
    logp = x["logp"].clone().requires_grad_(True)
    trainer = _trl_trainer(objective, logp, kl_coef, tmp_path)
    prox = x["logp"]  # the policy before the update, as TRL's old_per_token_logps
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
    """The truncated weight min(pi_prox / pi_b, C): per token, or for gspo per sequence, from
    the geometric mean over the completion's tokens (the paper's length normalisation)."""
    log_w = prox - x["behav"]
    if objective == "gspo":
        log_w = ((log_w * x["mask"]).sum(-1) / x["mask"].sum(-1)).unsqueeze(-1)
    return torch.exp(log_w).clamp(max=CFG["tis_cap"])


@pytest.mark.parametrize("objective", OBJECTIVES)
@pytest.mark.parametrize("kl_coef", [0.0, 0.1])
def test_each_objective_equals_trl_in_loss_and_gradient(objective, kl_coef, tmp_path):
    for seed in range(3):
        x = _tensors(seed)
        ours, ours_grad = _echo2(objective, x, kl_coef)
        theirs, theirs_grad = _trl(objective, x, kl_coef, tmp_path)
        assert ours == pytest.approx(theirs, abs=1e-6, rel=0), (objective, seed)
        assert torch.allclose(ours_grad, theirs_grad, atol=1e-6, rtol=0), (objective, seed, ours_grad - theirs_grad)
        assert ours_grad.abs().sum() > 0  # the comparison is not between two zeros
        assert (ours_grad[x["mask"] == 0] == 0).all()  # padding carries nothing


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

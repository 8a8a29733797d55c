"""GRPO advantages and loss against small, loop-based reference implementations."""

from __future__ import annotations

import math

import pytest
import torch

from echo2.config.run import GRPOConfig
from echo2.learner.grpo import MAX_LOG_RATIO, group_advantages, grpo_loss, reduce_stats


def test_group_advantages_hand_computed():
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0, 1.0, 1.0])
    groups = torch.tensor([0, 0, 0, 0, 1, 1])
    adv = group_advantages(rewards, groups, eps=0.0)
    # group 0: mean 0.25, unbiased std sqrt(0.25) = 0.5
    assert adv[:4].tolist() == pytest.approx([1.5, -0.5, -0.5, -0.5])
    # group 1: all equal -> no signal
    assert adv[4:].tolist() == [0.0, 0.0]


def _reference_loss(logp, behav, adv, mask, cfg: GRPOConfig) -> float:
    """Per-token loop, written from the formulas in the docstring of grpo_loss."""
    total, count = 0.0, 0
    for b in range(logp.shape[0]):
        for t in range(logp.shape[1]):
            if mask[b, t] == 0:
                continue
            a = float(adv[b])
            if cfg.loss == "clip":
                r = math.exp(float(logp[b, t] - behav[b, t]))
                obj = min(r * a, min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high) * a)
                if a < 0:
                    obj = max(obj, cfg.tis_cap * a)
            else:
                w = min(math.exp(float(logp[b, t] - behav[b, t])), cfg.tis_cap)
                obj = w * a  # proximal ratio is exactly 1
            total += -obj
            count += 1
    return total / count


@pytest.mark.parametrize("mode", ["clip", "tis"])
def test_loss_matches_reference(mode):
    gen = torch.Generator().manual_seed(0)
    logp = -torch.rand(5, 7, generator=gen) * 3
    behav = logp + torch.randn(5, 7, generator=gen) * 0.8  # stale behaviour policy: ratios far from 1
    adv = torch.randn(5, generator=gen)
    mask = (torch.rand(5, 7, generator=gen) > 0.3).float()
    cfg = GRPOConfig(loss=mode, tis_cap=2.0)
    out = grpo_loss(logp, behav, adv, mask, cfg=cfg)
    assert float(out.loss) == pytest.approx(_reference_loss(logp, behav, adv, mask, cfg), rel=1e-5)


def test_clip_gradient_is_zero_outside_trust_region_and_bounded_by_cap():
    cfg = GRPOConfig(loss="clip", clip_low=0.2, clip_high=0.2, tis_cap=2.0)
    # token 0: ratio 1.5 with positive advantage -> clipped, no gradient
    # token 1: ratio 10 with negative advantage -> dual clip, no gradient beyond the cap
    # token 2: ratio 1.0 -> plain policy gradient -A
    behav = torch.tensor([[math.log(1 / 1.5), math.log(0.1), 0.0]])
    for adv_value, token, expected in [(1.0, 0, 0.0), (-1.0, 1, 0.0), (1.0, 2, -1.0 / 3)]:
        logp = torch.zeros(1, 3, requires_grad=True)
        mask = torch.zeros(1, 3)
        mask[0, token] = 1.0
        grpo_loss(logp, behav, torch.tensor([adv_value]), mask, cfg=cfg).loss.backward()
        assert float(logp.grad[0, token]) == pytest.approx(expected * 3 if token == 2 else expected)


def test_tis_weight_truncated():
    cfg = GRPOConfig(loss="tis", tis_cap=2.0)
    logp = torch.zeros(1, 1, requires_grad=True)
    behav = torch.tensor([[math.log(0.01)]])  # importance weight 100 -> truncated to 2
    grpo_loss(logp, behav, torch.tensor([1.0]), torch.ones(1, 1), cfg=cfg).loss.backward()
    assert float(logp.grad) == pytest.approx(-2.0)


def test_on_policy_metrics_and_kl_penalty():
    logp = torch.full((2, 3), -1.0)
    out = grpo_loss(logp, logp.clone(), torch.tensor([1.0, -1.0]), torch.ones(2, 3), cfg=GRPOConfig())
    metrics = reduce_stats([out.sums])
    assert metrics["mismatch_kl"] == pytest.approx(0.0)
    assert metrics["clip_frac"] == 0.0
    assert metrics["log_ratio_outliers"] == 0
    ref = logp - 0.5
    with_kl = grpo_loss(logp, logp.clone(), torch.zeros(2), torch.ones(2, 3), cfg=GRPOConfig(kl_coef=0.1),
                        ref_logp_BT=ref)
    assert float(with_kl.loss) == pytest.approx(0.1 * (math.exp(-0.5) - 1 + 0.5), rel=1e-6)


@pytest.mark.parametrize("mode", ["clip", "tis"])
@pytest.mark.parametrize("behaviour", [-100.0, -1e4])
def test_fabricated_behaviour_logprob_is_left_out_and_gradients_stay_finite(mode, behaviour):
    """A behaviour log-prob no sampler produces (the current policy gives the token about e^-1)
    overflowed exp() before the clamp; now its token drops out of the loss and is counted."""
    cfg = GRPOConfig(loss=mode)
    logp = torch.full((2, 3), -1.0, requires_grad=True)
    behav = torch.full((2, 3), -1.2)
    behav[0, 1] = behaviour
    out = grpo_loss(logp, behav, torch.tensor([1.0, -1.0]), torch.ones(2, 3), cfg=cfg)
    out.loss.backward()
    assert torch.isfinite(out.loss) and torch.isfinite(logp.grad).all()
    assert float(logp.grad[0, 1]) == 0.0  # the fabricated token pushes nothing
    assert reduce_stats([out.sums])["log_ratio_outliers"] == 1
    honest = grpo_loss(logp.detach()[1:], behav[1:], torch.tensor([-1.0]), torch.ones(1, 3), cfg=cfg,
                       num_tokens=6)
    # the other tokens are unaffected: row 1's share of the loss is what it is alone
    assert float(out.loss.detach()) == pytest.approx(float(honest.loss) + float(
        grpo_loss(logp.detach()[:1, [0, 2]], behav[:1, [0, 2]], torch.tensor([1.0]), torch.ones(1, 2),
                  cfg=cfg, num_tokens=6).loss), rel=1e-6)
    assert MAX_LOG_RATIO < abs(behaviour) - 1


def test_loss_normaliser_makes_parts_add_up():
    """Token-sum / num_tokens: the losses of row subsets normalised by the whole batch's token
    count add up to the whole batch's loss (what gradient accumulation relies on)."""
    gen = torch.Generator().manual_seed(1)
    logp = -torch.rand(6, 4, generator=gen)
    behav = logp + torch.randn(6, 4, generator=gen) * 0.3
    adv = torch.randn(6, generator=gen)
    mask = (torch.rand(6, 4, generator=gen) > 0.2).float()
    whole = grpo_loss(logp, behav, adv, mask, cfg=GRPOConfig())
    total = float(mask.sum())
    parts = [grpo_loss(logp[s], behav[s], adv[s], mask[s], cfg=GRPOConfig(), num_tokens=total)
             for s in (slice(0, 2), slice(2, 6))]
    assert float(whole.loss) == pytest.approx(sum(float(p.loss) for p in parts), rel=1e-6)
    merged = reduce_stats([p.sums for p in parts])
    assert merged == pytest.approx(reduce_stats([whole.sums]), rel=1e-6)

"""Each objective through the learner's real step (`train_step`: the flat token layout, shared
prompts or padded rows, micro-batches) against the paper's formula written out completion by
completion, one unpadded forward each: loss and gradients. tests/unit/test_objectives_trl.py
checks the tensor functions against TRL on [B, T] tensors; this checks the path the learner
takes, where a completion's tokens are found by their sample index (gspo's sequence ratio)."""

from __future__ import annotations

import pytest
import torch
from tests.unit.test_micro_batching import uneven_batch

from echo2.config.run import GRPOConfig
from echo2.learner.step import train_step
from echo2.models.loading import load_model

TEMPERATURE = 0.9


def _advantages(group, scale: str) -> torch.Tensor:
    rewards = torch.tensor(group.rewards)
    centred = rewards - rewards.mean()
    if scale == "none":
        return centred
    std = rewards.std()
    return centred / (std + 1e-6) if std > 0 else torch.zeros_like(rewards)


def _completion_term(logp: torch.Tensor, behav: torch.Tensor, adv: float, cfg: GRPOConfig) -> torch.Tensor:
    """Per token (or, for gspo, the completion's one) term to maximise."""
    prox = logp.detach()
    if cfg.loss == "gspo":  # sequence ratio and weight: geometric means over the completion
        s = torch.exp((logp - prox).mean())
        w = torch.exp((prox - behav).mean()).clamp(max=cfg.tis_cap)
        return (w * torch.minimum(s * adv, s.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv))[None]
    if cfg.loss == "cispo":
        return torch.exp(logp - behav).clamp(max=cfg.tis_cap).detach() * adv * logp
    r, w = torch.exp(logp - prox), torch.exp(prox - behav).clamp(max=cfg.tis_cap)
    return w * torch.minimum(r * adv, r.clamp(1 - cfg.clip_low, 1 + cfg.clip_high) * adv)


def reference_loss(model, groups, cfg: GRPOConfig) -> torch.Tensor:
    per_completion, all_tokens, longest = [], 0, 0
    for group in groups:
        for c, adv in zip(group.completions, _advantages(group, cfg.advantage_scale), strict=True):
            row = torch.tensor([group.prompt_ids + c.token_ids])
            logits = model(input_ids=row).logits[0].float() / TEMPERATURE
            start = len(group.prompt_ids)
            lp_all = torch.log_softmax(logits[start - 1: start - 1 + len(c.token_ids)], dim=-1)
            logp = lp_all.gather(-1, torch.tensor(c.token_ids)[:, None]).squeeze(-1)
            per_completion.append((_completion_term(logp, torch.tensor(c.logprobs), float(adv), cfg), len(c.token_ids)))
            all_tokens += len(c.token_ids)
            longest = max(longest, len(c.token_ids))
    B = len(per_completion)
    if cfg.loss in ("grpo", "gspo"):  # mean over each completion's tokens, then over completions
        return -sum(t.mean() for t, _ in per_completion) / B
    if cfg.loss == "dr_grpo":
        return -sum(t.sum() for t, _ in per_completion) / (B * longest)
    return -sum(t.sum() for t, _ in per_completion) / all_tokens


@pytest.mark.parametrize("share_prompts", [True, False])
@pytest.mark.parametrize("loss", ["gspo", "grpo", "dr_grpo", "tis", "cispo"])
def test_the_step_equals_the_objectives_formula(tiny_model_dir, loss, share_prompts):
    groups = uneven_batch(vocab=99, seed=5)  # behaviour log-probs far from the model's: weights capped
    cfg = GRPOConfig(loss=loss, micro_batch_tokens=60, share_prompts=share_prompts, logprob_chunk_tokens=7)
    torch.manual_seed(0)
    reference = load_model(str(tiny_model_dir))
    expected = reference_loss(reference, groups, cfg)
    expected.backward()
    model = load_model(str(tiny_model_dir))
    grads = {}
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
             for n, p in model.named_parameters()]
    stats = train_step(model, torch.optim.SGD(model.parameters(), lr=0.0), groups, step=1, cfg=cfg,
                       temperature=TEMPERATURE, pad_id=0)
    for hook in hooks:
        hook.remove()
    assert stats["micro_batches"] > 1 and (stats["layout"] == "shared") == share_prompts
    assert stats["loss"] == pytest.approx(float(expected.detach()), rel=1e-5, abs=1e-6)
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)

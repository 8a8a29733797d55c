"""Multi-turn transcripts in the learner: only the model's segments are trained. The step's
loss and gradients equal a plain reference computed over the model's tokens alone, whatever the
environment's tokens claim as log-probs, and the rollout audit looks at the model's tokens only."""

from __future__ import annotations

import random

import pytest
import torch
from tests.unit.test_micro_batching import _step

from echo2.config.run import GRPOConfig
from echo2.learner.batching import flatten, loss_mask
from echo2.models.loading import load_model
from echo2.protocol.messages import RolloutCompletion, TrainGroup

TEMPERATURE = 0.9


def multi_turn_batch(seed: int = 0, groups: int = 3, group_size: int = 4, env_logprob: float = 0.0):
    """Transcripts of 1-3 actions with environment answers between them."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(4, 99) for _ in range(rng.randint(3, 8))]
        completions = []
        for _ in range(group_size):
            segments = [rng.randint(1, 3)]
            for _ in range(rng.randint(0, 2)):
                segments += [rng.randint(2, 6), rng.randint(1, 3)]
            ids, logprobs = [], []
            for index, length in enumerate(segments):
                ids += [rng.randrange(4, 99) for _ in range(length)]
                logprobs += [env_logprob] * length if index % 2 else [-rng.random() * 3 - 0.2 for _ in range(length)]
            completions.append(RolloutCompletion(token_ids=ids, logprobs=logprobs, segments=segments))
        out.append(TrainGroup(lease_id=f"g{g}", prompt_index=g, prompt_ids=prompt, version=1, worker_id="w",
                              rewards=[rng.choice([-1.0, -0.5, 0.5, 1.0]) for _ in range(group_size)],
                              completions=completions))
    return out


def reference_loss(model, groups: list[TrainGroup], cfg: GRPOConfig) -> torch.Tensor:
    """The clipped GRPO loss written out sample by sample: one unpadded forward per transcript,
    log-probs at the model's tokens only, the mean over the batch's model tokens."""
    terms, count = [], 0
    for group in groups:
        rewards = torch.tensor(group.rewards)
        advantages = (rewards - rewards.mean()) / (rewards.std() + 1e-6)
        for completion, adv in zip(group.completions, advantages, strict=True):
            row = torch.tensor([group.prompt_ids + completion.token_ids])
            logp = torch.log_softmax(model(input_ids=row).logits[0].float() / TEMPERATURE, dim=-1)
            start = len(group.prompt_ids)
            for j, (token, behav, trained) in enumerate(zip(completion.token_ids, completion.logprobs,
                                                            loss_mask(completion), strict=True)):
                if not trained:
                    continue
                ratio = torch.exp(logp[start + j - 1, token] - behav)
                clipped = torch.clamp(ratio, 1 - cfg.clip_low, 1 + cfg.clip_high)
                objective = torch.minimum(ratio * adv, clipped * adv)
                if adv < 0:
                    objective = torch.maximum(objective, cfg.tis_cap * adv)
                terms.append(-objective)
                count += 1
    return torch.stack(terms).sum() / count


def test_the_loss_mask_follows_the_segments():
    c = RolloutCompletion(token_ids=list(range(9)), logprobs=[0.0] * 9, segments=[2, 3, 1, 2, 1])
    assert loss_mask(c) == [1, 1, 0, 0, 0, 1, 0, 0, 1]
    assert loss_mask(RolloutCompletion(token_ids=[5, 6], logprobs=[-1.0, -1.0])) == [1.0, 1.0]
    samples = flatten(multi_turn_batch())
    assert all(len(m) == len(c) for m, c in zip(samples.loss_masks, samples.completions, strict=True))


@pytest.mark.parametrize("budget", [0, 40])
def test_a_masked_step_equals_the_reference(tiny_model_dir, budget):
    groups = multi_turn_batch()
    torch.manual_seed(0)
    reference = load_model(str(tiny_model_dir))
    loss = reference_loss(reference, groups, GRPOConfig())
    loss.backward()
    _, grads, stats = _step(tiny_model_dir, groups, budget=budget)
    # the step under test runs at temperature 0.9 with the default clip settings, as the reference
    assert stats["loss"] == pytest.approx(float(loss.detach()), rel=1e-5, abs=1e-6)
    model_tokens = sum(sum(loss_mask(c)) for g in groups for c in g.completions)
    assert stats["tokens"] == model_tokens < sum(len(c.token_ids) for g in groups for c in g.completions)
    assert stats["log_ratio_outliers"] == 0  # the environment's 0.0 log-probs are not counted
    for name, p in reference.named_parameters():
        torch.testing.assert_close(grads[name], p.grad, atol=1e-5, rtol=1e-4, msg=name)


def test_environment_log_probs_change_nothing(tiny_model_dir):
    _, honest, honest_stats = _step(tiny_model_dir, multi_turn_batch(env_logprob=0.0), budget=0)
    _, odd, odd_stats = _step(tiny_model_dir, multi_turn_batch(env_logprob=-45.0), budget=0)
    for name, grad in honest.items():
        torch.testing.assert_close(odd[name], grad, atol=0, rtol=0, msg=name)
    for key in ("loss", "tokens", "mismatch_kl", "clip_frac", "entropy", "group_abs_diff"):
        assert odd_stats[key] == honest_stats[key], key


def test_the_audit_measures_the_model_tokens_only(tiny_model_dir):
    groups = multi_turn_batch()
    _, _, stats = _step(tiny_model_dir, groups, budget=0)
    model = load_model(str(tiny_model_dir))
    expected = []
    with torch.no_grad():
        for group in groups:
            diffs = []
            for c in group.completions:
                row = torch.tensor([group.prompt_ids + c.token_ids])
                logp = torch.log_softmax(model(input_ids=row).logits[0].float() / TEMPERATURE, dim=-1)
                start = len(group.prompt_ids)
                diffs += [abs(float(logp[start + j - 1, t]) - b) for j, (t, b, m) in
                          enumerate(zip(c.token_ids, c.logprobs, loss_mask(c), strict=True)) if m]
            expected.append(sum(diffs) / len(diffs))
    assert stats["group_abs_diff"] == pytest.approx(expected, rel=1e-4)

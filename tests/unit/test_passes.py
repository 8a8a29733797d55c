"""The learner's pass layouts (learner.passes): a group's prompt computed once with its
completions on its cache ("shared"), rows packed without padding ("packed") and right-padded
rows ("padded") give the same token log-probs and the same gradients, in fp64 to round-off;
plans cover every sample within the budget; the layout follows what the model allows."""

from __future__ import annotations

import types

import pytest
import torch
from tests.unit.test_micro_batching import uneven_batch

from echo2.config.run import GRPOConfig
from echo2.learner.audit import recompute_mean_abs_diff
from echo2.learner.batching import flatten
from echo2.learner.logprobs import token_logprobs
from echo2.learner.passes import (
    LAYOUTS,
    build_pass,
    choose_layout,
    plan_passes,
    plan_shared,
    processed_tokens,
)
from echo2.models.loading import enable_activation_checkpointing, load_model
from echo2.models.weights import unique_tensors


def _logprobs_and_grads(model, samples, layout: str, budget: int):
    model.zero_grad(set_to_none=True)
    weights = torch.linspace(0.5, 1.5, sum(len(c) for c in samples.completions), dtype=torch.float64)
    logp = torch.zeros(len(weights), dtype=torch.float64)
    offsets = [0]
    for completion in samples.completions:
        offsets.append(offsets[-1] + len(completion))
    for indices in plan_passes(samples, budget, layout):
        mb = build_pass(samples, indices, 0, layout)
        logp_N, _ = token_logprobs(model, mb, 0.8, chunk_tokens=5)
        where = torch.cat([torch.arange(offsets[i], offsets[i + 1]) for i in indices])
        (logp_N * weights[where]).sum().backward()
        logp[where] = logp_N.detach()
    return logp, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _exact_norm(self, x):
    return self.weight * x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon)


@pytest.fixture(scope="module")
def fp64_model(tiny_model_dir):
    """The tiny model in fp64 throughout: transformers' RMSNorm computes in fp32 whatever the
    model's dtype, which would round the shared path's summed prompt gradients (and not the
    padded path's per-row ones) at fp32 precision; here it keeps the input's dtype."""
    model = load_model(str(tiny_model_dir), dtype="float64").train()
    for module in model.modules():
        if type(module).__name__.endswith("RMSNorm"):
            module.forward = types.MethodType(_exact_norm, module)
    return model


@pytest.mark.parametrize("budget", [0, 1, 40])
def test_every_layout_gives_the_padded_logprobs_and_gradients_in_fp64(fp64_model, budget):
    samples = flatten(uneven_batch(vocab=99, groups=5, group_size=4, seed=11))
    reference, reference_grads = _logprobs_and_grads(fp64_model, samples, "padded", budget=0)
    for layout in ("shared", "packed"):
        logp, grads = _logprobs_and_grads(fp64_model, samples, layout, budget)
        torch.testing.assert_close(logp, reference, atol=1e-12, rtol=0, msg=f"{layout} at budget {budget}")
        assert grads.keys() == reference_grads.keys()
        for name, grad in reference_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-11, rtol=1e-10, msg=f"{layout} {name} ({budget})")


def test_the_shared_prompt_is_computed_once_per_group(fp64_model):
    groups = uneven_batch(vocab=99, groups=3, group_size=4, seed=2)
    samples = flatten(groups)
    (indices,) = plan_passes(samples, 0, "shared")
    mb = build_pass(samples, indices, 0, "shared")
    assert mb.prefix_ids_PL.shape[0] == 3 and mb.input_ids_CL.shape[0] == 12
    prompt, completion = processed_tokens(mb, [])
    assert prompt == sum(len(g.prompt_ids) - 1 for g in groups) + 12  # the last prompt token rides with each row
    assert completion == sum(len(c.token_ids) - 1 for g in groups for c in g.completions)
    padded = build_pass(samples, indices, 0, "padded")
    assert processed_tokens(padded, [len(samples.prompts[i]) for i in indices])[0] == \
        sum(len(g.prompt_ids) * 4 for g in groups)


def test_shared_plans_cover_every_sample_and_keep_groups_together_within_the_budget():
    samples = flatten(uneven_batch(vocab=99, groups=6, group_size=5, seed=4))
    for budget in (0, 1, 20, 45, 120, 10_000):
        plan = plan_shared(samples, budget)
        assert sorted(i for p in plan for i in p) == list(range(len(samples))), budget
        for indices in plan:
            groups = {samples.group_ids[i] for i in indices}
            cost = len(groups) * max(len(samples.prompts[i]) for i in indices) + \
                len(indices) * max(len(samples.completions[i]) for i in indices)
            assert cost <= budget or len(indices) == 1 or budget == 0, (budget, indices)
        # a group is split only when it does not fit: then its parts are consecutive passes
        seen = [samples.group_ids[i] for p in plan for i in p]
        assert seen == sorted(seen, key=seen.index)
    assert len(plan_shared(samples, 0)) == 1


def test_the_layout_follows_what_the_model_allows(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    assert choose_layout(model) == "shared"
    assert choose_layout(model, share_prompts=False) == "packed"
    assert choose_layout(model, sharded=True) == "packed"
    enable_activation_checkpointing(model)  # transformers drops the cache under it while training
    assert choose_layout(model) == "packed"
    assert set(LAYOUTS) == {"shared", "packed", "padded"}


def test_the_audit_recomputes_the_same_differences_in_every_layout(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    groups = uneven_batch(vocab=99, groups=4, group_size=3, seed=8)
    state = {name: t.detach().clone() for name, t in unique_tensors(model).items()}
    shared = recompute_mean_abs_diff(model, state, groups, grpo=GRPOConfig(micro_batch_tokens=30),
                                     temperature=0.9, pad_id=0)
    packed = recompute_mean_abs_diff(model, state, groups,
                                     grpo=GRPOConfig(micro_batch_tokens=30, share_prompts=False),
                                     temperature=0.9, pad_id=0)
    assert shared == pytest.approx(packed, abs=1e-5)
    assert all(d > 0.1 for d in shared)  # random behaviour log-probs are far from the model's

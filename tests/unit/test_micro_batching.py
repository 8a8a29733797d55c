"""Micro-batching is an implementation detail of one step: for any token budget (and with
gradient checkpointing, and through the chunked LM head) the gradients and the updated weights
equal those of the whole batch in one pass."""

from __future__ import annotations

import copy
import random

import pytest
import torch

from echo2.config.run import GRPOConfig
from echo2.learner.batching import flatten, plan_micro_batches
from echo2.learner.logprobs import collate, head_logprobs, logits_logprobs, token_logprobs
from echo2.learner.precision import Precision
from echo2.learner.step import train_step
from echo2.models.loading import enable_activation_checkpointing, load_model
from echo2.protocol.messages import RolloutCompletion, TrainGroup


def uneven_batch(vocab: int, groups: int = 4, group_size: int = 4, seed: int = 0) -> list[TrainGroup]:
    """Prompts of 2-9 tokens and completions of 1-12: rows of very different lengths."""
    rng = random.Random(seed)
    out = []
    for g in range(groups):
        prompt = [rng.randrange(4, vocab) for _ in range(rng.randint(2, 9))]
        completions = []
        for _ in range(group_size):
            ids = [rng.randrange(4, vocab) for _ in range(rng.randint(1, 12))]
            completions.append(RolloutCompletion(token_ids=ids, logprobs=[-rng.random() * 4 - 0.5 for _ in ids]))
        out.append(TrainGroup(lease_id=f"g{g}", prompt_index=g, prompt_ids=prompt, version=0, worker_id="w",
                              rewards=[float(rng.random() > 0.5) for _ in range(group_size)], completions=completions))
    return out


def _step(model_dir, groups, budget: int, checkpointing: bool = False, loss: str = "clip", **grpo):
    torch.manual_seed(0)
    model = load_model(str(model_dir))
    if checkpointing:
        enable_activation_checkpointing(model)
    calls = []
    # an early submodule: the recompute stops once the last saved tensor is rebuilt
    model.model.layers[0].self_attn.q_proj.register_forward_hook(lambda *_: calls.append(1))
    # SGD, whose update is linear in the gradient: AdamW's first update is about lr * sign(g),
    # which turns round-off in a near-zero gradient into a full-size difference in the weights
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    grads: dict[str, torch.Tensor] = {}
    # the step clears gradients after applying them: keep a copy as the optimizer reads them
    hooks = [p.register_post_accumulate_grad_hook(lambda p, n=n: grads.__setitem__(n, p.grad.clone()))
             for n, p in model.named_parameters()]
    stats = train_step(model, optimizer, groups, step=1,
                       cfg=GRPOConfig(micro_batch_tokens=budget, loss=loss, logprob_chunk_tokens=7, **grpo),
                       temperature=0.9, pad_id=0)
    for hook in hooks:
        hook.remove()
    # one forward per micro-batch (two when prompts are shared: the prompts, then the completions),
    # and one more (the recompute) per micro-batch when checkpointing
    forwards = 2 if stats["layout"] == "shared" else 1
    assert len(calls) == stats["micro_batches"] * (2 if checkpointing else forwards)
    return model, grads, stats


# the objectives whose weights differ (per token, per completion, by a constant, per sequence)
@pytest.mark.parametrize("loss", ["clip", "tis", "grpo", "dr_grpo", "gspo", "cispo"])
def test_micro_batched_step_equals_full_batch_step(tiny_model_dir, loss):
    groups = uneven_batch(vocab=99)
    full_model, full_grads, full_stats = _step(tiny_model_dir, groups, budget=0, loss=loss)
    assert full_stats["micro_batches"] == 1 and not full_stats["skipped"]
    for budget in (1, 24, 60, 200):
        model, grads, stats = _step(tiny_model_dir, groups, budget=budget, loss=loss)
        assert stats["micro_batches"] > 1, budget
        for name, grad in full_grads.items():
            torch.testing.assert_close(grads[name], grad, atol=1e-5, rtol=1e-4, msg=f"{name} at budget {budget}")
        for (name, a), (_, b) in zip(full_model.state_dict().items(), model.state_dict().items(), strict=True):
            torch.testing.assert_close(b, a, atol=1e-5, rtol=0, msg=f"{name} at budget {budget}")
        assert stats["loss"] == pytest.approx(full_stats["loss"], abs=1e-6)
        for key in ("mismatch_kl", "clip_frac", "entropy", "tokens"):
            assert stats[key] == pytest.approx(full_stats[key], rel=1e-5), key


def test_gradient_checkpointing_gives_the_same_step(tiny_model_dir):
    groups = uneven_batch(vocab=99, seed=3)
    plain, plain_grads, _ = _step(tiny_model_dir, groups, budget=50)
    ckpt, ckpt_grads, _ = _step(tiny_model_dir, groups, budget=50, checkpointing=True)
    for name, grad in plain_grads.items():
        torch.testing.assert_close(ckpt_grads[name], grad, atol=1e-6, rtol=1e-5, msg=name)


def test_micro_batches_respect_the_budget_and_cover_every_sample():
    lengths = [5, 30, 7, 7, 12, 1, 29, 3]
    for budget in (1, 10, 30, 60, 1000):
        plan = plan_micro_batches(lengths, budget)
        assert sorted(i for mb in plan for i in mb) == list(range(len(lengths)))
        for mb in plan:
            padded = len(mb) * max(lengths[i] for i in mb)
            assert padded <= budget or len(mb) == 1, (budget, mb)
    assert plan_micro_batches(lengths, 0) == [sorted(range(8), key=lambda i: (-lengths[i], i))]
    # sorted by length: the two ~30-token rows share a micro-batch instead of padding short ones
    assert plan_micro_batches(lengths, 60)[0] == [1, 6]


def test_chunked_head_matches_full_logits_in_value_and_gradient():
    torch.manual_seed(0)
    hidden = torch.randn(23, 16, requires_grad=True)
    weight = torch.randn(50, 16, requires_grad=True)
    targets = torch.randint(0, 50, (23,))
    upstream = torch.randn(23)
    lean, lean_entropy = head_logprobs(hidden, weight, targets, temperature=0.7, chunk_tokens=5)
    (lean * upstream).sum().backward()
    lean_grads = hidden.grad.clone(), weight.grad.clone()
    hidden.grad = weight.grad = None
    full, full_entropy = logits_logprobs(hidden @ weight.T, targets, 0.7, chunk_tokens=1000)
    (full * upstream).sum().backward()
    torch.testing.assert_close(lean, full)
    torch.testing.assert_close(lean_entropy, full_entropy)
    torch.testing.assert_close(lean_grads[0], hidden.grad)
    torch.testing.assert_close(lean_grads[1], weight.grad)


def test_lean_path_matches_the_models_own_logits(tiny_model_dir):
    model = load_model(str(tiny_model_dir))
    groups = uneven_batch(vocab=99, seed=5)
    samples = flatten(groups)
    mb = collate(samples.prompts, samples.completions, list(range(len(samples))), 0)
    lean, _ = token_logprobs(model, mb, 1.0, chunk_tokens=9)
    logits = model(input_ids=mb.input_ids_BL, attention_mask=mb.attention_mask_BL).logits
    reference = torch.log_softmax(logits.float(), -1)[mb.rows_N, mb.cols_N].gather(1, mb.targets_N[:, None]).squeeze(1)
    torch.testing.assert_close(lean, reference, atol=1e-5, rtol=1e-5)


def test_bf16_mixed_step_runs_under_autocast_and_keeps_fp32_masters(tiny_model_dir):
    groups = uneven_batch(vocab=99, seed=7)
    model = load_model(str(tiny_model_dir))
    before = copy.deepcopy(model.state_dict())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    precision = Precision(torch.device("cpu"), torch.bfloat16)
    stats = train_step(model, optimizer, groups, step=1, cfg=GRPOConfig(micro_batch_tokens=40),
                       temperature=1.0, pad_id=0, precision=precision)
    assert not stats["skipped"] and stats["micro_batches"] > 1
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert all(s["exp_avg"].dtype == torch.float32 for s in optimizer.state.values())
    changed = [n for n, t in model.state_dict().items() if not torch.equal(t, before[n])]
    assert changed
    _, _, fp32_stats = _step(tiny_model_dir, groups, budget=40, loss="tis")  # the same objective, in fp32
    # bf16 matrix products: the same step to about two significant digits
    assert stats["loss"] == pytest.approx(fp32_stats["loss"], abs=0.05)


@pytest.mark.parametrize("loss", ["tis", "grpo", "dr_grpo"])
def test_a_zero_variance_group_trains_identically_to_the_batch_without_it(tiny_model_dir, loss):
    """With grpo.drop_uninformative_groups (default) a group whose rewards are all equal counts
    in no normaliser (tokens, completions) and no batch std: the step on the batch with it
    equals the step without it. With the setting off it dilutes the step, as before."""
    groups = uneven_batch(vocab=99)
    flat = groups[1].model_copy(update={"rewards": [1.0] * len(groups[1].rewards)})
    with_flat = [groups[0], flat, *groups[2:]]
    without = [groups[0], *groups[2:]]
    scaled = {"loss": loss, "advantage_scaling": "batch"}
    model_a, grads_a, stats_a = _step(tiny_model_dir, with_flat, budget=0, **scaled)
    model_b, grads_b, _ = _step(tiny_model_dir, without, budget=0, **scaled)
    assert stats_a["uninformative_groups"] == 1 and not stats_a["skipped"]
    for name, grad in grads_b.items():
        torch.testing.assert_close(grads_a[name], grad, atol=1e-6, rtol=1e-5, msg=name)
    _, grads_off, _ = _step(tiny_model_dir, with_flat, budget=0, drop_uninformative_groups=False, **scaled)
    assert any(not torch.allclose(grads_off[n], g, atol=1e-6, rtol=1e-5) for n, g in grads_b.items())


def test_a_batch_of_only_uninformative_groups_is_a_step_that_changes_nothing(tiny_model_dir):
    """The step is taken (the run goes on: a version, an evaluation) with the weights and
    AdamW's state as they were."""
    groups = [g.model_copy(update={"rewards": [0.0] * len(g.rewards)}) for g in uneven_batch(vocab=99)]
    before = copy.deepcopy(load_model(str(tiny_model_dir)).state_dict())
    model, _, stats = _step(tiny_model_dir, groups, budget=0, loss="tis")
    assert not stats["skipped"] and not stats["updated"] and stats["uninformative_groups"] == 4
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, before[name]), name

"""The audit's check of the seeded sampler: under the version a group claims, was every token
the one the lease's seed picks? (models/sampler.py has the sampler.) A worker that chooses its
tokens and reports their true log-probs passes the log-prob comparison; here each token it chose
that the sampler would not have falls short of the sampler's choice by the Gumbel gap, typically
a nat or more, while an honest engine's tokens fall short only at near-ties, by its numeric
difference from the learner's logits.

A multi-turn group's completions are whole transcripts: only the model's actions are checked
(the environment's answers are not sampled), by the loss mask the log-prob audit uses, each
token at its index in the completion, as the worker's engine drew it.

The logits come from the learner's own passes (learner.passes): groups of one version are
checked together, each prompt computed once for its completions where the model allows it
(learner.shared_prefix: 109 instead of 424 tokens a group for G = 8 completions of 8 tokens
after a 45-token prompt), and the LM head runs on the predicting hidden states only, a chunk of
tokens at a time, so full-vocabulary scores never exist for more than one chunk."""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch.func import functional_call

from echo2.learner.batching import Samples, flatten
from echo2.learner.logprobs import lean_head_supported
from echo2.learner.passes import build_pass, choose_layout, plan_passes
from echo2.learner.precision import CPU_FP32, Precision
from echo2.learner.shared_prefix import SharedMicroBatch, shared_hidden_states
from echo2.models.sampler import shortfall
from echo2.protocol.messages import TrainGroup


class _Predicting(torch.nn.Module):
    """A pass's predicting hidden states [N, H] and the LM head's weight (or, for a model
    without a plain head, its logits [N, V] and None), as a module's forward so functional_call
    can run it under a version's weights."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, mb):
        model = self.model
        if isinstance(mb, SharedMicroBatch):
            return shared_hidden_states(model, mb), model.get_output_embeddings().weight
        if lean_head_supported(model):
            out = model.base_model(**mb.model_inputs(), use_cache=False)
            return out.last_hidden_state[mb.rows_N, mb.cols_N], model.get_output_embeddings().weight
        return model(**mb.model_inputs(), use_cache=False).logits[mb.rows_N, mb.cols_N], None


class SamplerCheck(NamedTuple):
    """One group's model tokens under one version, completions in order."""

    shortfalls: torch.Tensor
    """Each token's shortfall from the seeded sampler's choice."""
    abs_logprob_diffs: torch.Tensor
    """Each token's |log-prob under the version - behaviour log-prob| (nats): the same pass's
    logits tell which version the worker's log-probs fit (learner.version_check)."""


def groups_shortfalls(model: torch.nn.Module, state: dict[str, torch.Tensor] | None, groups: list[TrainGroup],
                      **found) -> list[torch.Tensor]:
    """Per group, (model tokens,): each token's shortfall (groups_sampler_checks)."""
    return [check.shortfalls for check in groups_sampler_checks(model, state, groups, **found)]


def groups_sampler_checks(model: torch.nn.Module, state: dict[str, torch.Tensor] | None, groups: list[TrainGroup], *,
                          temperature: float, pad_id: int, precision: Precision = CPU_FP32, share_prompts: bool = True,
                          budget_tokens: int = 16_384, chunk_tokens: int = 1024,
                          version: int | None = None) -> list[SamplerCheck]:
    """Per group, its model tokens' shortfalls from the seeded sampler's choice under `state`
    (None: the model's own weights) and their log-probs' differences from the behaviour ones;
    every group must carry its seed. `budget_tokens` and `chunk_tokens` are the learner's
    grpo.micro_batch_tokens and grpo.logprob_chunk_tokens. `version`: only the tokens that
    version sampled (`state` is its weights; None: every token)."""
    for group in groups:
        if group.sampling_seed is None:
            raise ValueError(f"group {group.lease_id} carries no sampler seed")
    samples = flatten(groups) if version is None else flatten(groups).sampled_by(version)
    layout = choose_layout(model, share_prompts)
    device = precision.device
    params = None
    if state is not None:
        dtype = next(model.parameters()).dtype
        params = {f"model.{name}": t.to(device, dtype) for name, t in state.items()}
    predicting = _Predicting(model)
    empty = SamplerCheck(torch.empty(0), torch.empty(0))
    per_sample: list[SamplerCheck] = [empty] * len(samples)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision.autocast():
            for indices in plan_passes(samples, budget_tokens, layout):
                mb = build_pass(samples, indices, pad_id, layout).to(device)
                found = predicting(mb) if params is None else functional_call(predicting, params, (mb,))
                by_sample = _pass_shortfalls(mb, *found, samples=samples, groups=groups, temperature=temperature,
                                             chunk_tokens=chunk_tokens)
                for index, values in by_sample.items():
                    per_sample[index] = values
    finally:
        model.train(was_training)
    return _by_group(samples, per_sample, len(groups))


def _pass_shortfalls(mb, found: torch.Tensor, head_weight: torch.Tensor | None, *, samples: Samples,
                     groups: list[TrainGroup], temperature: float, chunk_tokens: int) -> dict[int, torch.Tensor]:
    """{sample index: its model tokens' shortfalls} for one pass. A sample's tokens come in
    order and together in every layout, so a token's position is its index in its sample's run."""
    sample_N = mb.sample_N
    n = sample_N.shape[0]
    index_N = torch.arange(n, device=sample_N.device)
    starts = torch.ones(n, dtype=torch.bool, device=sample_N.device)
    starts[1:] = sample_N[1:] != sample_N[:-1]
    positions_N = index_N - torch.cummax(torch.where(starts, index_N, 0), dim=0).values
    first_of_group: dict[int, int] = {}
    for index, group_id in enumerate(samples.group_ids):
        first_of_group.setdefault(group_id, index)
    group_N = torch.tensor([samples.group_ids[i] for i in sample_N.tolist()], device=sample_N.device)
    in_group_N = sample_N - torch.tensor([first_of_group[g] for g in group_N.tolist()], device=sample_N.device)
    out_N = torch.empty(n, dtype=torch.float64, device=sample_N.device)
    logprob_N = torch.empty(n, dtype=torch.float64, device=sample_N.device)
    for start in range(0, n, chunk_tokens):
        part = slice(start, min(start + chunk_tokens, n))
        logits = found[part] if head_weight is None else found[part].to(head_weight.dtype) @ head_weight.T
        targets = mb.targets_N[part]
        # the behaviour log-prob's distribution: softmax(logits / T), as the engines draw (models.sampler)
        logprob_N[part] = torch.log_softmax(logits.double() / temperature, dim=-1).gather(
            -1, targets.long()[:, None]).squeeze(-1)
        for group_id in group_N[part].unique().tolist():
            rows = (group_N[part] == group_id).nonzero().squeeze(1)
            out_N[start + rows] = shortfall(logits[rows].float(), targets[rows], temperature,
                                            groups[group_id].sampling_seed, samples_N=in_group_N[part][rows],
                                            positions_N=positions_N[part][rows])
    out = {}
    for index in sample_N.unique().tolist():
        values = out_N[sample_N == index].cpu()
        model_tokens = torch.tensor(samples.loss_masks[index][: len(values)]) > 0  # the environment's: not sampled
        behaviour = torch.tensor(samples.behaviour_logprobs[index][: len(values)], dtype=torch.float64)
        diffs = (logprob_N[sample_N == index].cpu() - behaviour).abs()
        out[index] = SamplerCheck(values[model_tokens], diffs[model_tokens])
    return out


def _by_group(samples: Samples, per_sample: list[SamplerCheck], num_groups: int) -> list[SamplerCheck]:
    parts: list[list[SamplerCheck]] = [[] for _ in range(num_groups)]
    for index, group_id in enumerate(samples.group_ids):
        parts[group_id].append(per_sample[index])
    empty = torch.empty(0, dtype=torch.float64)
    return [SamplerCheck(torch.cat([c.shortfalls for c in p]) if p else empty,
                         torch.cat([c.abs_logprob_diffs for c in p]) if p else empty) for p in parts]


def group_shortfalls(model: torch.nn.Module, state: dict[str, torch.Tensor] | None, group: TrainGroup, *,
                     temperature: float, pad_id: int, precision: Precision = CPU_FP32) -> torch.Tensor:
    """One group's shortfalls (groups_shortfalls of one group)."""
    return groups_shortfalls(model, state, [group], temperature=temperature, pad_id=pad_id, precision=precision)[0]


def violations(shortfalls: torch.Tensor, margin: float) -> int:
    return int((shortfalls > margin).sum())

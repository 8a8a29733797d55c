"""The audit's check of the seeded sampler: under the version a group claims, was every token
the one the lease's seed picks? (models/sampler.py has the sampler.) A worker that chooses its
tokens and reports their true log-probs passes the log-prob comparison; here each token it chose
that the sampler would not have falls short of the sampler's choice by the Gumbel gap, typically
a nat or more, while an honest engine's tokens fall short only at near-ties, by its numeric
difference from the learner's logits.

A multi-turn group's completions are whole transcripts: only the model's actions are checked
(the environment's answers are not sampled), by the loss mask the log-prob audit uses, each
token at its index in the completion, as the worker's engine drew it."""

from __future__ import annotations

import torch
from torch.func import functional_call

from echo2.learner.batching import loss_mask
from echo2.learner.precision import CPU_FP32, Precision
from echo2.models.sampler import shortfall
from echo2.protocol.messages import TrainGroup


def group_shortfalls(model: torch.nn.Module, state: dict[str, torch.Tensor] | None, group: TrainGroup, *,
                     temperature: float, pad_id: int, precision: Precision = CPU_FP32) -> torch.Tensor:
    """(model tokens,) each of the model's completion tokens' shortfall from the seeded
    sampler's choice under `state` (None: the model's own weights), completions in order;
    the group must carry its seed."""
    if group.sampling_seed is None:
        raise ValueError(f"group {group.lease_id} carries no sampler seed")
    device = precision.device
    prompt, completions = group.prompt_ids, [c.token_ids for c in group.completions]
    width = len(prompt) + max(len(c) for c in completions)
    ids = torch.tensor([prompt + c + [pad_id] * (width - len(prompt) - len(c)) for c in completions], device=device)
    mask = torch.tensor([[1] * (len(prompt) + len(c)) + [0] * (width - len(prompt) - len(c)) for c in completions],
                        device=device)
    # (sample, position) of each token the model drew: the environment's tokens are skipped
    sampled = [(i, j) for i, c in enumerate(group.completions) for j, m in enumerate(loss_mask(c)) if m]
    rows = torch.tensor([i for i, _ in sampled], dtype=torch.long, device=device)
    positions = torch.tensor([j for _, j in sampled], dtype=torch.long, device=device)
    targets = torch.tensor([completions[i][j] for i, j in sampled], dtype=torch.long, device=device)
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad(), precision.autocast():
            inputs = {"input_ids": ids, "attention_mask": mask}
            if state is None:
                logits = model(**inputs).logits
            else:
                dtype = next(model.parameters()).dtype
                logits = functional_call(model, {k: t.to(device, dtype) for k, t in state.items()}, (), inputs).logits
    finally:
        model.train(was_training)
    # the token at position p of a completion is predicted by the output at len(prompt) + p - 1
    predicting = logits[rows, len(prompt) + positions - 1].float()
    return shortfall(predicting, targets, temperature, group.sampling_seed, samples_N=rows,
                     positions_N=positions).cpu()


def violations(shortfalls: torch.Tensor, margin: float) -> int:
    return int((shortfalls > margin).sum())

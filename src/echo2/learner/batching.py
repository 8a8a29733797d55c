"""A step's rollout groups as a flat list of samples, and the samples packed into micro-batches
by a token budget.

Sorting by length before packing keeps the rows of a micro-batch about equally long, so little
compute goes to padding; each micro-batch holds at most `budget` prompt+completion tokens,
padding included (rows x longest row), which is what its activations cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from echo2.protocol.messages import RolloutCompletion, TrainGroup


@dataclass(frozen=True)
class Samples:
    prompts: list[list[int]]
    completions: list[list[int]]
    behaviour_logprobs: list[list[float]]
    rewards: list[float]
    group_ids: list[int]
    loss_masks: list[list[float]]
    """1.0 for the model's tokens (trained), 0.0 for an environment's (context only)."""

    def __len__(self) -> int:
        return len(self.prompts)

    def length(self, index: int) -> int:
        return len(self.prompts[index]) + len(self.completions[index])

    def trained_tokens(self, index: int) -> int:
        return int(sum(self.loss_masks[index]))


def loss_mask(completion: RolloutCompletion) -> list[float]:
    """Per token: 1.0 in the model's segments (the even ones), 0.0 in the environment's; a
    completion without segments is the model's throughout."""
    if not completion.segments:
        return [1.0] * len(completion.token_ids)
    mask: list[float] = []
    for index, length in enumerate(completion.segments):
        mask += [0.0 if index % 2 else 1.0] * length
    return mask


def flatten(groups: list[TrainGroup]) -> Samples:
    prompts, completions, behav, rewards, group_ids, masks = [], [], [], [], [], []
    for gi, group in enumerate(groups):
        for completion, reward in zip(group.completions, group.rewards, strict=True):
            prompts.append(group.prompt_ids)
            completions.append(completion.token_ids)
            behav.append(completion.logprobs)
            rewards.append(reward)
            group_ids.append(gi)
            masks.append(loss_mask(completion))
    return Samples(prompts, completions, behav, rewards, group_ids, masks)


def plan_micro_batches(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Sample indices per micro-batch: longest first, each micro-batch as many rows as fit in
    `budget_tokens` padded tokens (a row longer than the budget alone). 0: one micro-batch.
    Deterministic (ties keep index order), so a resumed learner replays the same passes."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    if budget_tokens <= 0:
        return [order] if order else []
    batches: list[list[int]] = []
    current: list[int] = []
    for index in order:
        # rows arrive longest first, so the first row of a micro-batch sets its padded width
        if current and (len(current) + 1) * lengths[current[0]] > budget_tokens:
            batches.append(current)
            current = []
        current.append(index)
    if current:
        batches.append(current)
    return batches

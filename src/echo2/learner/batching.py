"""A step's rollout groups as a flat list of samples, and the samples packed into micro-batches
by a token budget.

Sorting by length before packing keeps the rows of a micro-batch about equally long, so little
compute goes to padding; each micro-batch holds at most `budget` prompt+completion tokens,
padding included (rows x longest row), which is what its activations cost.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from echo2.policy.admission import is_admissible
from echo2.protocol.messages import RolloutCompletion, TrainGroup
from echo2.protocol.token_versions import expand


@dataclass(frozen=True)
class Samples:
    prompts: list[list[int]]
    completions: list[list[int]]
    behaviour_logprobs: list[list[float]]
    rewards: list[float]
    group_ids: list[int]
    loss_masks: list[list[float]]
    """1.0 for the model's tokens (trained), 0.0 for an environment's (context only) and, given a
    step and S, for tokens older than S (`flatten`)."""
    token_versions: list[list[int]]
    """The version that sampled each completion token (`protocol.token_versions`)."""
    masked_stale: int = 0
    """The model's tokens masked out of the loss as older than S."""

    def __len__(self) -> int:
        return len(self.prompts)

    def length(self, index: int) -> int:
        return len(self.prompts[index]) + len(self.completions[index])

    def trained_tokens(self, index: int) -> int:
        return int(sum(self.loss_masks[index]))

    def sampled_by(self, version: int) -> Samples:
        """The same samples with only the tokens `version` sampled in the mask: what the audit
        checks under that version's weights (a generation that straddled versions is checked
        segment by segment, each under its own)."""
        masks = [[m if v == version else 0.0 for m, v in zip(mask, versions, strict=True)]
                 for mask, versions in zip(self.loss_masks, self.token_versions, strict=True)]
        return replace(self, loss_masks=masks)


def loss_mask(completion: RolloutCompletion) -> list[float]:
    """Per token: 1.0 in the model's segments (the even ones), 0.0 in the environment's; a
    completion without segments is the model's throughout."""
    return [1.0 if mine else 0.0 for mine in completion.model_token_mask()]


def flatten(groups: list[TrainGroup], *, step: int | None = None, max_staleness: int | None = None) -> Samples:
    """The groups' samples. Given the learner's `step` and S, a token sampled by a version v with
    step - v > S is masked out of the loss (the staleness bound per token; it stays context for
    the tokens after it), and counted in `masked_stale`."""
    prompts, completions, behav, rewards, group_ids, masks, versions = [], [], [], [], [], [], []
    masked = 0
    for gi, group in enumerate(groups):
        for completion, reward in zip(group.completions, group.rewards, strict=True):
            prompts.append(group.prompt_ids)
            completions.append(completion.token_ids)
            behav.append(completion.logprobs)
            rewards.append(reward)
            group_ids.append(gi)
            per_token = expand(completion.token_versions, len(completion.token_ids), group.version)
            mask = loss_mask(completion)
            if step is not None and max_staleness is not None:
                trained = [m if is_admissible(step, v, max_staleness) else 0.0
                           for m, v in zip(mask, per_token, strict=True)]
                masked += int(sum(mask) - sum(trained))
                mask = trained
            masks.append(mask)
            versions.append(per_token)
    return Samples(prompts, completions, behav, rewards, group_ids, masks, versions, masked)


def token_staleness(samples: Samples, step: int) -> dict[int, int]:
    """Trained tokens by staleness (step - the version that sampled them): what the step's record
    reports, where a group's staleness says only how old its oldest tokens are."""
    counts: dict[int, int] = {}
    for mask, versions in zip(samples.loss_masks, samples.token_versions, strict=True):
        for m, v in zip(mask, versions, strict=True):
            if m:
                counts[step - v] = counts.get(step - v, 0) + 1
    return dict(sorted(counts.items()))


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

"""How a step's samples become forward/backward passes, one rule for the train step and the
rollout audit. Three layouts, all giving the same log-probs and gradients (tests check it):

- "shared": each group's prompt computed once, its completions on top of the prompt's cache
  (`learner.shared_prefix`); the default wherever the model allows it;
- "packed": every row of a pass concatenated into one, positions restarting per row, no padding
  (transformers builds the block-diagonal causal mask from the positions; 5.x and later);
- "padded": right-padded rows, the layout every causal LM takes.

The budget (grpo.micro_batch_tokens) bounds the tokens one pass computes, padding included.
"""

from __future__ import annotations

import torch

from echo2.learner.batching import Samples, plan_micro_batches
from echo2.learner.logprobs import MicroBatch, collate, lean_head_supported
from echo2.learner.shared_prefix import SharedMicroBatch, collate_shared
from echo2.models.kv_cache import supports_shared_prefix

LAYOUTS = ("shared", "packed", "padded")


def choose_layout(model, share_prompts: bool = True, sharded: bool = False) -> str:
    """The cheapest layout `model` supports. A sharded model takes one forward per pass (FSDP
    gathers its weights around it), so it does not share prompts."""
    if share_prompts and not sharded and lean_head_supported(model) and supports_shared_prefix(model):
        return "shared"
    return "packed" if packing_supported(model) else "padded"


def packing_supported(model) -> bool:
    """transformers reads packed rows from their positions (no attention mask, no cache) from
    release 5 on, for every attention implementation; flash-attention kernels do it natively."""
    try:
        from transformers import masking_utils
    except ImportError:
        return False
    implementation = getattr(getattr(model, "config", None), "_attn_implementation", "")
    return hasattr(masking_utils, "find_packed_sequence_indices") or "flash" in str(implementation)


def plan_passes(samples: Samples, budget_tokens: int, layout: str) -> list[list[int]]:
    """Sample indices per pass. Deterministic, so a resumed learner replays the same passes."""
    if layout == "shared":
        return plan_shared(samples, budget_tokens)
    lengths = [samples.length(i) for i in range(len(samples))]
    if layout == "packed":
        return plan_packed(lengths, budget_tokens)
    return plan_micro_batches(lengths, budget_tokens)


def plan_packed(lengths: list[int], budget_tokens: int) -> list[list[int]]:
    """Longest first, as many rows per pass as fit in `budget_tokens` real tokens (a row longer
    than the budget alone); 0: one pass."""
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    passes: list[list[int]] = []
    current: list[int] = []
    used = 0
    for index in order:
        if current and budget_tokens > 0 and used + lengths[index] > budget_tokens:
            passes.append(current)
            current, used = [], 0
        current.append(index)
        used += lengths[index]
    return passes + [current] if current else passes


def plan_shared(samples: Samples, budget_tokens: int) -> list[list[int]]:
    """Groups whole where they fit: longest prompts first, a group's completions longest first.
    A pass costs its prompts (padded to the longest) plus its completions (padded to the
    longest); a group larger than the budget is split over passes (its prompt computed in each)."""
    members: dict[int, list[int]] = {}
    for index, group in enumerate(samples.group_ids):
        members.setdefault(group, []).append(index)
    groups = sorted(members, key=lambda g: (-len(samples.prompts[members[g][0]]),
                                            -max(len(samples.completions[i]) for i in members[g]), g))
    passes: list[list[int]] = []
    current: list[int] = []
    for group in groups:
        for index in sorted(members[group], key=lambda i: (-len(samples.completions[i]), i)):
            if current and budget_tokens > 0 and _shared_cost(samples, [*current, index]) > budget_tokens:
                passes.append(current)
                current = []
            current.append(index)
    return passes + [current] if current else passes


def _shared_cost(samples: Samples, indices: list[int]) -> int:
    prompts = {samples.group_ids[i] for i in indices}
    prompt_width = max(len(samples.prompts[i]) for i in indices)
    completion_width = max(len(samples.completions[i]) for i in indices)
    return len(prompts) * prompt_width + len(indices) * completion_width


def build_pass(samples: Samples, indices: list[int], pad_id: int, layout: str) -> MicroBatch | SharedMicroBatch:
    prompts = [samples.prompts[i] for i in indices]
    completions = [samples.completions[i] for i in indices]
    if layout == "shared":
        first: dict[int, int] = {}
        for i in indices:
            first.setdefault(samples.group_ids[i], len(first))
        distinct = {first[samples.group_ids[i]]: samples.prompts[i] for i in indices}
        return collate_shared([distinct[k] for k in range(len(distinct))], completions,
                              prompt_of=[first[samples.group_ids[i]] for i in indices], sample_ids=indices,
                              pad_id=pad_id)
    if layout == "packed":
        return collate_packed(prompts, completions, indices)
    return collate(prompts, completions, indices, pad_id)


def collate_packed(prompts: list[list[int]], completions: list[list[int]], sample_ids: list[int]) -> MicroBatch:
    """One row holding every sequence back to back; positions restart at 0 for each."""
    ids: list[int] = []
    positions: list[int] = []
    cols, targets, samples = [], [], []
    for prompt, completion, sample in zip(prompts, completions, sample_ids, strict=True):
        start = len(ids)
        ids += prompt + completion
        positions += range(len(prompt) + len(completion))
        cols += range(start + len(prompt) - 1, start + len(prompt) - 1 + len(completion))
        targets += completion
        samples += [sample] * len(completion)
    return MicroBatch(
        input_ids_BL=torch.tensor([ids]),
        attention_mask_BL=None,
        rows_N=torch.zeros(len(cols), dtype=torch.long),
        cols_N=torch.tensor(cols, dtype=torch.long),
        targets_N=torch.tensor(targets, dtype=torch.long),
        sample_N=torch.tensor(samples, dtype=torch.long),
        position_ids_BL=torch.tensor([positions]),
    )


def processed_tokens(mb: MicroBatch | SharedMicroBatch, prompt_lengths: list[int]) -> tuple[int, int]:
    """(prompt, completion) tokens a pass computes, padding excluded (learner tokens/s)."""
    if isinstance(mb, SharedMicroBatch):
        return mb.processed_tokens
    completion = mb.num_tokens
    return sum(prompt_lengths), completion

"""Per-token log-probs of completions under the current model, aligned with the behaviour
log-probs the workers returned."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PackedBatch:
    """Right-padded prompt+completion rows and where each completion starts."""

    input_ids_BL: torch.Tensor
    attention_mask_BL: torch.Tensor
    prompt_lens_B: torch.Tensor
    completion_mask_BT: torch.Tensor
    completion_ids_BT: torch.Tensor


def pack(prompts: list[list[int]], completions: list[list[int]], pad_id: int) -> PackedBatch:
    rows = [p + c for p, c in zip(prompts, completions, strict=True)]
    width = max(len(r) for r in rows)
    horizon = max(1, max(len(c) for c in completions))
    lens = torch.tensor([len(r) for r in rows])
    return PackedBatch(
        input_ids_BL=torch.tensor([r + [pad_id] * (width - len(r)) for r in rows]),
        attention_mask_BL=(torch.arange(width)[None, :] < lens[:, None]).long(),
        prompt_lens_B=torch.tensor([len(p) for p in prompts]),
        completion_mask_BT=torch.tensor([[1.0] * len(c) + [0.0] * (horizon - len(c)) for c in completions]),
        completion_ids_BT=torch.tensor([c + [pad_id] * (horizon - len(c)) for c in completions]),
    )


def completion_logprobs(model, batch: PackedBatch, temperature: float) -> torch.Tensor:
    """log pi(completion token j | prefix) for every row, shape [B, T] (padding positions hold
    finite junk; callers mask them)."""
    logits_BLV = model(input_ids=batch.input_ids_BL, attention_mask=batch.attention_mask_BL).logits
    horizon = batch.completion_ids_BT.shape[1]
    # the token at position p is predicted by the logits at p - 1
    offsets_T = torch.arange(horizon)
    positions_BT = (batch.prompt_lens_B[:, None] - 1 + offsets_T[None, :]).clamp(max=logits_BLV.shape[1] - 1)
    logits_BTV = logits_BLV.gather(1, positions_BT[..., None].expand(-1, -1, logits_BLV.shape[-1]))
    logp_BTV = torch.log_softmax(logits_BTV.float() / temperature, dim=-1)
    return logp_BTV.gather(-1, batch.completion_ids_BT[..., None]).squeeze(-1)

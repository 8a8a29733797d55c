"""Prompt batching, completion extraction and greedy completions shared by the learner, the
evaluation and the HF rollout engine (torch)."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from echo2.models.kv_cache import cache_argument, expand_cache, returned_cache, supports_shared_prefix


def encode_prompts(tokenizer, prompts: Sequence[str]) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-padded input ids and attention mask for a batch of prompt strings."""
    enc = tokenizer(list(prompts), return_tensors="pt", padding=True, add_special_tokens=False)
    return enc["input_ids"], enc["attention_mask"]


def strip_completion(token_ids: Sequence[int], eos_id: int, pad_id: int) -> list[int]:
    """Generated ids up to and including the first EOS; trailing padding removed."""
    out: list[int] = []
    for token in token_ids:
        out.append(int(token))
        if token == eos_id:
            return out
    while out and out[-1] == pad_id and pad_id != eos_id:
        out.pop()
    return out


def decode_completion(tokenizer, token_ids: Sequence[int]) -> str:
    return tokenizer.decode(list(token_ids), skip_special_tokens=True)


@torch.no_grad()
def greedy_completions(model, tokenizer, prompts: Sequence[str], max_new_tokens: int) -> list[str]:
    input_ids, attention_mask = encode_prompts(tokenizer, prompts)
    device = next(model.parameters()).device
    out = model.generate(
        input_ids=input_ids.to(device),
        attention_mask=attention_mask.to(device),
        do_sample=False,
        max_new_tokens=max_new_tokens,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    new = out[:, input_ids.shape[1] :].tolist()
    eos, pad = tokenizer.eos_token_id, tokenizer.pad_token_id
    return [decode_completion(tokenizer, strip_completion(row, eos, pad)) for row in new]


@torch.no_grad()
def generate_ids(model, rows: Sequence[Sequence[int]], *, max_new_tokens: int, temperature: float,
                 pad_id: int, eos_id: int) -> list[list[int]]:
    """One completion per row of token ids (left-padded into one batch), each up to and
    including its first EOS; greedy when temperature is 0, else sampled from the full softmax.
    The rows' common beginning (a chat template's system prompt: 30 of 45 tokens on SmolLM2)
    is computed once and continued by every row (`_common_prefix_cache`)."""
    device = next(model.parameters()).device
    common = _common_length(rows)
    extra: dict = {}
    if len(rows) > 1 and common >= 2 and supports_shared_prefix(model):
        extra = _common_prefix_cache(model, list(rows[0][:common]), len(rows), device)
        prefix, rest = list(rows[0][:common]), [list(r[common:]) for r in rows]
        width = max(len(r) for r in rest)
        # the padding sits between the shared beginning and each row's own end: generate counts
        # positions from the attention mask, so every row's tokens keep their own positions
        ids = torch.tensor([prefix + [pad_id] * (width - len(r)) + r for r in rest], device=device)
        mask = torch.tensor([[1] * common + [0] * (width - len(r)) + [1] * len(r) for r in rest], device=device)
    else:
        width = max(len(r) for r in rows)
        ids = torch.tensor([[pad_id] * (width - len(r)) + list(r) for r in rows], device=device)
        mask = torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device)
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature > 0 else \
        {"do_sample": False}
    out = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                         eos_token_id=eos_id, **sampling, **extra)
    return [strip_completion(row, eos_id, pad_id) for row in out[:, ids.shape[1]:].tolist()]


def _common_length(rows: Sequence[Sequence[int]]) -> int:
    """Tokens every row begins with, leaving each row at least one token of its own (generate
    computes the first new token from the row's last prompt token)."""
    shortest = min(len(r) for r in rows)
    first = rows[0]
    length = 0
    while length < shortest - 1 and all(r[length] == first[length] for r in rows):
        length += 1
    return length


def _common_prefix_cache(model, prefix: list[int], rows: int, device) -> dict:
    body = model.base_model
    out = body(input_ids=torch.tensor([prefix], device=device), use_cache=True)
    expanded = expand_cache(returned_cache(out), torch.zeros(rows, dtype=torch.long, device=device))
    return {cache_argument(type(body)): expanded}

"""Policy weights as bytes: a safetensors blob of the model's state dict (no pickle ever crosses a
process boundary). Tied parameters (e.g. embeddings shared with the LM head) travel once."""

from __future__ import annotations

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save


def state_dict_to_bytes(model: torch.nn.Module) -> bytes:
    seen: set[int] = set()
    unique: dict[str, torch.Tensor] = {}
    for name, tensor in model.state_dict().items():
        ptr = tensor.untyped_storage().data_ptr()
        if ptr in seen:
            continue  # a tied alias of a tensor already included
        seen.add(ptr)
        unique[name] = tensor.detach().contiguous().cpu()
    return st_save(unique)


def bytes_to_state_dict(payload: bytes) -> dict[str, torch.Tensor]:
    return st_load(payload)


def load_into(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy tensors into the model in place; refuse payloads that do not match it.

    Names may be missing only for tied aliases, which are filled through the tensor they share.
    """
    own = model.state_dict()
    unexpected = sorted(set(tensors) - set(own))
    if unexpected:
        raise ValueError(f"weights do not match the model: unexpected tensors {unexpected[:3]}")
    present = {own[name].untyped_storage().data_ptr() for name in tensors}
    missing = [n for n in own if n not in tensors and own[n].untyped_storage().data_ptr() not in present]
    if missing:
        raise ValueError(f"weights do not match the model: missing tensors {missing[:3]}")
    with torch.no_grad():
        for name, tensor in tensors.items():
            if own[name].shape != tensor.shape:
                raise ValueError(f"tensor {name}: shape {tuple(tensor.shape)} != model's {tuple(own[name].shape)}")
            own[name].copy_(tensor)

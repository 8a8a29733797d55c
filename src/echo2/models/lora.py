"""LoRA adapters with peft (grpo.lora): the learner wraps its model so only the adapters train,
publishes the adapter weights alone, and a worker applies them to the base model it holds.

An adapter payload is a safetensors payload like any version (echo2.models.weights), holding
peft's adapter state dict (`...q_proj.lora_A.weight`, no adapter name); its manifest is marked
with the LoRA settings, which a worker needs to build the same adapters. Workers keep the adapter
unmerged (peft's forward computes base + (alpha / r) B A x), the computation the learner scores
log-probs with, so the rollout audit compares like with like.
"""

from __future__ import annotations

import mmap

import torch

from echo2.config.run import LoraConfig
from echo2.models.weights import plan_layout, write_payload


def peft_config(cfg: LoraConfig):
    from peft import LoraConfig as PeftLoraConfig

    # dropout 0: rollouts and the learner's log-probs must see the same function
    return PeftLoraConfig(r=cfg.r, lora_alpha=cfg.alpha, target_modules=list(cfg.target_modules), lora_dropout=0.0,
                          bias="none")


def wrap_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """`model` with adapters on cfg.target_modules; only they require gradients."""
    from peft import get_peft_model

    matched = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()} & set(cfg.target_modules)
    if not matched:
        raise ValueError(f"grpo.lora.target_modules={list(cfg.target_modules)!r} names no module of this model; "
                         "use its linear layers' names, e.g. 'q_proj'")
    return get_peft_model(model, peft_config(cfg))


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    from peft import get_peft_model_state_dict

    return {name: tensor.detach() for name, tensor in get_peft_model_state_dict(model).items()}


def adapter_payload(model: torch.nn.Module, float_dtype: torch.dtype | None = None) -> mmap.mmap:
    """The adapters as one safetensors payload (what a LoRA learner publishes)."""
    layout = plan_layout(adapter_tensors(model), float_dtype)
    buffer = mmap.mmap(-1, layout.total_bytes)
    write_payload(layout, buffer)
    return buffer


def load_adapter(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy published adapter weights into a wrapped model in place; refuse any that do not
    match its adapters (another rank or target set)."""
    own = adapter_tensors(model)
    if set(tensors) != set(own):
        unknown, missing = sorted(set(tensors) - set(own)), sorted(set(own) - set(tensors))
        raise ValueError(f"adapter does not match this model's LoRA layout: unexpected {unknown[:3]}, "
                         f"missing {missing[:3]}")
    from peft import set_peft_model_state_dict

    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape:
            raise ValueError(f"adapter tensor {name}: shape {tuple(tensor.shape)} != model's {tuple(own[name].shape)}")
    with torch.no_grad():
        set_peft_model_state_dict(model, tensors)

"""LoRA adapters with peft (grpo.lora): the learner wraps its model so only the adapters train,
publishes the adapter weights alone, and a worker applies them to the base model it holds.

An adapter payload is a safetensors payload like any version (echo2.models.weights), holding
peft's adapter state dict (`...q_proj.lora_A.weight`, no adapter name); its manifest names the
LoRA settings, which a worker needs to build the same adapters. Adapters are injected into the
transformers model in place (no PeftModel wrapper), and workers keep them unmerged (each target
layer computes W x + (alpha / r) B A x), the computation the learner scores log-probs with, so
the rollout audit compares like with like.
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


def add_lora(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """Adapters on cfg.target_modules, added in place (peft's inject_adapter_in_model: the model
    stays the transformers class it was, so every code path that takes a causal LM takes it);
    only the adapters require gradients. Adapter B starts at zero: the model is unchanged."""
    from peft import inject_adapter_in_model

    matched = {name.rsplit(".", 1)[-1] for name, _ in model.named_modules()} & set(cfg.target_modules)
    if not matched:
        raise ValueError(f"grpo.lora.target_modules={list(cfg.target_modules)!r} names no module of this model; "
                         "use its linear layers' names, e.g. 'q_proj'")
    return inject_adapter_in_model(peft_config(cfg), model)


def lora_parameters(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter parameters under the model's own names (what `functional_call` takes)."""
    return {name: p.detach() for name, p in model.named_parameters() if ".lora_" in name}


def adapter_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The adapter weights under peft's names (no adapter name): what a version carries."""
    from peft import get_peft_model_state_dict

    return {name: tensor.detach() for name, tensor in get_peft_model_state_dict(model).items()}


def adapter_payload(model: torch.nn.Module, float_dtype: torch.dtype | None = None) -> mmap.mmap:
    """The adapters as one safetensors payload (what a LoRA learner publishes)."""
    return _payload(adapter_tensors(model), float_dtype)


def audit_payload(model: torch.nn.Module, float_dtype: torch.dtype | None = None) -> mmap.mmap:
    """The adapters as published, under the model's own parameter names (the rollout audit
    recomputes log-probs with them in place of the live adapters)."""
    return _payload(lora_parameters(model), float_dtype)


def _payload(tensors: dict[str, torch.Tensor], float_dtype: torch.dtype | None) -> mmap.mmap:
    layout = plan_layout(tensors, float_dtype)
    buffer = mmap.mmap(-1, layout.total_bytes)
    write_payload(layout, buffer)
    return buffer


def load_adapter(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy published adapter weights into a model with adapters in place (cast to its dtype
    and device); refuse any that do not match its adapters (another rank or target set)."""
    own = adapter_tensors(model)
    if set(tensors) != set(own):
        unknown, missing = sorted(set(tensors) - set(own)), sorted(set(own) - set(tensors))
        raise ValueError(f"adapter does not match this model's LoRA layout: unexpected {unknown[:3]}, "
                         f"missing {missing[:3]}")
    for name, tensor in tensors.items():
        if tensor.shape != own[name].shape:
            raise ValueError(f"adapter tensor {name}: shape {tuple(tensor.shape)} != model's {tuple(own[name].shape)}")
    from peft import set_peft_model_state_dict

    with torch.no_grad():
        result = set_peft_model_state_dict(model, tensors)
    if result.unexpected_keys:
        raise ValueError(f"adapter tensors were not loaded: {result.unexpected_keys[:3]}")


# the prefix peft's saved adapters carry (a PeftModel wraps the base as base_model.model), which
# vLLM and `PeftModel.from_pretrained` expect
PEFT_PREFIX = "base_model.model."


def save_adapter_dir(tensors: dict[str, torch.Tensor], cfg: LoraConfig, out) -> None:
    """Write adapter weights (peft names, no adapter name: what a version carries) as a peft
    adapter directory (adapter_config.json + adapter_model.safetensors): the format vLLM's
    LoRARequest and `PeftModel.from_pretrained` load."""
    from pathlib import Path

    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    save_file({PEFT_PREFIX + name: tensor.contiguous() for name, tensor in tensors.items()},
              out / "adapter_model.safetensors")
    peft_config(cfg).save_pretrained(str(out))

"""Load a causal LM and its tokenizer with `from_pretrained`, as users do with real checkpoints."""

from __future__ import annotations

import threading

# transformers initialises models on the meta device by patching torch globally while it loads:
# two loads in threads of one process (several workers in one process, as in tests) corrupt
# each other, so loads are serialised
_LOAD_LOCK = threading.Lock()


def quiet_transformers() -> None:
    """Per-file progress bars from transformers drown the run's own progress display."""
    from transformers.utils import logging

    logging.disable_progress_bar()


def load_tokenizer(source: str):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source)
    tokenizer.padding_side = "left"
    if tokenizer.pad_token_id is None:
        # many base models ship without a pad token; generation needs one for batching
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_model(source: str, device="cpu", dtype: str = "float32"):
    """`device`: a name or torch.device; `dtype`: the weights' dtype by name ("float32", "bfloat16", ...)."""
    import torch
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    with _LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, dtype))
    return model.to(device)


def enable_activation_checkpointing(model) -> None:
    """Recompute each decoder block in the backward pass (non-reentrant torch checkpointing).
    transformers 5 names it activation checkpointing; older releases gradient checkpointing."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

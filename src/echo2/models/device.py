"""Device and dtype names from the configs, resolved against what this torch build can do. One
place for the rule "auto means the first CUDA GPU when torch sees one, else the CPU", shared by
the learner and the HF rollout engine."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_device(name: str, field: str) -> torch.device:
    """`name` as in the configs ("auto", "cpu", "cuda", "cuda:N"); `field` names the setting in
    errors, e.g. "learner.device"."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(name)
    if device.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(
                f"{field}={name!r} but this torch build sees no CUDA GPU (torch {torch.__version__}); "
                f"install a CUDA build of torch or set {field}=\"cpu\""
            )
        if device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{field}={name!r} but only {torch.cuda.device_count()} CUDA device(s) exist; "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return device


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    """An engine dtype by name; "auto" is bfloat16 on CUDA and float32 on the CPU (CPU kernels
    for bfloat16 are slower than float32 ones on most machines)."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return DTYPES[name]


def checkpoint_dtype(config) -> torch.dtype:
    """The dtype a Hugging Face checkpoint says it is stored in (`dtype`, formerly
    `torch_dtype`, in config.json); float32 when it names none."""
    named = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(named, torch.dtype):
        return named
    if isinstance(named, str) and named in DTYPES:
        return DTYPES[named]
    return torch.float32

"""Where and in what precision the learner computes: the device, fp32 master weights (always),
and whether the forward and backward passes run under bf16 autocast."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from echo2.config.run import LearnerConfig
from echo2.models.device import resolve_device


@dataclass(frozen=True)
class Precision:
    device: torch.device
    autocast_dtype: torch.dtype | None = None
    """None: plain fp32. bfloat16: master weights and optimizer states stay fp32 while matrix
    products run in bf16 (torch.autocast)."""

    @property
    def name(self) -> str:
        return "bf16-mixed" if self.autocast_dtype is torch.bfloat16 else "fp32"

    def autocast(self) -> contextlib.AbstractContextManager:
        if self.autocast_dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.autocast_dtype)


CPU_FP32 = Precision(torch.device("cpu"))


def resolve_precision(cfg: LearnerConfig) -> Precision:
    device = resolve_device(cfg.device, "learner.device")
    mixed = cfg.precision == "bf16-mixed" or (cfg.precision == "auto" and device.type == "cuda")
    return Precision(device, torch.bfloat16 if mixed else None)


def peak_memory_bytes(device: torch.device) -> int:
    """The process's peak so far: allocated GPU memory on CUDA, resident set size on the CPU."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024  # KiB on Linux

"""The cache of prepared base models: where a prepared model lives (keyed by the settings it
was made with), whether one is there, and GGUF sources dequantized once for every run and task.
Preparing a base that needs a warm start is echo2.learner.base_model's (the warm start trains)."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from echo2.config.run import ModelConfig, RunConfig, WarmStartConfig
from echo2.models.sources import dequantize_gguf

MARKER = "echo2_prepared.json"
GGUF_FORMAT = 1
"""Bumped when the dequantized directory changes, so cached conversions are made again."""


def dequantize_only(cfg: RunConfig) -> bool:
    return cfg.model.is_gguf and cfg.warmstart.steps == 0


def cache_path(cfg: RunConfig) -> Path:
    key = hashlib.sha256(json.dumps(fingerprint(cfg), sort_keys=True).encode()).hexdigest()[:16]
    return Path(cfg.cache_dir) / f"base-{key}"


def fingerprint(cfg: RunConfig) -> dict:
    from echo2.models.sources import gguf_identity
    from echo2.models.tiny import BUILD_VERSION

    if dequantize_only(cfg):  # the same file gives the same model whatever the task
        return {"gguf": gguf_identity(cfg.model), "format": GGUF_FORMAT}
    return {
        "model": cfg.model.model_dump(),
        "gguf": gguf_identity(cfg.model),
        "tiny_build": BUILD_VERSION if cfg.model.source == "tiny" else None,
        "warmstart": cfg.warmstart.model_dump(),
        "task": cfg.task.model_dump(),
        "task_reference_format": cfg.task.reference_format,
        "seed": cfg.seed,
    }


def prepared_info(cfg: RunConfig, where: Path | None = None) -> dict | None:
    marker = (where or Path(cfg.base_model_path)) / MARKER
    if not marker.is_file():
        return None
    info = json.loads(marker.read_text())
    return info if info.get("fingerprint") == fingerprint(cfg) else None


def prepared_gguf(model: ModelConfig, cache_dir: str, log: Callable[[str], None] = print) -> Path:
    """The Hugging Face directory a GGUF source dequantizes to, made once in `cache_dir` (what
    `echo2 eval` and `echo2 models fetch` load, and every run's `base/` is copied from)."""
    cfg = RunConfig(model=model, cache_dir=cache_dir, warmstart=WarmStartConfig(steps=0), run_dir=cache_dir)
    where = cache_path(cfg)
    if prepared_info(cfg, where) is None:
        import torch

        torch.set_num_threads(os.cpu_count() or 1)
        tmp = where.with_name(where.name + f".build{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        log(f"dequantizing {model.source} with transformers' GGUF loader (once: cached in {where})")
        info = dequantize_gguf(model, tmp)
        info.update(fingerprint=fingerprint(cfg), seconds=info["dequantize_s"])
        (tmp / MARKER).write_text(json.dumps(info, indent=2))
        copy_dir(tmp, where)
        shutil.rmtree(tmp, ignore_errors=True)
    return where


def copy_dir(src: Path, dst: Path) -> None:
    """Copy through a temporary sibling so a reader never sees a half-copied directory."""
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    shutil.rmtree(dst, ignore_errors=True)
    os.rename(tmp, dst)

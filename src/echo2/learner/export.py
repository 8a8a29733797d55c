"""A learner checkpoint as a Hugging Face model directory: config, tokenizer and safetensors
weights that `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` load, for
evaluation, serving or a next training stage outside echo2."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from echo2.config.run import RunConfig

EXPORT_MARKER = "echo2_export.json"


def export_checkpoint(cfg: RunConfig, out: Path, step: int | None = None, dtype: str = "auto") -> dict:
    """Write the checkpoint of `step` (None: the newest) to `out`, which must not exist or be
    empty. `dtype`: "auto" keeps the base checkpoint's storage dtype (float32 master weights are
    cast to it), or "float32" / "bfloat16" / "float16". Returns what was written."""
    from transformers import AutoConfig, AutoTokenizer

    from echo2.learner.checkpoint import checkpoint_at, load_model_weights
    from echo2.models.device import DTYPES, checkpoint_dtype
    from echo2.models.loading import load_model

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty directory; choose a new path")
    path = checkpoint_at(cfg.run_path / "checkpoints", step)
    base = cfg.base_model_path
    target = DTYPES[dtype] if dtype != "auto" else checkpoint_dtype(AutoConfig.from_pretrained(base))
    model = load_model(base)  # architecture and config from the run's base model
    load_model_weights(path, model)
    model = model.to(target)
    model.config.dtype = target
    tokenizer = AutoTokenizer.from_pretrained(base)  # as the user shipped it, padding side included
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = json.loads((path / "meta.json").read_text())
    info = {"run_dir": str(cfg.run_path), "step": meta["step"], "checkpoint": str(path),
            "dtype": str(target).removeprefix("torch."), "base_model": base}
    (tmp / EXPORT_MARKER).write_text(json.dumps(info, indent=2))
    if out.exists():
        out.rmdir()  # empty, checked above
    os.rename(tmp, out)
    return info

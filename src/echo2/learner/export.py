"""A learner checkpoint as a Hugging Face model directory: config, tokenizer and safetensors
weights that `AutoModelForCausalLM.from_pretrained` / `AutoTokenizer.from_pretrained` load, for
evaluation, serving or a next training stage outside echo2.

A LoRA run (grpo.lora) exports the base with its adapters merged (W + (alpha / r) B A, by peft's
`merge_and_unload`), so the directory loads without peft, and the adapters alone as a peft
adapter directory in `adapter/` (for `PeftModel.from_pretrained` or vLLM's LoRA serving)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from echo2.config.run import RunConfig

EXPORT_MARKER = "echo2_export.json"
ADAPTER_DIR = "adapter"


def export_checkpoint(cfg: RunConfig, out: Path, step: int | None = None, dtype: str = "auto") -> dict:
    """Write the checkpoint of `step` (None: the newest) to `out`, which must not exist or be
    empty. `dtype`: "auto" keeps the base checkpoint's storage dtype (float32 master weights are
    cast to it), or "float32" / "bfloat16" / "float16". Returns what was written."""
    from transformers import AutoConfig, AutoTokenizer

    from echo2.learner.checkpoint import checkpoint_at
    from echo2.learner.checkpoint_reader import load_model_weights
    from echo2.models.device import DTYPES, checkpoint_dtype
    from echo2.models.loading import load_model

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {str(out)!r} exists and is not an empty directory; choose a new path")
    path = checkpoint_at(cfg.run_path / "checkpoints", step)
    base = cfg.base_model_path
    target = DTYPES[dtype] if dtype != "auto" else checkpoint_dtype(AutoConfig.from_pretrained(base))
    model = load_model(base)  # architecture and config from the run's base model
    lora = cfg.grpo.lora
    if lora is not None:
        from echo2.models.lora import add_lora

        add_lora(model, lora)  # a LoRA run's checkpoint holds the base and its adapters
    load_model_weights(path, model)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    if lora is not None:
        model = _merged(model, lora, base, tmp / ADAPTER_DIR)
    model = model.to(target)
    model.config.dtype = target
    tokenizer = AutoTokenizer.from_pretrained(base)  # as the user shipped it, padding side included
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    meta = json.loads((path / "meta.json").read_text())
    info = {"run_dir": str(cfg.run_path), "step": meta["step"], "checkpoint": str(path),
            "dtype": str(target).removeprefix("torch."), "base_model": base}
    if lora is not None:
        info["adapter"] = str(out / ADAPTER_DIR)
    (tmp / EXPORT_MARKER).write_text(json.dumps(info, indent=2))
    if out.exists():
        out.rmdir()  # empty, checked above
    os.rename(tmp, out)
    return info


def _merged(model, lora, base: str, adapter_dir: Path):
    """The checkpoint's adapters, written to `adapter_dir` as a peft adapter, merged into a fresh
    copy of the base by peft (the same adapter directory a user would load)."""
    from peft import PeftModel

    from echo2.models.loading import load_model
    from echo2.models.lora import adapter_tensors, save_adapter_dir

    save_adapter_dir(adapter_tensors(model), lora, adapter_dir)
    return PeftModel.from_pretrained(load_model(base), str(adapter_dir)).merge_and_unload()

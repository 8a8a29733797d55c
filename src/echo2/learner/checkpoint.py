"""Checkpoints for exact resume: model weights (safetensors), optimizer state, RNG states and the
step, written to a temporary directory and renamed into place so a crash never leaves a
half-written checkpoint that looks complete."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from echo2.models.weights import bytes_to_state_dict, load_into, state_dict_to_bytes

KEEP_CHECKPOINTS = 2


def _name(step: int) -> str:
    return f"step_{step:07d}"


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / _name(step), root / f".{_name(step)}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    (tmp / "model.safetensors").write_bytes(state_dict_to_bytes(model))
    # optimizer and RNG state are our own local files, read back with weights_only=True
    torch.save({"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state()}, tmp / "state.pt")
    (tmp / "meta.json").write_text(json.dumps({"step": step, "python_rng": _py_rng_to_json()}))
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    _prune(root)
    return final


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step_*") if (p / "meta.json").is_file()) if root.is_dir() else []
    return done[-1] if done else None


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore everything saved at `path`; returns the step to continue from."""
    load_into(model, bytes_to_state_dict((path / "model.safetensors").read_bytes()))
    state = torch.load(path / "state.pt", weights_only=True)
    optimizer.load_state_dict(state["optimizer"])
    torch.set_rng_state(state["torch_rng"])
    meta = json.loads((path / "meta.json").read_text())
    random.setstate(_py_rng_from_json(meta["python_rng"]))
    return int(meta["step"])


def _py_rng_to_json() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _py_rng_from_json(data: list) -> tuple:
    return (data[0], tuple(data[1]), data[2])


def _fsync_dir(path: Path) -> None:
    for child in path.iterdir():
        with open(child, "rb") as handle:
            os.fsync(handle.fileno())


def _prune(root: Path) -> None:
    done = sorted(root.glob("step_*"))
    for old in done[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)

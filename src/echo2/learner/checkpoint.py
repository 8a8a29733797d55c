"""Checkpoints for exact resume: model weights (safetensors, fp32 master weights), optimizer
state, RNG states and the step, written to a temporary directory and renamed into place so a
crash never leaves a half-written checkpoint that looks complete. Nothing non-finite is ever
written: a NaN checkpoint would poison every resume from it.

A learner of several ranks writes the sharded format instead (sharded_checkpoint.py) in the same
step directories; either format resumes a learner of any number of ranks (checkpoint_reader.py
picks the loader, so that this module and the sharded one do not import each other)."""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path

import torch

from echo2.models.weights import require_finite, save_model_file, unique_tensors

KEEP_CHECKPOINTS = 2
MODEL_FILE = "model.safetensors"
STATE_FILE = "state.pt"


def _name(step: int) -> str:
    return f"step_{step:07d}"


def save_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Path:
    require_finite(unique_tensors(model), f"checkpoint step {step}: model")
    require_finite(_optimizer_tensors(optimizer), f"checkpoint step {step}: optimizer state")
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = checkpoint_paths(root, step)
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir()
    save_model_file(model, tmp / MODEL_FILE)
    # optimizer and RNG state are our own local files, read back with weights_only=True
    torch.save({"optimizer": optimizer.state_dict(), **rng_state()}, tmp / STATE_FILE)
    write_meta(tmp, step)
    commit(root, tmp, final)
    return final


def checkpoint_paths(root: Path, step: int) -> tuple[Path, Path]:
    """The step's directory and the temporary one it is written in."""
    return root / _name(step), root / f".{_name(step)}.tmp"


def rng_state() -> dict[str, torch.Tensor | list[torch.Tensor]]:
    state: dict[str, torch.Tensor | list[torch.Tensor]] = {"torch_rng": torch.get_rng_state()}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda_rng"] = torch.cuda.get_rng_state_all()
    return state


def write_meta(tmp: Path, step: int, **extra) -> None:
    """meta.json, written last: its presence marks a complete checkpoint."""
    (tmp / "meta.json").write_text(json.dumps({"step": step, "python_rng": _py_rng_to_json(), **extra}))


def commit(root: Path, tmp: Path, final: Path) -> None:
    """Make the written checkpoint durable and rename it into place, then prune old ones."""
    _fsync_dir(tmp)
    shutil.rmtree(final, ignore_errors=True)
    os.rename(tmp, final)
    # the rename itself made durable: once the learner reports this step to the coordinator,
    # the batches of earlier steps are deleted and a lost rename could not be replayed
    _fsync_directory(root)
    _prune(root)


def latest_checkpoint(root: Path) -> Path | None:
    done = sorted(p for p in root.glob("step_*") if (p / "meta.json").is_file()) if root.is_dir() else []
    return done[-1] if done else None


def checkpoint_at(root: Path, step: int | None) -> Path:
    """The complete checkpoint of `step` (None: the newest); ValueError naming what exists."""
    path = latest_checkpoint(root) if step is None else root / _name(step)
    if path is None or not (path / "meta.json").is_file():
        have = (sorted(int(p.name[5:]) for p in root.glob("step_*") if (p / "meta.json").is_file())
                if root.is_dir() else [])
        raise ValueError(f"no checkpoint {'at all' if step is None else f'for step {step}'} in {root} "
                         f"(complete checkpoints: {have or 'none'})")
    return path


def restore_rng_and_step(path: Path) -> int:
    """Put back the RNG states saved at `path` (either format); returns the step to continue from."""
    state = read_state(path)
    torch.set_rng_state(state["torch_rng"])
    if "cuda_rng" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda_rng"])
    meta = json.loads((path / "meta.json").read_text())
    random.setstate(_py_rng_from_json(meta["python_rng"]))
    return int(meta["step"])


def read_state(path: Path) -> dict:
    """state.pt: the optimizer (plain format only) and RNG states; our own local file, read
    back with weights_only=True."""
    return torch.load(path / STATE_FILE, weights_only=True, map_location="cpu")


def _optimizer_tensors(optimizer: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    return {f"{index}.{key}": value for index, state in enumerate(optimizer.state.values())
            for key, value in state.items() if isinstance(value, torch.Tensor)}


def _py_rng_to_json() -> list:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _py_rng_from_json(data: list) -> tuple:
    return (data[0], tuple(data[1]), data[2])


def _fsync_dir(path: Path) -> None:
    for child in path.iterdir():
        with open(child, "rb") as handle:
            os.fsync(handle.fileno())


def _fsync_directory(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _prune(root: Path) -> None:
    done = sorted(root.glob("step_*"))
    for old in done[:-KEEP_CHECKPOINTS]:
        shutil.rmtree(old, ignore_errors=True)

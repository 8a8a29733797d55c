"""Reading a checkpoint back whichever format wrote it: the plain one (checkpoint.py, a learner
of one rank) or the sharded one (sharded_checkpoint.py), into a plain or a sharded model. The
choice lives here, above both formats, because the sharded format builds on the plain one's
files and helpers."""

from __future__ import annotations

from pathlib import Path

import torch
from safetensors.torch import load_file

from echo2.learner.checkpoint import MODEL_FILE, read_state, restore_rng_and_step
from echo2.models.weights import load_into


def load_model_weights(path: Path, model: torch.nn.Module) -> None:
    if not (path / MODEL_FILE).is_file():  # written by a learner of several ranks
        # deferred here and below: torch.distributed.checkpoint loads only when a format needs it
        from echo2.learner.sharded_checkpoint import load_sharded_weights

        load_sharded_weights(path, model)
        return
    load_into(model, load_file(path / MODEL_FILE))


def load_checkpoint(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> int:
    """Restore everything saved at `path` (either format, into a plain or a sharded model);
    returns the step to continue from."""
    from echo2.learner.sharded_checkpoint import is_sharded_model, load_across_formats

    if is_sharded_model(model) or not (path / MODEL_FILE).is_file():
        load_across_formats(path, model, optimizer)
    else:
        load_model_weights(path, model)
        # optimizer.load_state_dict moves each state tensor to its parameter's device
        optimizer.load_state_dict(read_state(path)["optimizer"])
    return restore_rng_and_step(path)

"""Checkpoints of a sharded learner, written with torch.distributed.checkpoint (DCP): every rank
writes its own shards of the fp32 weights and AdamW states into the step's directory and rank 0
the metadata, the RNG states (state.pt) and meta.json, last, as the plain format does.

Loading reshards: DCP reads whatever slices the loading ranks own, so a checkpoint of K ranks
resumes on any number of ranks, one (no process group) included. A plain checkpoint
(model.safetensors + state.pt, from a learner of one rank) loads into a sharded learner as full
state dicts that each rank cuts its shard from. With several hosts, the run dir must be on a file
system they all see (each rank writes and reads its own shards there)."""

from __future__ import annotations

import contextlib
import shutil
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import load_file
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
    set_state_dict,
)
from torch.distributed.fsdp import FSDPModule

from echo2.learner.checkpoint import (
    MODEL_FILE,
    STATE_FILE,
    checkpoint_paths,
    commit,
    read_state,
    rng_state,
    write_meta,
)
from echo2.learner.distributed import Ranks, local_tensor
from echo2.models.weights import NonFiniteError, nonfinite_tensors

FULL = StateDictOptions(full_state_dict=True)


def is_sharded_model(model: torch.nn.Module) -> bool:
    return isinstance(model, FSDPModule)


def save_sharded_checkpoint(root: Path, step: int, model: torch.nn.Module, optimizer: torch.optim.Optimizer,
                            *, ranks: Ranks) -> Path:
    """Collective: every rank calls it. Refuses (on every rank) to write non-finite state."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    bad = nonfinite_tensors({k: local_tensor(v) for k, v in model_sd.items()})
    bad += nonfinite_tensors({f"{name}.{key}": local_tensor(value) for name, state in optim_sd["state"].items()
                              for key, value in state.items() if isinstance(value, torch.Tensor)})
    if ranks.sum(torch.tensor([len(bad)]))[0] > 0:
        raise NonFiniteError(f"checkpoint step {step}: tensors hold NaN or infinity (this rank: {bad[:3]}); "
                             "refusing to write it")
    final, tmp = checkpoint_paths(root, step)
    if ranks.leader:
        root.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    ranks.barrier()  # the directory exists before any rank writes into it
    dcp.save({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(tmp))
    if ranks.leader:  # dcp.save returns once every rank's shards are written
        torch.save(rng_state(), tmp / STATE_FILE)
        write_meta(tmp, step, format="dcp", ranks=ranks.world)
        commit(root, tmp, final)
    ranks.barrier()  # no rank goes on (and reports the step durable) before the rename
    return final


def load_across_formats(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Weights and optimizer state of either format into a plain or a sharded model."""
    if (path / MODEL_FILE).is_file():
        _load_plain_into_sharded(path, model, optimizer)
        return
    model_sd, optim_sd = get_state_dict(model, optimizer)  # this learner's layout: what DCP fills in
    with _single_process_ok():
        dcp.load({"model": model_sd, "optimizer": optim_sd}, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)


def load_sharded_weights(path: Path, model: torch.nn.Module) -> None:
    """The weights alone (export, evaluation), into a model of this process."""
    model_sd = get_model_state_dict(model)
    with _single_process_ok():
        dcp.load({"model": model_sd}, checkpoint_id=str(path))
    set_model_state_dict(model, model_sd)


@contextlib.contextmanager
def _single_process_ok():
    """A plain learner (or `echo2 export`) reading a sharded checkpoint has no process group,
    which DCP warns about; that is what it is for here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def _load_plain_into_sharded(path: Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    set_model_state_dict(model, _with_tied_aliases(model, load_file(path / MODEL_FILE), path), options=FULL)
    plain = read_state(path)["optimizer"]
    # the plain optimizer state is keyed by parameter index, in model.parameters() order (what
    # the optimizer was built from); the full format keys it by parameter name
    names = [name for name, _ in model.named_parameters()]
    full = {"state": {names[index]: state for index, state in plain["state"].items()},
            "param_groups": [{**group, "params": [names[i] for i in group["params"]]}
                             for group in plain["param_groups"]]}
    set_optimizer_state_dict(model, optimizer, full, options=FULL)


def _with_tied_aliases(model: torch.nn.Module, tensors: dict[str, torch.Tensor], path: Path) -> dict[str, torch.Tensor]:
    """A plain checkpoint stores tied parameters once (the LM head shares the embeddings); the
    full state dict names them all."""
    own = model.state_dict()
    storage = {local_tensor(t).untyped_storage().data_ptr(): name for name, t in own.items() if name in tensors}
    out = dict(tensors)
    for name, tensor in own.items():
        if name not in out:
            source = storage.get(local_tensor(tensor).untyped_storage().data_ptr())
            if source is None:
                raise ValueError(f"checkpoint {path} has no tensor {name!r} and no tensor it is tied to")
            out[name] = tensors[source]
    return out


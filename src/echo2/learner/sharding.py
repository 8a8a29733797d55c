"""The policy sharded across the learner's ranks with FSDP2 (`fully_shard`): each decoder layer is
one unit (its parameters are gathered just before it runs and freed after), the root unit holds
the embeddings, final norm and LM head. Each rank keeps 1/K of the fp32 master weights, of the
gradients and of the AdamW states.

On a bf16-mixed learner (the default on CUDA) the gathered parameters are bf16 and gradients are
reduced in fp32. Gradients are summed over ranks, not averaged: each rank's loss is already
scaled by the whole step's token count (see step.py), so the sum is the full-batch gradient."""

from __future__ import annotations

import types

import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard, register_fsdp_forward_method

from echo2.learner.distributed import Ranks
from echo2.learner.logprobs import SHARDED_LEAN_METHOD, lean_logprobs
from echo2.learner.precision import Precision


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    layers = getattr(getattr(model, "base_model", None), "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"cannot shard {type(model).__name__}: it has no decoder layers at model.base_model.layers "
                         "(the layout of Llama, Qwen, Mistral and most causal LMs in transformers); run it with "
                         "learner.ranks=1")
    return layers


def shard_model(model: torch.nn.Module, precision: Precision, ranks: Ranks) -> torch.nn.Module:
    """Shard `model` in place over the ranks (its parameters become DTensors on `precision.device`)."""
    mesh = init_device_mesh(precision.device.type, (ranks.world,))
    mixed = precision.autocast_dtype is not None
    policy = MixedPrecisionPolicy(param_dtype=precision.autocast_dtype, reduce_dtype=torch.float32) if mixed \
        else MixedPrecisionPolicy()
    units: list[FSDPModule] = []
    for layer in decoder_layers(model):
        units.append(fully_shard(layer, mesh=mesh, mp_policy=policy))
    units.append(fully_shard(model, mesh=mesh, mp_policy=policy))
    for unit in units:
        unit.set_gradient_divide_factor(1.0)
        # plain SUM collectives: gloo has no pre-multiplied sum (NCCL's PreMulSum)
        unit.set_force_sum_reduction_for_comms(True)
    # the lean LM-head path runs the body and the head outside model.forward: the root unit's
    # parameters (embeddings, norm, head) must be gathered around it as around forward
    setattr(model, SHARDED_LEAN_METHOD, types.MethodType(lean_logprobs, model))
    register_fsdp_forward_method(model, SHARDED_LEAN_METHOD)
    return model


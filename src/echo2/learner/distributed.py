"""The learner's ranks under torchrun: which process this is, the process group, and the few
collectives the train loop needs besides FSDP's own (the batch from rank 0, the step's sums).

One rank (no torchrun, or `--nproc-per-node 1`) is the plain learner: no process group, no
sharding. Rank 0 alone talks to the coordinator and the workers; the others follow it.

Anything that crosses between ranks is a tensor: objects travel as JSON bytes in a uint8 tensor,
never pickled (torch's broadcast_object_list would unpickle what another process sent)."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

# a collective waits this long for its peers: rank 0 may spend minutes in one long poll for a
# batch (train.batch_wait_s) or writing a checkpoint while the others wait in the broadcast
COLLECTIVE_TIMEOUT_S = 3600.0


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    sharded: bool = False
    """The model is sharded with FSDP2 (always with more than one rank; with one only when asked,
    to measure FSDP's own cost)."""

    @property
    def leader(self) -> bool:
        """Rank 0: fetches batches, publishes versions, writes metrics."""
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    def broadcast_json(self, value: Any = None) -> Any:
        """Rank 0's `value` on every rank (JSON-serialisable; other ranks pass nothing)."""
        if not self.sharded:
            return value
        data = json.dumps(value).encode() if self.leader else b""
        size = torch.tensor([len(data)], dtype=torch.int64)
        dist.broadcast(size, src=0)
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8) if self.leader else \
            torch.empty(int(size), dtype=torch.uint8)
        dist.broadcast(buffer, src=0)
        return value if self.leader else json.loads(bytes(buffer.numpy()))

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """Element-wise sum over ranks (a CPU tensor, reduced in float64)."""
        return self._reduce(values, dist.ReduceOp.SUM)

    def max(self, values: torch.Tensor) -> torch.Tensor:
        return self._reduce(values, dist.ReduceOp.MAX)

    def _reduce(self, values: torch.Tensor, op) -> torch.Tensor:
        if not self.sharded:
            return values
        out = values.detach().to("cpu", torch.float64).clone()
        dist.all_reduce(out, op=op)
        return out.to(values.dtype)

    def barrier(self) -> None:
        if self.sharded:
            dist.barrier()

    def share(self, plan: list[list[int]]) -> list[tuple[list[int], bool]]:
        """This rank's micro-batches of the step's plan, round robin (the plan is longest first,
        so shares stay about equal), as (indices, counted). Every rank runs as many forward and
        backward passes as the rank with the most, since each one is a collective under FSDP:
        a rank with fewer repeats its last micro-batch with its loss weighted 0 (uncounted)."""
        if not self.distributed:
            return [(indices, True) for indices in plan]
        mine = [(indices, True) for indices in plan[self.rank::self.world]]
        rounds = -(-len(plan) // self.world)
        filler = mine[-1][0] if mine else plan[-1]
        return mine + [(filler, False)] * (rounds - len(mine))

    def close(self) -> None:
        if self.sharded and dist.is_initialized():
            dist.destroy_process_group()


SINGLE = Ranks()


def init_ranks(device: torch.device, shard_one: bool = False) -> tuple[Ranks, torch.device]:
    """This process's place among torchrun's ranks (from its environment) and its device: on
    CUDA, GPU LOCAL_RANK. Starts the process group when there is more than one rank (gloo for
    CPU tensors, NCCL for CUDA ones). `shard_one`: shard even a single rank (benchmarks)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1 and not shard_one:
        return SINGLE, device
    rank, local_rank = int(os.environ.get("RANK", "0")), int(os.environ.get("LOCAL_RANK", "0"))
    if device.type == "cuda":
        if device.index not in (None, local_rank) and world > 1:
            raise ValueError(f"learner.device={str(device)!r} names one GPU, but the learner runs as {world} ranks "
                             "(one GPU each, by LOCAL_RANK); set learner.device=\"cuda\"")
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        if "MASTER_ADDR" not in os.environ:
            raise ValueError("a sharded learner runs under torchrun "
                             "(`torchrun --nproc-per-node K -m echo2 learner ...`); MASTER_ADDR is not set")
        backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, timeout=timedelta(seconds=COLLECTIVE_TIMEOUT_S))
    return Ranks(rank=rank, world=world, local_rank=local_rank, sharded=True), device


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a sharded tensor; a plain tensor as it is."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def full_value(tensor: torch.Tensor) -> float:
    """A scalar that may be a DTensor (the gradient norm of sharded gradients) as a float."""
    return float(tensor.full_tensor() if isinstance(tensor, DTensor) else tensor)

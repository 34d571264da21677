"""DistributedDataParallel plumbing for ``torchrun`` (gloo on CPU, NCCL on CUDA): the rank, the
world size and the two collectives the trainer uses."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass
class Dist:
    rank: int = 0
    world: int = 1
    local_rank: int = 0
    owns_group: bool = False
    comm_device: torch.device = torch.device("cpu")  # where all-reduced tensors live (cuda for NCCL)

    @property
    def master(self) -> bool:
        return self.rank == 0


def init_distributed(device_setting: str) -> Dist:
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Dist()
    import torch.distributed as dist

    rank, local = int(os.environ["RANK"]), int(os.environ.get("LOCAL_RANK", "0"))
    owns = False
    if not dist.is_initialized():
        use_cuda = device_setting.startswith("cuda") or (device_setting == "auto" and torch.cuda.is_available())
        if use_cuda:
            torch.cuda.set_device(local)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
        owns = True
    return Dist(rank=rank, world=world, local_rank=local, owns_group=owns)


def barrier(d: Dist) -> None:
    if d.world > 1:
        import torch.distributed as dist

        dist.barrier()


def all_reduce_sum(t: torch.Tensor, d: Dist) -> torch.Tensor:
    if d.world > 1:
        import torch.distributed as dist

        dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t

"""Devices and multi-process training (torch.distributed DDP, launched by ``torchrun``).

``torchrun --nproc_per_node=N -m aligner train ...`` (or ``torchrun $(which align) train ...``)
sets RANK, WORLD_SIZE and LOCAL_RANK; :func:`init_distributed` then joins the process group
(NCCL on CUDA, gloo on CPU). Without those variables everything runs in one process
(rank 0 of 1). Every rank trains on its own shard of each epoch's batches; DDP averages the
gradients; only rank 0 writes files. Rank 0 also prepares the data (BPE, vocabularies, the
encoded corpus) in the model directory, which the other ranks then read: on several nodes the
model directory must be on a shared file system.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from aligner.utils import AlignerError, check_condition


@dataclass
class DistributedContext:
    """Where this process stands: rank in [0, world_size), local_rank = GPU index on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0: the process that logs to the console and writes the model directory."""
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def all_reduce_sum(self, value: torch.Tensor) -> torch.Tensor:
        """Sum of CPU tensor `value` over all ranks (in place; returns it).

        NCCL reduces CUDA tensors only: there the value makes a round trip to the GPU.
        """
        if self.enabled:
            if dist.get_backend() == "nccl":
                on_gpu = value.to(torch.device("cuda", torch.cuda.current_device()))
                dist.all_reduce(on_gpu, op=dist.ReduceOp.SUM)
                value.copy_(on_gpu.cpu())
            else:
                dist.all_reduce(value, op=dist.ReduceOp.SUM)
        return value


def resolve_device(name: str, local_rank: int = 0) -> torch.device:
    """``auto`` = CUDA when available, else CPU; ``cpu``; ``cuda`` / ``cuda:N``.

    Under DDP on CUDA each process uses GPU ``local_rank`` (unless a GPU index is given).
    Asking for CUDA without it is a one-line error.
    """
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        check_condition(torch.cuda.is_available(),
                        f"--device {name}: CUDA is not available on this machine "
                        f"(use --device cpu or auto)")
        device = torch.device(name)
        if device.index is None:
            device = torch.device("cuda", local_rank)
        check_condition(device.index < torch.cuda.device_count(),
                        f"--device {name}: only {torch.cuda.device_count()} CUDA device(s)")
        return device
    raise AlignerError(f"--device must be auto, cpu, cuda or cuda:N (got '{name}')")


def torchrun_world_size() -> int:
    """The number of processes torchrun launched (its WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device_name: str) -> DistributedContext:
    """Join the torchrun process group when launched by torchrun; else a 1-process context.

    The backend is NCCL when the device is CUDA and gloo otherwise. Safe to call twice.
    """
    world_size = torchrun_world_size()
    if world_size <= 1:
        return DistributedContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = resolve_device(device_name, local_rank)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend)
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank)


def shutdown_distributed(context: DistributedContext) -> None:
    """Leave the process group (no-op in a single process)."""
    if context.enabled and dist.is_initialized():
        dist.destroy_process_group()

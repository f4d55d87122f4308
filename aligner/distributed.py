"""Devices and multi-process training (torch.distributed DDP, launched by ``torchrun``).

``torchrun --nproc_per_node=N -m aligner train ...`` (or ``torchrun $(which align) train ...``)
sets RANK, WORLD_SIZE and LOCAL_RANK; :func:`init_distributed` then joins the process group
(NCCL on CUDA, gloo on CPU). Without those variables everything runs in one process
(rank 0 of 1). Every rank trains on its own shard of each epoch's batches; DDP averages the
gradients; only rank 0 writes files. Rank 0 also prepares the data (BPE, vocabularies, the
encoded corpus) in the model directory, which the other ranks then read: on several nodes the
model directory must be on a shared file system.

While rank 0 prepares the data the other ranks wait in a barrier, which on a large corpus
takes longer than torch's default collective timeout (NCCL's watchdog aborts a collective
after 10 minutes): the process group is created with :func:`process_group_timeout`, 4 hours
unless the environment variable ``ALIGNER_DIST_TIMEOUT`` (seconds) says otherwise.

GPUs under torchrun: the process of local rank r uses ``cuda:r`` with ``--device cuda`` or
``auto``, and ``cuda:N+r`` with ``--device cuda:N`` (the node's GPUs from N on, e.g.
``cuda:2`` with 2 processes per node: GPUs 2 and 3); see :func:`device_for_rank`.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Iterator, Optional

import torch
import torch.distributed as dist

from aligner.utils import AlignerError, check_condition


@dataclass
class DistributedContext:
    """Where this process stands: rank in [0, world_size), local_rank = GPU index on its node."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    #: processes on this node (torchrun's LOCAL_WORLD_SIZE)
    local_world_size: int = 1

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


def resolve_device(name: str, local_rank: int = 0, local_world_size: int = 1) -> torch.device:
    """``auto`` = CUDA when available, else CPU; ``cpu``; ``cuda`` / ``cuda:N``.

    Under DDP on CUDA the process of local rank r uses GPU r, or N + r with ``cuda:N``
    (:func:`device_for_rank` on this machine's GPUs). Asking for CUDA without it, or for more
    GPUs than there are, is a one-line error.
    """
    available = torch.cuda.is_available()
    return device_for_rank(name, local_rank, local_world_size, cuda_available=available,
                           device_count=torch.cuda.device_count() if available else 0)


def device_for_rank(name: str, local_rank: int = 0, local_world_size: int = 1, *,
                    cuda_available: bool, device_count: int) -> torch.device:
    """The device of the process of local rank `local_rank` of `local_world_size` processes
    on a node with `device_count` GPUs, for ``--device`` `name` (a pure function: nothing is
    asked of CUDA; :func:`resolve_device` gives it this machine's answers).

    ``auto``: ``cuda`` when `cuda_available`, else ``cpu``. ``cpu``: the CPU for every rank.
    ``cuda``: GPU `local_rank`. ``cuda:N``: GPU N + `local_rank`, so that the node's
    processes take GPUs N .. N + local_world_size - 1 (one process: GPU N, as without
    torchrun); every rank on one GPU would make DDP run the node's processes in turn on it,
    each with a fraction of its memory. One-line AlignerError for another name, CUDA asked
    for without CUDA, or GPUs the node does not have.
    """
    if name == "auto":
        name = "cuda" if cuda_available else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if name == "cuda" or name.startswith("cuda:"):
        check_condition(cuda_available, f"--device {name}: CUDA is not available on this "
                                        f"machine (use --device cpu or auto)")
        index = name[len("cuda:"):] if name != "cuda" else "0"
        check_condition(index.isdigit(), f"--device must be auto, cpu, cuda or cuda:N "
                                         f"(got '{name}')")
        first = int(index)
        # (a launcher without LOCAL_WORLD_SIZE: at least this rank's GPU must exist)
        processes = max(local_world_size, local_rank + 1)
        check_condition(first + processes <= device_count,
                        f"--device {name}: "
                        + (f"{processes} processes per node need GPUs {first} to "
                           f"{first + processes - 1}, " if processes > 1 else "")
                        + f"only {device_count} CUDA device(s)")
        return torch.device("cuda", first + local_rank)
    raise AlignerError(f"--device must be auto, cpu, cuda or cuda:N (got '{name}')")


#: environment variable: seconds a collective (the barrier while rank 0 prepares the data)
#: may wait before torch.distributed gives up (:func:`process_group_timeout`)
TIMEOUT_ENV = "ALIGNER_DIST_TIMEOUT"
#: its default: 4 hours. Rank 0 learns BPE and encodes the corpus in one process; on 2 cores
#: the 25k en-fr pairs take seconds, so 4 hours leaves room for corpora some thousand times
#: larger (not measured), while a rank that really hangs still fails the same day
DEFAULT_TIMEOUT_S = 4 * 3600


def process_group_timeout() -> datetime.timedelta:
    """How long a collective may wait: ``ALIGNER_DIST_TIMEOUT`` seconds, else
    :data:`DEFAULT_TIMEOUT_S`. A value that is not a positive number is a one-line error."""
    raw = os.environ.get(TIMEOUT_ENV, "")
    if not raw.strip():
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    check_condition(seconds > 0, f"{TIMEOUT_ENV}={raw}: must be a positive number of seconds")
    return datetime.timedelta(seconds=seconds)


def torchrun_world_size() -> int:
    """The number of processes torchrun launched (its WORLD_SIZE; 1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def init_distributed(device_name: str,
                     timeout: Optional[datetime.timedelta] = None) -> DistributedContext:
    """Join the torchrun process group when launched by torchrun; else a 1-process context.

    The backend is NCCL when the device is CUDA and gloo otherwise; collectives wait up to
    `timeout` (default :func:`process_group_timeout`). Safe to call twice: a process group
    that exists is kept (see :func:`distributed`).
    """
    world_size = torchrun_world_size()
    if world_size <= 1:
        return DistributedContext()
    rank = int(os.environ["RANK"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    device = resolve_device(device_name, local_rank, local_world_size)
    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":
            torch.cuda.set_device(device)
        dist.init_process_group(backend=backend, timeout=timeout or process_group_timeout())
    return DistributedContext(rank=rank, world_size=world_size, local_rank=local_rank,
                              local_world_size=local_world_size)


def shutdown_distributed(context: DistributedContext) -> None:
    """Leave the process group (no-op in a single process), every rank together: the barrier
    waits with the GIL released, so that gloo's worker threads finish freeing the last
    collective's tensors first. Without it torch 2.4.1's ProcessGroupGloo destructor could join
    a worker thread that waits for the GIL the destructor holds (seen at the end of
    `align extract` and `align run` with 2 gloo ranks under torchrun, tests/test_blocks.py)."""
    if context.enabled and dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


@contextlib.contextmanager
def distributed(device_name: str) -> Iterator[DistributedContext]:
    """:func:`init_distributed` for the block; the process group is left at its end only by
    the block that created it. Nested blocks (stage 1 of a two-stage kind inside the run,
    self-training rounds) share one group: destroying a NCCL group and creating another in
    the same process, on torchrun's store, is a known way to hang."""
    created = torchrun_world_size() > 1 and not dist.is_initialized()
    context = init_distributed(device_name)
    yield context
    if created:
        shutdown_distributed(context)

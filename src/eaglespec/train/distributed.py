"""Data-parallel training across processes: which process this is, and the few collectives the
trainer needs besides DDP's gradient all-reduce.

`torchrun` and `accelerate launch` start one process per device and set RANK, WORLD_SIZE,
LOCAL_RANK, MASTER_ADDR and MASTER_PORT; `process_group` joins them (NCCL on CUDA, gloo on CPU)
when WORLD_SIZE > 1. The trainer keeps the data order, the global batch, the schedule and the
checkpoints of one process: each optimizer step's sequences are split across the processes and
their gradients summed, so N processes make the run that one process makes.

Why DDP and not FSDP or DeepSpeed ZeRO: those shard parameters, gradients and optimizer state,
which pays only when a replica does not fit on a device. An EAGLE head is one decoder layer and
an `fc` (an EAGLE-3 head for an 8B target, with its own LM head, is about 0.4B parameters:
~7 GB with fp32 AdamW state); it fits on any training GPU next to the target, whose frozen
weights are what takes the memory, and a full replica per process keeps every step local but
for one gradient all-reduce.
"""

from __future__ import annotations

import contextlib
import gc
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TypeVar

import torch

from ..errors import EagleError

T = TypeVar("T")


@dataclass(frozen=True)
class Distributed:
    """This process's place among the training processes (one process: rank 0 of 1)."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0  # the device index on this machine

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        """Rank 0 writes the head, checkpoints, metrics and plots, and prints."""
        return self.rank == 0

    @classmethod
    def current(cls) -> "Distributed":
        """The initialised process group, or a single process."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            return cls(torch.distributed.get_rank(), torch.distributed.get_world_size(),
                       int(os.environ.get("LOCAL_RANK", 0)))
        return cls()

    def shard(self, items: list[T]) -> list[T]:
        """This process's share of `items`: every world_size-th, from its rank."""
        return items[self.rank::self.world_size]

    def sum(self, values: list[float], device: torch.device) -> list[float]:
        """Element-wise sum over the processes (float64, so counts stay exact)."""
        if not self.enabled:
            return list(values)
        t = torch.tensor(values, dtype=torch.float64, device=device)
        torch.distributed.all_reduce(t)
        return t.tolist()

    def any(self, flag: bool, device: torch.device) -> bool:
        """True on every process when it is true on one (a decision all must take together)."""
        return self.sum([float(flag)], device)[0] > 0 if self.enabled else flag

    def on_main(self, fn: Callable[[], T]) -> T:
        """Run `fn` on rank 0 only (it touches the file system) and hand its result, or its
        EagleError, to every process, so that all go on or all stop with the same message."""
        if not self.enabled:
            return fn()
        box: list = [None]
        if self.is_main:
            try:
                box[0] = ("ok", fn())
            except EagleError as exc:
                box[0] = ("error", str(exc))
        torch.distributed.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "error":
            raise EagleError(value)
        return value

    def barrier(self) -> None:
        if self.enabled:
            torch.distributed.barrier()


def launched_processes() -> int:
    """WORLD_SIZE as set by torchrun or accelerate launch (1 when started plainly)."""
    try:
        return int(os.environ.get("WORLD_SIZE", "1"))
    except ValueError:
        raise EagleError(f"WORLD_SIZE={os.environ['WORLD_SIZE']!r} is not a number of processes") from None


@contextlib.contextmanager
def process_group(device: str) -> Iterator[tuple[Distributed, str]]:
    """Join the processes that torchrun / accelerate launch started (when WORLD_SIZE > 1) ->
    (this process, its device). On CUDA each process takes the GPU of its LOCAL_RANK, so
    `--device cuda` means "one GPU per process"; on CPU the backend is gloo. The group is left
    on exit. A group that the caller already initialised is used as it is."""
    if launched_processes() <= 1 or (torch.distributed.is_available() and torch.distributed.is_initialized()):
        yield Distributed.current(), device
        return
    if not torch.distributed.is_available():
        raise EagleError("this torch build has no torch.distributed: run one process, or install a torch with it")
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise EagleError(f"WORLD_SIZE is {os.environ['WORLD_SIZE']} but {', '.join(missing)} is not set: start the "
                         "processes with torchrun or accelerate launch")
    local_rank = int(os.environ["LOCAL_RANK"])
    if torch.device(device).type == "cuda":
        if local_rank >= torch.cuda.device_count():
            raise EagleError(f"process {local_rank} on this machine has no GPU of its own ({torch.cuda.device_count()} "
                             "visible): start at most one process per GPU (--nproc_per_node)")
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
        # env://: RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT; device_id binds NCCL to this GPU
        torch.distributed.init_process_group("nccl", device_id=torch.device(device))
    else:
        torch.distributed.init_process_group("gloo")
    try:
        yield Distributed.current(), device
    finally:
        # Anything still holding the group (a DDP reducer in a reference cycle) goes first: a gloo
        # group whose last reference dies while the interpreter shuts down can abort the process
        # ("terminate called without an active exception", seen once in ~10 two-process runs).
        gc.collect()
        torch.distributed.destroy_process_group()

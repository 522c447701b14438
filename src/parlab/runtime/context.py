"""What a rank knows about itself: passed explicitly to every rank function.

The same ``RankContext`` reaches a rank function whether it runs under
torchrun (``parlab.runtime.launch``) or under the test suite's fork helper
(``parlab.runtime.testing``), so project code never branches on which.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch


@dataclass(frozen=True, kw_only=True)
class RankContext:
    """One rank's place in the run."""

    rank: int
    """Global rank."""
    world_size: int
    """Number of ranks in the run."""
    local_rank: int
    """Rank within this node (the GPU index on GPU runs)."""
    local_world_size: int
    """Ranks on this node."""
    backend: str
    """``nccl`` or ``gloo``."""
    device: torch.device
    """``cuda:<local_rank>`` for NCCL, ``cpu`` for gloo."""
    timeout_s: float
    """The process group's timeout in seconds."""

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def is_cuda(self) -> bool:
        return self.device.type == "cuda"

    def sync(self) -> None:
        """Wait for this rank's queued device work (no-op on CPU)."""
        if self.is_cuda:
            torch.cuda.synchronize(self.device)


def limit_cpu_threads(local_world_size: int) -> int:
    """Share the CPU cores among the ranks of this node; return the threads per rank.

    Without this, 4 gloo ranks on 2 cores run ~5x slower (each rank spins up
    one thread per core).
    """
    cores = (
        len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    )
    threads = max(1, cores // max(1, local_world_size))
    torch.set_num_threads(threads)
    return threads

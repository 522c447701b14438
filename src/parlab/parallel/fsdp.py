"""The production paths users run: torch DDP and FSDP2 (``fully_shard``), and hybrid sharding.

Wrapped behind the same interface as parlab's own mechanisms
(``parlab.parallel.data`` / ``parlab.parallel.zero``), so one training loop
and one set of meters measure them all.

What crosses the wire (D = the data-parallel group, or its sub-meshes):

- ``TorchDDP``: torch's reducer all-reduces gradient buckets (``bucket_mb``)
  during backward, overlapped with it; gradients are views of the buckets
  (``gradient_as_bucket_view``), so they cost no second copy.
- ``TorchFSDP``: ``fully_shard`` on every transformer block, then on the
  root. Per block: all-gather of its parameters in ``param_dtype`` before
  forward and (with ``reshard_after_forward``) again before backward;
  reduce-scatter of its gradients in ``reduce_dtype`` after backward. Hybrid
  (HSDP) shards over ``dp_shard`` and replicates over ``dp_replicate``: the
  reduce-scatter runs inside a shard group, then an all-reduce of the
  gradient shard across replicas.

They are step 5 of ``parlab.parallel.compose.parallelize`` (data parallelism, last, after
checkpointing and compile), where the order and its reasons are written.
"""

from __future__ import annotations

import time
from typing import Any

import torch
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.nn.parallel import DistributedDataParallel

from parlab.errors import UsageError
from parlab.parallel.data import OptimizerFactory, Wrapper


class TorchDDP(Wrapper):
    """torch's ``DistributedDataParallel`` behind parlab's mechanism interface."""

    def __init__(
        self,
        model: nn.Module,
        group: Any,
        make_optimizer: OptimizerFactory,
        *,
        bucket_mb: float = 25.0,
    ) -> None:
        dev = next(model.parameters()).device
        ddp = DistributedDataParallel(
            model,
            process_group=group,
            device_ids=[dev] if dev.type == "cuda" else None,
            bucket_cap_mb=bucket_mb,
            gradient_as_bucket_view=True,
        )
        super().__init__(ddp, model, make_optimizer)

    def release_first_buckets(self) -> None:
        """Call once, after the first step: let NCCL drop its hold on the first step's buckets.

        DDP rebuilds its buckets before the second forward while ProcessGroupNCCL still holds
        the first step's all-reduce tensors until its watchdog (polling every 100 ms) sees them
        complete: whether they go before the second step's peak is a race. A GPU sync, 0.5 s
        and one small collective settle it, once, outside the timed steps, so the peak is the
        steady state's (``scripts/gpu/accuracy.sh``). Nothing to do on gloo.
        """
        dev = next(iter(self.params)).device
        if dev.type != "cuda":
            return
        torch.cuda.synchronize(dev)
        time.sleep(0.5)
        torch.distributed.all_reduce(torch.zeros(1, device=dev), group=self.module.process_group)
        torch.cuda.synchronize(dev)

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=False)  # keep the bucket views

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {n: p.detach().float().clone() for n, p in self.module.module.named_parameters()}


class TorchFSDP(Wrapper):
    """FSDP2 (``fully_shard`` per block, then the root) behind parlab's mechanism interface."""

    def __init__(
        self,
        model: nn.Module,
        mesh: Any,
        make_optimizer: OptimizerFactory,
        *,
        param_dtype: torch.dtype | None = None,
        reduce_dtype: torch.dtype | None = torch.float32,
        reshard_after_forward: bool = True,
    ) -> None:
        mp = MixedPrecisionPolicy(param_dtype=param_dtype, reduce_dtype=reduce_dtype)
        for block in model.layers:  # type: ignore[union-attr]
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        # The root (embeddings, final norm, output) is needed again at once by backward: kept.
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
        super().__init__(model, model, make_optimizer)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        return {
            n: p.full_tensor().detach().float().clone() for n, p in self.module.named_parameters()
        }


def hybrid_mesh(device_type: str, world: int, shard: int) -> Any:
    """A 2-D ``(dp_replicate, dp_shard)`` mesh for hybrid sharding (HSDP)."""
    if shard < 1 or world % shard:
        raise UsageError(
            f"--hybrid-shard {shard} does not divide {world} ranks: pick a divisor of the world size"
        )
    return init_device_mesh(
        device_type, (world // shard, shard), mesh_dim_names=("dp_replicate", "dp_shard")
    )

"""DeepSpeed ZeRO-1/2/3 behind parlab's mechanism interface (optional: only where installed).

``DeepSpeedZero`` wraps ``deepspeed.initialize`` with the run's own torch optimizer (fused
AdamW on CUDA: DeepSpeed's FusedAdam would JIT-compile CUDA code at start-up), over the
process group parlab already made (DeepSpeed's ``init_distributed`` finds it initialised and
reuses it). Backward goes through the engine (``engine.backward``), which runs DeepSpeed's
gradient hooks and reductions; ``engine.step`` steps, gathers and clears the gradients.

What DeepSpeed holds (its defaults: ``reduce_bucket_size`` 5e8 elements, ``overlap_comm``
off for stages 1/2 and on for stage 3, ``contiguous_gradients`` on), as seen on gloo CPU ranks
with DeepSpeed 0.19.8:

- Stages 1/2: the parameters of a group flattened into one padded buffer (the model's
  parameters are views of it), in bf16 with ``bf16.enabled``; an fp32 *master* copy of this
  rank's partition of it, which the optimizer steps -- a separate copy in fp32 runs too; the
  optimizer states over the master partition. Both stages reduce gradient buckets by the
  end of backward (through a ``reduce_bucket_size`` buffer in the gradient dtype) and keep only this
  rank's partition of the reduced gradients; at the step it is cast into the master's fp32
  gradient.
- Stage 3: each parameter partitioned by itself (``ceil(numel / N)`` per rank), gathered
  per module in forward and backward; parameters under ``stage3_param_persistence_threshold``
  (1e5 elements) stay gathered on every rank; an fp32 master partition, stepped in sub-groups
  of ``sub_group_size`` (1e9) elements, each with its fp32 gradient only while it steps; a
  flat gradient-partition buffer and a resident ``reduce_bucket_size`` buffer.

What crosses the wire: the collectives of ``torch.distributed`` (reduce-scatter or
all-reduce of gradient buckets, all-gather of updated partitions; stage 3: all-gather of each
module's parameters before its forward and backward), so parlab's comm meter counts them.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parlab.errors import UsageError
from parlab.parallel.data import OptimizerFactory, unique_params
from parlab.runtime.meters import optimizer_tensors

MISSING = "deepspeed is not installed: pip install deepspeed (DS_BUILD_OPS=0 builds it without compiling ops)"


def deepspeed_version() -> str:
    """The installed DeepSpeed's version; ``UsageError`` (one line) when it is not installed."""
    try:
        import deepspeed  # lazy: deepspeed
    except ImportError as exc:
        if exc.name not in (None, "deepspeed"):  # installed, but one of its dependencies is not
            raise UsageError(f"deepspeed does not import: {exc}") from exc
        raise UsageError(MISSING) from exc
    return str(deepspeed.__version__)


REDUCE_BUCKET = 500_000_000
"""DeepSpeed's default ``reduce_bucket_size`` (elements), set explicitly: a buffer this size in
the gradient dtype is allocated for every backward (stages 1/2) or once (stage 3)."""


def ds_config(stage: int, micro_batch: int, world_size: int, *, bf16: bool) -> dict[str, Any]:
    """The DeepSpeed config of one run: ZeRO ``stage``, one micro-batch per step, no clipping."""
    return {
        "train_micro_batch_size_per_gpu": micro_batch,
        "train_batch_size": micro_batch * world_size,
        "gradient_accumulation_steps": 1,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": REDUCE_BUCKET},
        "bf16": {"enabled": bf16},
        "gradient_clipping": 0.0,  # parlab's loop does not clip
        # the run's own torch optimizer (AdamW, or SGD in tests) under ZeRO
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }


def _use_cpu_accelerator() -> None:
    """CPU ranks: DeepSpeed's CPU accelerator (gloo), whatever it detected on this machine, and
    no JIT build of its shared-memory inference all-reduce (training does not use it)."""
    import deepspeed.ops  # lazy: deepspeed
    from deepspeed.accelerator import get_accelerator, set_accelerator  # lazy: deepspeed
    from deepspeed.accelerator.cpu_accelerator import CPU_Accelerator  # lazy: deepspeed

    if get_accelerator()._name != "cpu":
        set_accelerator(CPU_Accelerator())
    if "__compatible_ops__" not in vars(deepspeed.ops):
        from deepspeed.ops.op_builder.all_ops import ALL_OPS  # lazy: deepspeed

        deepspeed.ops.__compatible_ops__ = dict.fromkeys(ALL_OPS, False)


class DeepSpeedZero:
    """DeepSpeed's ZeRO stage 1, 2 or 3 engine behind parlab's mechanism interface."""

    def __init__(
        self,
        model: nn.Module,
        make_optimizer: OptimizerFactory,
        *,
        stage: int,
        micro_batch: int,
        bf16: bool,
        local_rank: int,
    ) -> None:
        assert stage in (1, 2, 3), stage
        deepspeed_version()
        import deepspeed  # lazy: deepspeed

        os.environ.setdefault("LOCAL_RANK", str(local_rank))  # DeepSpeed reads it
        deepspeed.utils.logger.setLevel(logging.WARNING)  # not its per-step info lines
        dev = next(model.parameters()).device
        if dev.type == "cpu":
            _use_cpu_accelerator()
        self.stage = stage
        self.config = ds_config(stage, micro_batch, dist.get_world_size(), bf16=bf16)
        self.engine, self.ds_optimizer, _, _ = deepspeed.initialize(
            model=model, optimizer=make_optimizer(unique_params(model)), config=self.config
        )
        self.module = self.engine.module
        self._meter = False
        self._held: dict[str, list[torch.Tensor | None]] = {}
        self.ds_optimizer.optimizer.register_step_pre_hook(self._before_optimizer_step)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.engine(*args, **kwargs)

    def meter_next_step(self) -> None:
        """Hold the next step's gradients until ``state_items`` (DeepSpeed frees them in its
        step): what backward leaves (``grads``) and the master's fp32 gradient at the
        optimizer step (``master_grads``)."""
        self._meter = True

    def backward(self, loss: torch.Tensor) -> None:
        """``engine.backward``: DeepSpeed's gradient hooks and reductions run inside it."""
        self.engine.backward(loss)
        if self._meter:
            self._held["grads"] = self._grad_tensors()

    def finish_backward(self) -> None:
        """Nothing: ``engine.backward`` has reduced the gradients."""

    def step(self) -> None:
        self.engine.step()  # steps, gathers the updated partitions, clears the gradients

    def zero_grad(self) -> None:
        """Nothing to do (``engine.step`` cleared the gradients); drops what the meter held."""
        self._meter = False
        self._held = {}

    def _before_optimizer_step(self, opt: Any, args: Any, kwargs: Any) -> None:
        """Stage 3 steps its master in sub-groups (``sub_group_size``, 1e9 elements), one
        optimizer step each, holding one sub-group's fp32 gradient at a time: keep the largest."""
        if not self._meter:
            return
        grads = [p.grad for g in opt.param_groups for p in g["params"]]
        size = sum(0 if t is None else t.nbytes for t in grads)
        held = sum(0 if t is None else t.nbytes for t in self._held.get("master_grads", []))
        if size >= held:
            self._held["master_grads"] = grads

    def _grad_tensors(self) -> list[torch.Tensor | None]:
        o = self.ds_optimizer
        out: list[torch.Tensor | None] = [p.grad for p in self.module.parameters()]
        if self.stage == 3:
            out.append(o.grad_partitions_flat_buffer)
            return out
        for grads in o.averaged_gradients.values():
            out += list(grads or [])
        out.append(getattr(o, "grads_in_partition", None))
        return out

    def _master(self) -> list[torch.Tensor]:
        o = self.ds_optimizer
        if self.stage == 3:
            return list(o.fp32_partitioned_groups_flat)
        return list(o.single_partition_of_fp32_groups)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter whole, in fp32 (stage 3: gathered for the copy)."""
        import deepspeed  # lazy: deepspeed

        params = dict(self.module.named_parameters())
        with deepspeed.zero.GatheredParameters(list(params.values()), enabled=self.stage == 3):
            return {n: p.detach().float().clone() for n, p in params.items()}

    def state_items(self) -> dict[str, list[torch.Tensor | None]]:
        o = self.ds_optimizer
        if self.stage == 3:
            params: list[torch.Tensor | None] = list(o.fp16_partitioned_groups_flat)
            params += [p.data for p in self.module.parameters()]  # the persistent ones, whole
        else:
            params = list(o.bit16_groups_flat)
        master = self._master()
        items: dict[str, list[torch.Tensor | None]] = {
            "params": params,
            "grads": self._held.get("grads", []),
            "optimizer": optimizer_tensors(o.optimizer),
        }
        # a master copy apart from the parameters (fp32 stage 3 steps the partitions themselves)
        items["master_params"] = master
        items["master_grads"] = self._held.get("master_grads", [])
        return items

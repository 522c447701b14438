"""ZeRO-1/2/3 from torch.distributed primitives, each beside its naive form.

The model's parameters are grouped into units (``zero_units.default_units``: the
embedding, each transformer block, the final norm with the output
projection), and each unit into one flat fp32 buffer padded to a multiple of
the data-parallel size N (``parlab.parallel.data_comm.FlatUnit``). Rank r owns
chunk r of every unit -- its *shard*, ``ceil(numel / N)`` elements -- and the
optimizer (AdamW, SGD, ...) runs on the shards only, so its state is 1/N.

What crosses the wire, per unit, per step (D = data-parallel group):

=======  ========================================  ==================  =======================
stage    gradients                                 parameters           held per rank
=======  ========================================  ==================  =======================
ZeRO-1   reduce-scatter as soon as the unit's      all-gather after     full params, full
         gradients are ready (async, in place on   the step, fp32       grads, 1/N optimizer
         the flat gradient buffer, overlapping     (async: unit i's
         the rest of backward)                     forward waits for
                                                   its own gather)
ZeRO-2   reduce-scatter as soon as the unit's      all-gather after     full params, 1/N grads,
         gradients are ready (async, overlapping   the step, fp32,      1/N optimizer
         the rest of backward); full grads freed   async as ZeRO-1
ZeRO-3   as ZeRO-2                                 all-gather before    1/N of everything; two
                                                   the unit's forward   units' full params at a
                                                   and again before     time (the one computing
                                                   its backward, in     and the next one, whose
                                                   the compute dtype;   gather is prefetched to
                                                   freed after use      overlap that compute)
=======  ========================================  ==================  =======================

ZeRO-1/2's all-gathers are all issued right after the optimizer step; each unit's
forward pre-hook waits for its own, so the gathers of later units overlap the forward of
earlier ones (``wait_parameters`` waits for all of them).

ZeRO-1/2 with ``param_dtype`` (bf16; DeepSpeed's bf16 recipe, the ledger's ``bf16-master``):
the model's parameters, its gradients and both collectives are in that dtype (half the
bytes of the fp32 form on the wire), and each rank keeps an fp32 *master* copy of its
shard, which the optimizer steps on an fp32 copy of the reduced gradient shard; after
the step the master shard is cast into the rank's chunk of the unit's buffer and
all-gathered. No autocast: the forward runs in the parameters' dtype.

Payload of each collective = the unit's padded flat buffer (``padded x
element size``). Gradients are divided by N before the sum (an average).

Naive forms (``naive=True``), equal in result, simpler and costlier:
ZeRO-1/2 all-reduce the whole gradient and keep their chunk (2x the
reduce-scatter's traffic on a ring); ZeRO-3 gathers every unit at the start
of forward, keeps them through backward and reduce-scatters at the end (the
memory of DDP during the step, the traffic of ZeRO-3).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from parlab.errors import UsageError
from parlab.parallel.data import OptimizerFactory
from parlab.parallel.data_comm import all_gather_, all_reduce_, reduce_scatter_
from parlab.parallel.zero_units import default_units, flat_units, shard_buffers
from parlab.runtime.meters import optimizer_tensors, resize_storage


def _in_backward() -> bool:
    return torch._C._current_graph_task_id() != -1


class ZeroDataParallel:
    """ZeRO stage 1, 2 or 3 over the data-parallel ``group``."""

    MAX_IN_FLIGHT = 2
    """Gradient reduce-scatters outstanding at once (ZeRO-2/3)."""

    def __init__(
        self,
        model: nn.Module,
        group: Any,
        make_optimizer: OptimizerFactory,
        *,
        stage: int,
        naive: bool = False,
        compute_dtype: torch.dtype | None = None,
        param_dtype: torch.dtype | None = None,
    ) -> None:
        if stage not in (1, 2, 3):
            raise UsageError(f"ZeRO stage {stage} does not exist: use 1, 2 or 3")
        if param_dtype is not None and (stage == 3 or naive):
            raise UsageError(
                "bf16 parameters with an fp32 master shard are parlab's ZeRO-1/2 recipe: use "
                "zero1 or zero2 (zero3 gathers in the compute dtype from fp32 shards already)"
            )
        # ZeRO-1/2, bf16-master: parameters and gradients in this dtype, fp32 master shards
        self.param_dtype = param_dtype
        dist = torch.distributed
        self.module = model
        self.group = group
        self.stage = stage
        self.naive = naive
        self.world = dist.get_world_size(group)
        self.rank = dist.get_rank(group)
        # ZeRO-3 gathers parameters in the compute dtype (bf16 on GPUs), like FSDP's param_dtype.
        self.gather_dtype = compute_dtype if stage == 3 and compute_dtype else None
        units = default_units(model)
        self.units = flat_units(model, units, stage=stage, world=self.world, rank=self.rank)
        self.shards, self.full = shard_buffers(
            self.units, stage=stage, gather_dtype=self.gather_dtype, param_dtype=param_dtype
        )
        self.full_grad: list[torch.Tensor | None] = [None] * len(self.units)
        # bf16-master ZeRO-2: each unit's reduced gradient shard in param_dtype
        self.low_grads: list[torch.Tensor | None] = [None] * len(self.units)
        self.optimizer = make_optimizer(self.shards)
        self._unit_of: dict[int, int] = {
            id(p): i for i, u in enumerate(self.units) for p in u.params
        }
        self._ready = [0] * len(self.units)
        # (unit, work, output shard, input buffer kept alive until the work is done)
        self._pending: list[tuple[int, Any, torch.Tensor, torch.Tensor]] = []
        self._reduced: set[int] = set()
        self._inflight: dict[int, Any] = {}  # ZeRO-3: unit -> its prefetched all-gather
        self._param_work: dict[int, Any] = {}  # ZeRO-1/2: unit -> its post-step all-gather
        self._gathered = [False] * len(self.units)  # ZeRO-3: unit's buffer holds its params
        if stage == 1:
            self._bind_flat_grads()
        if not naive:
            for u in self.units:
                for p in u.params:
                    p.register_post_accumulate_grad_hook(self._on_grad_ready)
            self._install_forward_hooks(units)

    # ----- forward ------------------------------------------------------------------------------

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if self.stage == 3 and self.naive:
            for i in range(len(self.units)):
                self._gather(i)
        return self.module(*args, **kwargs)

    def _install_forward_hooks(self, units: list[tuple[str, list[nn.Module]]]) -> None:
        """ZeRO-3: gather unit ``i`` before its forward (prefetching ``i + 1``), release it
        after; ZeRO-1/2: unit ``i``'s forward first waits for its post-step all-gather."""
        names = [u.name for u in self.units]
        for name, modules in units:
            if name not in names:
                continue
            i = names.index(name)
            if self.stage < 3:
                modules[0].register_forward_pre_hook(lambda _m, _a, i=i: self._wait_unit(i))
                continue
            modules[0].register_forward_pre_hook(
                lambda _m, _a, i=i: self._gather(i, prefetch=i + 1)
            )
            modules[-1].register_forward_hook(lambda _m, _a, out, i=i: self._after_forward(i, out))

    def _wait_unit(self, i: int) -> None:
        work = self._param_work.pop(i, None)
        if work is not None:
            work.wait()

    def wait_parameters(self) -> None:
        """Wait for every outstanding post-step all-gather (ZeRO-1/2): the parameters are whole."""
        for i in list(self._param_work):
            self._wait_unit(i)

    def _start_gather(self, i: int) -> None:
        """Launch the async all-gather of unit ``i`` (if it is a unit, absent and not in flight)."""
        if not 0 <= i < len(self.units) or self._gathered[i] or i in self._inflight:
            return
        full = self.full[i]
        assert full is not None
        shard = self.shards[i].detach().to(full.dtype)
        resize_storage(full, full.numel() * full.element_size())
        self._inflight[i] = all_gather_(full, shard, self.group, async_op=True)

    def _gather(self, i: int, prefetch: int | None = None) -> None:
        """Make unit ``i``'s parameters whole (ZeRO-3), then start gathering unit ``prefetch``
        so that its all-gather overlaps unit ``i``'s compute."""
        if not self._gathered[i]:
            self._start_gather(i)
            self._inflight.pop(i).wait()
            self._gathered[i] = True
        if prefetch is not None and not (prefetch > i and _in_backward()):
            self._start_gather(prefetch)  # (no forward prefetch while recomputing in backward)

    def _release(self, i: int) -> None:
        full = self.full[i]
        assert full is not None
        resize_storage(full, 0)
        self._gathered[i] = False

    def _after_forward(self, i: int, out: Any) -> None:
        if _in_backward():  # recomputation inside backward: the parameters are needed next
            return
        self._release(i)
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda grad, i=i: self._gather(i, prefetch=i - 1))

    # ----- backward -----------------------------------------------------------------------------

    def _bind_flat_grads(self) -> None:
        dtype = self.param_dtype or torch.float32
        for i, u in enumerate(self.units):
            g = torch.zeros(u.padded, dtype=dtype, device=self.shards[i].device)
            self.full_grad[i] = g
            u.bind_grads(g)

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        i = self._unit_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.units[i].params):
            self._reduce(i)

    def _reduce(self, i: int) -> None:
        """Start reducing unit ``i``'s gradients (ZeRO-1 in place, ZeRO-2/3 into a shard)."""
        if self.stage == 1:
            self._reduce_unit_in_place(i)
        else:
            self._reduce_unit(i)

    def _reduce_unit_in_place(self, i: int) -> None:
        """ZeRO-1: reduce-scatter unit ``i``'s flat gradient into its own chunk (async)."""
        g = self.full_grad[i]
        assert g is not None
        g.div_(self.world)
        mine = g[self.units[i].shard_slice()]
        work = reduce_scatter_(mine, g, self.group, async_op=True)
        self._pending.append((i, work, mine, g))
        self._reduced.add(i)

    def _unit_grad(self, i: int) -> torch.Tensor:
        u = self.units[i]
        dev = self.shards[i].device
        grads = [
            p.grad if p.grad is not None else torch.zeros(s, device=dev)
            for p, s in zip(u.params, u.shapes, strict=True)
        ]
        flat = u.flatten(grads, dtype=self.param_dtype or torch.float32)
        for p in u.params:
            p.grad = None
        return flat

    def _reduce_unit(self, i: int) -> None:
        """Reduce-scatter unit ``i``'s gradients (ZeRO-2/3); free them (and ZeRO-3's params).

        At most ``MAX_IN_FLIGHT`` reduce-scatters are outstanding: the oldest is waited
        for first, so the full gradients of at most that many units are alive at once.
        """
        while len(self._pending) >= self.MAX_IN_FLIGHT:
            self._wait_oldest()
        flat = self._unit_grad(i).div_(self.world)
        out = torch.empty(self.units[i].shard_numel, dtype=flat.dtype, device=flat.device)
        work = reduce_scatter_(out, flat, self.group, async_op=True)
        self._pending.append((i, work, out, flat))
        self._reduced.add(i)
        if self.stage == 3:
            self._release(i)

    def _wait_oldest(self) -> None:
        i, work, out, _flat = self._pending.pop(0)
        work.wait()
        if self.param_dtype is None:
            self.shards[i].grad = out
            return
        # bf16-master: the optimizer steps the fp32 master on an fp32 copy of the reduced shard
        if self.stage == 2:
            self.low_grads[i] = out
        self.shards[i].grad = out.float()

    def finish_backward(self) -> None:
        """Finish the gradient exchange; every shard's ``.grad`` is then the global average."""
        if self.stage == 1 and self.naive:
            for i, u in enumerate(self.units):
                g = self.full_grad[i]
                assert g is not None
                g.div_(self.world)
                all_reduce_(g, self.group)
                self.shards[i].grad = g[u.shard_slice()]
            return
        if self.naive:
            for i, u in enumerate(self.units):
                g = self._unit_grad(i).div_(self.world)
                if self.stage == 3:
                    reduce_scatter_(g[u.shard_slice()], g, self.group)
                    self._release(i)
                else:
                    all_reduce_(g, self.group)
                self.shards[i].grad = g[u.shard_slice()].clone()
            return
        for i in range(len(self.units)):  # units with unused parameters, in order
            if i not in self._reduced:
                self._reduce(i)
        while self._pending:
            self._wait_oldest()
        self._reduced.clear()
        self._ready = [0] * len(self.units)

    # ----- step ---------------------------------------------------------------------------------

    def step(self) -> None:
        """Update this rank's shards; ZeRO-1/2 then all-gather the full parameters."""
        self.optimizer.step()
        if self.stage == 3:
            for i, work in list(self._inflight.items()):  # gathers of pre-step values: stale
                work.wait()
                self._release(i)
            self._inflight.clear()
            return
        for i, u in enumerate(self.units):
            full = self.full[i]
            assert full is not None
            if self.param_dtype is not None:  # the stepped master, cast into our chunk
                full[u.shard_slice()].copy_(self.shards[i].detach())
            # in place: our chunk; the unit's forward waits for it (naive: wait now)
            work = all_gather_(full, full[u.shard_slice()], self.group, async_op=not self.naive)
            if work is not None:
                self._param_work[i] = work

    def zero_grad(self) -> None:
        if self.stage == 1:
            for g in self.full_grad:
                assert g is not None
                g.zero_()
            if self.param_dtype is not None:  # the fp32 copies the step used
                for s in self.shards:
                    s.grad = None
        else:
            for s in self.shards:
                s.grad = None
            self.low_grads = [None] * len(self.units)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter, whole, in fp32, by name (ZeRO-3 all-gathers: call on every rank)."""
        self.wait_parameters()
        names: dict[int, str] = {}
        for n, p in self.module.named_parameters(remove_duplicate=False):
            names.setdefault(id(p), n)
        out: dict[str, torch.Tensor] = {}
        for i, u in enumerate(self.units):
            full = torch.empty(u.padded, dtype=torch.float32, device=self.shards[i].device)
            all_gather_(full, self.shards[i].detach(), self.group)
            for p, shape, a, b in zip(
                u.params, u.shapes, u.offsets[:-1], u.offsets[1:], strict=True
            ):
                out[names[id(p)]] = full[a:b].view(shape).clone()
        return out

    def state_items(self) -> dict[str, list[torch.Tensor | None]]:
        if self.param_dtype is not None:  # the ledger's bf16-master items
            low: list[torch.Tensor | None] = (
                list(self.full_grad) if self.stage == 1 else list(self.low_grads)
            )
            return {
                "params": list(self.full),
                "grads": low,
                "master_params": list(self.shards),
                "master_grads": [s.grad for s in self.shards],
                "optimizer": optimizer_tensors(self.optimizer),
            }
        params: list[torch.Tensor | None] = list(self.shards)
        if self.stage < 3:
            params += list(self.full)
        grads: list[torch.Tensor | None] = [s.grad for s in self.shards]
        if self.stage == 1:
            grads += list(self.full_grad)
        return {"params": params, "grads": grads, "optimizer": optimizer_tensors(self.optimizer)}

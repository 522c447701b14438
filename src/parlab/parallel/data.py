"""Data parallelism (DDP) from torch.distributed primitives: naive and bucketed.

Every rank holds the whole model, its gradients and its optimizer state
(replicated); each trains on its own slice of the global batch, and the
gradients are averaged so that every replica takes the same step.

- ``DataParallelNaive``: after backward, one ``all_reduce`` per parameter
  gradient (payload: that gradient), blocking, nothing overlapped.
- ``DataParallelBucket``: parameters are grouped, in the reverse order of
  their registration (roughly the order backward produces their gradients),
  into buckets of about ``bucket_bytes``; each parameter's ``.grad`` is a view
  of its bucket's flat buffer. A post-accumulate-grad hook counts the ready
  gradients of a bucket and, when the bucket is full, launches an async
  ``all_reduce`` of the flat buffer (payload: the bucket) that overlaps with
  the rest of the backward pass. ``finish_backward`` waits for all of them.

Per step both move the same bytes: every gradient once (sum of ``numel x
element size``); the bucketed form in fewer, larger messages, overlapped.

Both share the interface ``parlab.parallel.zero`` uses too: call the wrapper
like the model, then ``loss.backward()``, ``finish_backward()``, ``step()``,
``zero_grad()``; ``state_items()`` names the tensors this rank holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from parlab.ledger.sharding import gradient_buckets
from parlab.parallel.data_comm import all_reduce_
from parlab.runtime.meters import optimizer_tensors

OptimizerFactory = Callable[[list[nn.Parameter]], torch.optim.Optimizer]


def unique_params(model: nn.Module) -> list[nn.Parameter]:
    """Trainable parameters, each once (tied weights appear once), in registration order."""
    seen: set[int] = set()
    out = []
    for p in model.parameters():
        if p.requires_grad and id(p) not in seen:
            seen.add(id(p))
            out.append(p)
    return out


class Wrapper:
    """A strategy that wraps ``module`` and steps a plain ``optimizer`` over ``params``."""

    def __init__(
        self, module: nn.Module, model: nn.Module, make_optimizer: OptimizerFactory
    ) -> None:
        """``module`` runs the forward (``model`` itself, or torch's wrapper of it); the
        optimizer steps ``model``'s parameters."""
        self.module = module
        self.params = unique_params(model)
        self.optimizer = make_optimizer(self.params)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def finish_backward(self) -> None:
        """Nothing: the wrapper's reductions have finished by the end of backward."""

    def step(self) -> None:
        self.optimizer.step()

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def state_items(self) -> dict[str, list[torch.Tensor | None]]:
        return {
            "params": list(self.params),
            "grads": [p.grad for p in self.params],
            "optimizer": optimizer_tensors(self.optimizer),
        }


class _Replicated(Wrapper):
    """What the DDP forms share: the model, the group, and a plain optimizer."""

    def __init__(self, model: nn.Module, group: Any, make_optimizer: OptimizerFactory) -> None:
        super().__init__(model, model, make_optimizer)
        self.group = group
        self.world = torch.distributed.get_world_size(group)

    def full_parameters(self) -> dict[str, torch.Tensor]:
        """Every parameter by name (a copy)."""
        return {n: p.detach().clone() for n, p in self.module.named_parameters()}


class DataParallelNaive(_Replicated):
    """DDP, naive: one blocking all-reduce per gradient after backward."""

    def finish_backward(self) -> None:
        for p in self.params:
            if p.grad is None:  # unused this step: its gradient is zero everywhere
                p.grad = torch.zeros_like(p)
            p.grad.div_(self.world)
            all_reduce_(p.grad, self.group)


class DataParallelBucket(_Replicated):
    """DDP, bucketed: async all-reduce of each bucket as soon as its gradients are ready."""

    def __init__(
        self,
        model: nn.Module,
        group: Any,
        make_optimizer: OptimizerFactory,
        *,
        bucket_bytes: int = 25 * 2**20,
    ) -> None:
        super().__init__(model, group, make_optimizer)
        order = list(reversed(self.params))  # roughly the order backward produces gradients
        plan = gradient_buckets([p.numel() * p.element_size() for p in order], bucket_bytes)
        self.buckets: list[list[nn.Parameter]] = [[order[i] for i in b] for b in plan]
        # One flat gradient buffer per bucket; each .grad is a view of it.
        self.flat: list[torch.Tensor] = []
        self._bucket_of: dict[int, int] = {}
        for i, bucket in enumerate(self.buckets):
            flat = torch.zeros(
                sum(p.numel() for p in bucket), dtype=bucket[0].dtype, device=bucket[0].device
            )
            self.flat.append(flat)
            offset = 0
            for p in bucket:
                p.grad = flat[offset : offset + p.numel()].view_as(p)
                offset += p.numel()
                self._bucket_of[id(p)] = i
                p.register_post_accumulate_grad_hook(self._on_grad_ready)
        self._ready = [0] * len(self.buckets)
        self._pending: list[tuple[int, Any]] = []

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        i = self._bucket_of[id(p)]
        self._ready[i] += 1
        if self._ready[i] == len(self.buckets[i]):
            self._launch(i)

    def _launch(self, i: int) -> None:
        self.flat[i].div_(self.world)
        self._pending.append((i, all_reduce_(self.flat[i], self.group, async_op=True)))

    def finish_backward(self) -> None:
        launched = {i for i, _ in self._pending}
        for i in range(len(self.buckets)):  # buckets with unused parameters: reduce now, in order
            if i not in launched:
                self._launch(i)
        for _, work in self._pending:
            work.wait()
        self._pending.clear()
        self._ready = [0] * len(self.buckets)

    def zero_grad(self) -> None:
        for flat in self.flat:
            flat.zero_()

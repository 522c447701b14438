"""The comm meter: every collective a rank issues, its payload, and its time replayed alone.

``CommMeter`` is a dispatch mode that records every ``c10d`` collective issued while it is
active -- parlab's own mechanisms and torch's DDP/FSDP alike, since both go through the
``c10d::*`` dispatcher ops -- with its payload (all-reduce, broadcast: the tensor;
all-gather: the gathered output; reduce-scatter: the scattered input, as nccl-tests counts
sizes). Its time is measured by ``replay``: each recorded collective runs again, alone, on
the same process group with fresh buffers of the same shape, timed with a device synchronize
around it. ``replay_transfer`` does the same for one entry of parlab's own comm log
(``parlab.parallel.tensor_comm.comm_log``: op, bytes, axis). Nothing crosses the wire from
the meter itself except those replays.

The dispatch mode costs Python time per op: use it on one metered step, not on timed steps.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

_FUNCTIONAL_NAMES = {
    "all_reduce": "all_reduce",
    "all_reduce_coalesced": "all_reduce",
    "all_gather_into_tensor": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather",
    "reduce_scatter_tensor": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "broadcast": "broadcast",
    "all_to_all_single": "all_to_all",
}

_OP_NAMES = {
    "allreduce_": "all_reduce",
    "allreduce_coalesced_": "all_reduce",
    "_allgather_base_": "all_gather",
    "allgather_": "all_gather",
    "allgather_into_tensor_coalesced_": "all_gather",
    "_reduce_scatter_base_": "reduce_scatter",
    "reduce_scatter_": "reduce_scatter",
    "reduce_scatter_tensor_coalesced_": "reduce_scatter",
    "broadcast_": "broadcast",
    "reduce_": "reduce",
    "alltoall_base_": "all_to_all",
    "alltoall_": "all_to_all",
    "send": "send",
    "recv_": "recv",
    "recv_any_source_": "recv",
    "gather_": "gather",
    "scatter_": "scatter",
    "barrier": "barrier",
}


def _nbytes(x: Any) -> int:
    return sum(
        t.numel() * t.element_size() for t in tree_flatten(x)[0] if isinstance(t, torch.Tensor)
    )


def _dtype_of(x: Any) -> str:
    for t in tree_flatten(x)[0]:
        if isinstance(t, torch.Tensor):
            return str(t.dtype).removeprefix("torch.")
    return "-"


@dataclass(frozen=True, kw_only=True)
class CollectiveRecord:
    """One collective issued on this rank."""

    op: str
    """``all_reduce``, ``all_gather``, ``reduce_scatter``, ``broadcast``, ``all_to_all``, ..."""
    payload_bytes: int
    """The buffer size nccl-tests would name: gathered output, scattered input, or the tensor."""
    dtype: str
    """Element type of the payload."""
    group_size: int | None
    """Ranks in the process group it ran on."""
    step: int
    """The step it belongs to (``CommMeter.step``)."""


class CommMeter(TorchDispatchMode):
    """Records every ``c10d`` collective issued while active; ``replay`` times them alone."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[CollectiveRecord] = []
        self.step = 0
        self._replay: list[tuple[Any, tuple[Any, ...], dict[str, Any], int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if func.namespace == "c10d":
            self._record(func, args, kwargs)
        elif func.namespace == "_c10d_functional":
            self._record_functional(func, args, kwargs)
        return out

    def _record_functional(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """Functional collectives (``torch.ops._c10d_functional``): payload from the input."""
        name = func._schema.name.split("::")[-1].rstrip("_")
        op = _FUNCTIONAL_NAMES.get(name)
        if op is None:
            return  # wait_tensor and the like
        payload = _nbytes(args[0])
        if op == "all_gather":
            payload *= int(args[1])  # input x group size: the gathered output
        self._append(func, args, kwargs, op=op, payload=payload, group_size=None)

    def _record(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        name = func._schema.name.split("::")[-1]
        op = _OP_NAMES.get(name, name)
        if op == "reduce_scatter":
            payload = _nbytes(args[1])  # the full input being scattered
        elif op == "all_gather":
            payload = _nbytes(args[0])  # the full output being gathered
        else:
            payload = _nbytes(args[0])
        group_size = None
        for a in args:
            if type(a).__name__ == "ScriptObject":
                try:
                    group_size = torch.distributed.ProcessGroup.unbox(a).size()
                    break
                except Exception:
                    continue
        self._append(func, args, kwargs, op=op, payload=payload, group_size=group_size)

    def _append(
        self,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        *,
        op: str,
        payload: int,
        group_size: int | None,
    ) -> None:
        self.records.append(
            CollectiveRecord(
                op=op,
                payload_bytes=payload,
                dtype=_dtype_of(args[0]),
                group_size=group_size,
                step=self.step,
            )
        )
        # Keep shapes, not tensors: a replay needs no memory of the real buffers.
        shapes = tree_map(
            lambda x: (
                ("tensor", tuple(x.shape), x.dtype, x.device) if isinstance(x, torch.Tensor) else x
            ),
            (args, kwargs),
        )
        self._replay.append((func, shapes[0], shapes[1], self.step))

    def by_op(self, step: int | None = None) -> dict[str, dict[str, int]]:
        """``op -> {count, bytes}`` over one step (or all)."""
        out: dict[str, dict[str, int]] = defaultdict(lambda: {"count": 0, "bytes": 0})
        for r in self.records:
            if step is None or r.step == step:
                out[r.op]["count"] += 1
                out[r.op]["bytes"] += r.payload_bytes
        return dict(out)

    def bytes_in_step(self, step: int) -> int:
        return sum(r.payload_bytes for r in self.records if r.step == step)

    def replay(self, step: int, device: torch.device, *, iters: int = 3) -> float:
        """Seconds the collectives of ``step`` take when run again alone, one after another.

        Every rank must call it (the replays are collectives), with the same step.
        """

        def fresh(x: Any) -> Any:
            if isinstance(x, tuple) and len(x) == 4 and x[0] == "tensor":
                return torch.zeros(x[1], dtype=x[2], device=x[3])
            return x

        def is_leaf(x: Any) -> bool:
            return isinstance(x, tuple) and len(x) == 4 and x[0] == "tensor"

        total = 0.0
        for func, args_s, kwargs_s, s in self._replay:
            if s != step:
                continue
            args = tree_map(fresh, args_s, is_leaf=is_leaf)
            kwargs = tree_map(fresh, kwargs_s, is_leaf=is_leaf)
            _wait_all(func(*args, **kwargs))  # warm-up
            _sync(device)
            t0 = time.perf_counter()
            for _ in range(iters):
                _wait_all(func(*args, **kwargs))
            _sync(device)
            total += (time.perf_counter() - t0) / iters
        return total


def _wait_all(out: Any) -> None:
    for x in tree_flatten(out)[0]:
        if type(x).__name__ == "ScriptObject":
            # A boxed c10d Work: unbox it before waiting (calling ``wait`` on the
            # box itself crashed NCCL runs with SIGSEGV).
            work = _unbox_work(x)
            if work is not None:
                work.wait()
        elif isinstance(x, torch.Tensor):  # a functional collective's result
            torch.ops._c10d_functional.wait_tensor(x)


def _unbox_work(x: Any) -> Any:
    try:
        return torch._C._distributed_c10d.Work.unbox(x)
    except (AttributeError, RuntimeError, TypeError):
        return None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def replay_transfer(
    op: str, nbytes: int, group: Any, device: torch.device, dtype: torch.dtype
) -> float:
    """Seconds one transfer of parlab's comm log takes alone on ``group`` (fresh buffers, one
    warm-up, 3 timed repeats): an all-reduce, all-gather or reduce-scatter of ``nbytes``
    (the full buffer), or a ``send_recv``: one ring shift of the payload (both directions)."""
    n = dist.get_world_size(group)
    elems = max(1, nbytes // torch.empty((), dtype=dtype).element_size())

    def once() -> None:
        if op == "all_reduce":
            dist.all_reduce(torch.zeros(elems, dtype=dtype, device=device), group=group)
        elif op == "all_gather":
            out = torch.empty(elems - elems % n, dtype=dtype, device=device)
            dist.all_gather_into_tensor(out, out[: out.numel() // n].clone(), group=group)
        elif op == "reduce_scatter":
            x = torch.zeros(elems - elems % n, dtype=dtype, device=device)
            dist.reduce_scatter_tensor(x[: x.numel() // n].clone(), x, group=group)
        elif n > 1:  # send_recv: to the next rank, from the previous one
            rank = dist.get_rank(group)
            nxt = dist.get_global_rank(group, (rank + 1) % n)
            prv = dist.get_global_rank(group, (rank - 1) % n)
            t = torch.zeros(elems, dtype=dtype, device=device)
            ops = [dist.P2POp(dist.isend, t, nxt, group),
                   dist.P2POp(dist.irecv, torch.empty_like(t), prv, group)]  # fmt: skip
            for w in dist.batch_isend_irecv(ops):
                w.wait()

    once()
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(3):
        once()
    _sync(device)
    return (time.perf_counter() - t0) / 3

"""Meters shared by every project: state bytes, peak memory, step time, throughput, MFU.

What each meter counts, and how:

- ``state_bytes(items)``: the bytes this rank holds for each state item
  (``params``, ``grads``, ``optimizer``, ...), counted from the real tensors,
  each storage once (views of one flat buffer count once; a ``DTensor``
  counts its local shard).
- ``MemoryMeter``: peak memory. On CUDA it is the caching allocator's
  ``max_memory_allocated`` (a cap, when set, is the allocator's per-process
  memory fraction, so running out is a real ``torch.OutOfMemoryError``). On
  the CPU it is the tracked tensor bytes: a dispatch mode registers every
  storage an op creates (and the ones passed to ``track``), a weak finalizer
  subtracts it when the storage dies, and the high-water mark is the peak; a
  cap raises ``torch.OutOfMemoryError`` the moment live bytes pass it.
- ``CommMeter`` (``parlab.runtime.comm_meter``): every collective, and its replayed time.
- ``StepTimer``: step wall time (CUDA events on GPU, ``perf_counter`` on CPU); MFU is
  ``parlab.models.flops.mfu`` against the catalog's peak (``None`` for a device the catalog
  does not know: unknown, never guessed).

The dispatch modes cost Python time per op: on GPUs use them on one metered
step, not on the timed steps.
"""

from __future__ import annotations

import itertools
import statistics
import time
import weakref
from collections.abc import Iterable
from typing import Any

import torch
from torch.utils._python_dispatch import (
    TorchDispatchMode,
    _get_current_dispatch_mode_stack,
    is_traceable_wrapper_subclass,
)
from torch.utils._pytree import tree_flatten

# ---------------------------------------------------------------------------
# State bytes


def _plain_tensors(t: torch.Tensor) -> list[torch.Tensor]:
    """The plain tensors holding ``t``'s data (a DTensor's local shard, ...)."""
    if is_traceable_wrapper_subclass(t):
        attrs, _ = t.__tensor_flatten__()
        out: list[torch.Tensor] = []
        for a in attrs:
            inner = getattr(t, a)
            if isinstance(inner, torch.Tensor):
                out += _plain_tensors(inner)
        return out
    return [t]


def _storage_key(t: torch.Tensor) -> tuple[int, str]:
    s = t.untyped_storage()
    return (s.data_ptr(), str(t.device)) if s.data_ptr() else (id(s), str(t.device))


def count_bytes(tensors: Iterable[torch.Tensor | None], seen: set[Any] | None = None) -> int:
    """Bytes of the storages behind ``tensors``, each storage once (``seen`` spans calls)."""
    seen = set() if seen is None else seen
    total = 0
    for t in tensors:
        if t is None:
            continue
        for p in _plain_tensors(t):
            key = _storage_key(p)
            if key in seen:
                continue
            seen.add(key)
            total += p.untyped_storage().nbytes()
    return total


def state_bytes(items: dict[str, Iterable[torch.Tensor | None]]) -> dict[str, int]:
    """Bytes per state item; a storage already counted under an earlier item is not counted again."""
    seen: set[Any] = set()
    return {name: count_bytes(ts, seen) for name, ts in items.items()}


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    """Every tensor in an optimizer's state (moments, momentum buffers; not scalar steps)."""
    out = []
    for state in opt.state.values():
        for v in state.values():
            if isinstance(v, torch.Tensor) and v.numel() > 1:
                out.append(v)
    return out


# ---------------------------------------------------------------------------
# Memory


class _TensorTracker(TorchDispatchMode):
    """Live and peak bytes of every storage created by an op while active (CPU meter)."""

    def __init__(self, cap_bytes: int | None) -> None:
        super().__init__()
        self.cap_bytes = cap_bytes
        self.live = 0
        self.peak = 0
        self._sizes: dict[int, int] = {}  # id(storage) -> bytes it holds now

    def track(self, tensors: Iterable[torch.Tensor | None]) -> None:
        for t in tensors:
            if t is not None:
                for p in _plain_tensors(t):
                    self._register(p)
        self._check()

    def _register(self, t: torch.Tensor) -> None:
        s = t.untyped_storage()
        key = id(s)
        if key in self._sizes or s.nbytes() == 0:
            return
        self._sizes[key] = 0
        weakref.finalize(s, self._free, key)
        self._set(key, s.nbytes())

    def _set(self, key: int, n: int) -> None:
        self.live += n - self._sizes[key]
        self._sizes[key] = n
        self.peak = max(self.peak, self.live)

    def _free(self, key: int) -> None:
        self.live -= self._sizes.pop(key, 0)

    def resized(self, s: torch.UntypedStorage, n: int) -> None:
        """A storage was resized in place to ``n`` bytes (freed: 0)."""
        key = id(s)
        if key not in self._sizes:
            self._sizes[key] = 0
            weakref.finalize(s, self._free, key)
        self._set(key, n)
        self._check()

    def _check(self) -> None:
        if self.cap_bytes is not None and self.live > self.cap_bytes:
            raise torch.OutOfMemoryError(
                f"out of memory: {self.live} tracked tensor bytes exceed the memory cap of "
                f"{self.cap_bytes} bytes"
            )

    def __enter__(self) -> _TensorTracker:
        # FSDP2 frees and re-allocates its gathered parameters by resizing their storage in
        # place (``storage.resize_(0)``, then ``resize_(n)``), which no dispatched op shows:
        # while tracking, every storage resize is reported too (``resized``)
        orig = torch.UntypedStorage.resize_
        tracker = self

        def resize_(storage: torch.UntypedStorage, nbytes: int) -> Any:
            out = orig(storage, nbytes)
            tracker.resized(storage, int(nbytes))
            return out

        self._orig_resize = orig
        torch.UntypedStorage.resize_ = resize_  # type: ignore[method-assign]
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        torch.UntypedStorage.resize_ = self._orig_resize  # type: ignore[method-assign]
        super().__exit__(*exc)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                for p in _plain_tensors(t):
                    self._register(p)
        self._check()
        return out


def resize_storage(t: torch.Tensor, nbytes: int) -> None:
    """Resize ``t``'s storage in place (0 frees it; views and saved tensors keep pointing at it).

    The trick ZeRO-3 and FSDP use to free gathered parameters that autograd still refers
    to; the CPU memory meter is told, since no op it can see allocates or frees the bytes.
    """
    s = t.untyped_storage()
    if s.nbytes() == nbytes:
        return
    s.resize_(nbytes)
    for mode in _get_current_dispatch_mode_stack():
        if isinstance(mode, _TensorTracker):
            mode.resized(s, nbytes)


class MemoryMeter:
    """Peak memory of this rank: the CUDA allocator on GPU, tracked tensor bytes on CPU.

    Use as a context manager around the steps; ``track`` registers tensors made
    before it (the model, the optimizer). ``cap_bytes`` makes running past it a
    ``torch.OutOfMemoryError``.
    """

    def __init__(self, device: torch.device, *, cap_bytes: int | None = None) -> None:
        self.device = device
        self.cap_bytes = cap_bytes
        self._tracker = None if device.type == "cuda" else _TensorTracker(cap_bytes)
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)
            if cap_bytes is not None:
                total = torch.cuda.get_device_properties(device).total_memory
                torch.cuda.set_per_process_memory_fraction(min(1.0, cap_bytes / total), device)

    @property
    def source(self) -> str:
        return "cuda-allocator" if self._tracker is None else "tracked-tensor-bytes"

    def track(self, tensors: Iterable[torch.Tensor | None]) -> None:
        if self._tracker is not None:
            self._tracker.track(tensors)

    def __enter__(self) -> MemoryMeter:
        if self._tracker is not None:
            self._tracker.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self._tracker is not None:
            self._tracker.__exit__(*exc)

    def peak_bytes(self) -> int:
        if self._tracker is None:
            return int(torch.cuda.max_memory_allocated(self.device))
        return self._tracker.peak

    def peak_reserved_bytes(self) -> int | None:
        """The caching allocator's peak reserved bytes (CUDA; None on the CPU): above the
        peak allocated by what fragmentation and cached free blocks hold."""
        if self._tracker is None:
            return int(torch.cuda.max_memory_reserved(self.device))
        return None

    def alloc_retries(self) -> int | None:
        """cudaMalloc retries so far (CUDA; None on the CPU): each time the caching allocator
        found no free block, it released its cached blocks (``cudaFree``, which synchronizes
        the device) and tried again -- a step near the memory edge that idles the GPU. The
        counter torchtitan's memory monitor reports as ``num_alloc_retries``."""
        if self._tracker is None:
            return int(torch.cuda.memory_stats(self.device).get("num_alloc_retries", 0))
        return None

    def live_bytes(self) -> int:
        if self._tracker is None:
            return int(torch.cuda.memory_allocated(self.device))
        return self._tracker.live

    def release_cap(self) -> None:
        if self._tracker is None and self.cap_bytes is not None:
            torch.cuda.set_per_process_memory_fraction(1.0, self.device)


# ---------------------------------------------------------------------------
# Time, throughput, MFU


class StepTimer:
    """Wall time of each step: CUDA events on GPU (no host sync inside), ``perf_counter`` on CPU."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._marks: list[Any] = []

    def mark(self) -> None:
        """Call before the first timed step and after each one."""
        if self.device.type == "cuda":
            e = torch.cuda.Event(enable_timing=True)
            e.record()
            self._marks.append(e)
        else:
            self._marks.append(time.perf_counter())

    def step_times(self) -> list[float]:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            return [
                a.elapsed_time(b) / 1e3
                for a, b in zip(self._marks[:-1], self._marks[1:], strict=True)
            ]
        return [b - a for a, b in zip(self._marks[:-1], self._marks[1:], strict=True)]


class PhaseTimer:
    """Where each timed step's time goes, by phase, on both sides of the launch queue.

    ``start()`` opens a step; ``mark(phase)`` closes ``phase`` (data, forward, ...). Each mark
    reads the host clock (``perf_counter``: how long the host took to issue the phase, waits
    included) and, on GPU, records a CUDA event (how long the device took from the previous
    mark's point in the queue to this one, idle included). The two differ where the host runs
    ahead of the device (the device's phase ends later than the host's) or the device idles
    waiting for it; a profile (``parlab profile``) tells which. No host sync inside a step: the
    events are read in ``times()``, after the loop."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._steps: list[list[tuple[str, float, Any]]] = []

    def _point(self, phase: str) -> tuple[str, float, Any]:
        event = None
        if self.device.type == "cuda":
            event = torch.cuda.Event(enable_timing=True)
            event.record()
        return phase, time.perf_counter(), event

    def start(self) -> None:
        self._steps.append([self._point("")])

    def mark(self, phase: str) -> None:
        self._steps[-1].append(self._point(phase))

    def times(self) -> dict[str, dict[str, list[float]]]:
        """``{"host": {phase: [seconds per step]}, "device": {...}}`` (device: GPU only)."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
        host: dict[str, list[float]] = {}
        dev: dict[str, list[float]] = {}
        for points in self._steps:
            for (_, t0, e0), (phase, t1, e1) in itertools.pairwise(points):
                host.setdefault(phase, []).append(t1 - t0)
                if e0 is not None and e1 is not None:
                    dev.setdefault(phase, []).append(e0.elapsed_time(e1) / 1e3)
        return {"host": host, **({"device": dev} if dev else {})}


def slowest_rank_steps(results: list[dict[str, Any]], key: str = "step_times") -> list[float]:
    """Each measured step's time over the ranks' ``key`` (``step_times``): a step ends when its
    slowest rank ends."""
    return [max(ts) for ts in zip(*(r[key] for r in results), strict=True)]


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"

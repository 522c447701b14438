"""NCCL called directly through ctypes: the thinnest path from Python to a collective.

Why it exists: issuing one small collective through torch's c10d (``dist.all_reduce`` and
ProcessGroupNCCL) costs the host about as long as the whole op on NVLink
(``benchmarks/collectives_small_probe.py``). nccl-tests calls ``ncclAllReduce`` on a
stream and nothing else. ``DirectComm`` does the same from Python, so parlab can measure
NCCL's own small-message latency, and c10d's per-call overhead as the difference between
the two paths (``parlab collectives --via nccl`` against ``--via torch``).

What crosses the wire, and when:

- set-up (once per ``DirectComm``): the group's first rank makes an ``ncclUniqueId`` (128
  bytes) and ``dist.broadcast_object_list`` sends it to every rank of the torch group;
  then every rank calls ``ncclCommInitRank`` (NCCL's own bootstrap over TCP, then its
  channels over NVLink/PCIe/network): a new NCCL communicator beside torch's;
- each call: exactly the NCCL collective named (``ncclAllReduce``, ``ncclAllGather``,
  ``ncclReduceScatter``, ``ncclBroadcast``, ``ncclReduce``, ``ncclSend``/``ncclRecv`` in a
  ``ncclGroupStart``/``End`` group for the ring exchange and the all-to-all), on the
  tensors given, enqueued on the current CUDA stream (``torch.cuda.current_stream()``'s
  raw handle) and returning before the data moves, as NCCL does. Ranks are the torch
  group's ranks (root 0 is the group's first rank);
- ``close()``: ``ncclCommDestroy``.

What this path skips, on purpose: c10d's work objects, its events and stream fences, the
flight recorder and the watchdog. So there is no timeout detection: a peer that never
arrives hangs this rank until the launcher's wall-clock deadline kills it. It is a
measurement path, not a training path; the sweep runs it only after torch's own process
group has set every rank up, and keeps torch's collectives for its bookkeeping.

The library is the NCCL torch already loaded (``parlab.comm.nccl_library``: its discovery,
the C signatures, the type and reduction codes), so both paths run the same NCCL build.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from parlab.comm.nccl_library import NcclLibrary, load_library, nccl_dtype, nccl_redop
from parlab.errors import UsageError


def _raw_stream_fn(index: int) -> Any:
    """A zero-argument function returning the current stream's ``cudaStream_t`` as an int."""
    raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
    if raw is not None:  # what torch.cuda.current_stream(index).cuda_stream reads, minus the object
        return lambda: raw(index)
    dev = torch.device("cuda", index)
    return lambda: torch.cuda.current_stream(dev).cuda_stream


class DirectComm:
    """An NCCL communicator over the ranks of a torch process group, called without c10d.

    Create it on every rank of ``group`` at the same time (it is a collective call). Each
    method takes CUDA tensors on this rank's device, enqueues one NCCL call (or one group
    of send/recv calls) on the current stream, and returns at once. Use it as a context
    manager, or call ``close()``.
    """

    def __init__(
        self, group: Any = None, *, device: torch.device | None = None, library: str | None = None
    ) -> None:
        if not torch.cuda.is_available():
            raise UsageError(
                "NCCL called directly needs GPUs: this machine has no CUDA device "
                "(use the torch path, --via torch)"
            )
        dev = torch.device(device) if device is not None else torch.device("cuda")
        if dev.type != "cuda":
            raise UsageError(f"NCCL called directly needs a CUDA device, not {dev}")
        if dev.index is None:
            dev = torch.device("cuda", torch.cuda.current_device())
        lib = load_library(library)
        self._attach(group, dev, lib, _raw_stream_fn(dev.index))

    def _attach(self, group: Any, device: torch.device, lib: NcclLibrary, stream: Any) -> None:
        """Join every rank of ``group`` in one NCCL communicator made through ``lib``.

        ``stream``: a zero-argument function returning the ``cudaStream_t`` to enqueue on.
        (``__init__`` passes the real library and the current CUDA stream; the CPU tests
        pass a stand-in library and a CPU device, so this is the one set-up path.)
        """
        self.group = group if group is not None else dist.group.WORLD
        """The torch process group whose ranks this communicator spans."""
        self.rank = dist.get_rank(self.group)
        """This rank within the group (= the NCCL rank)."""
        self.size = dist.get_world_size(self.group)
        """Ranks in the group."""
        self.device = device
        """This rank's device: every tensor passed must live there."""
        self.lib = lib
        """The bound NCCL library."""
        self._nccl = lib.lib
        self._stream = stream
        self._comm: int | None = None
        first = dist.get_global_rank(self.group, 0)
        payload: list[bytes | None] = [lib.unique_id() if self.rank == 0 else None]
        on_gpu = dist.get_backend(self.group) == "nccl"
        dist.broadcast_object_list(
            payload, src=first, group=self.group, device=device if on_gpu else None
        )
        uid = payload[0]
        assert isinstance(uid, bytes), "the unique id did not arrive"
        ctx = torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext()
        with ctx:
            self._comm = lib.comm_init_rank(self.size, uid, self.rank)

    @property
    def version(self) -> tuple[int, int, int]:
        return self.lib.version

    def __enter__(self) -> DirectComm:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Destroy the NCCL communicator (waits for its queued work); idempotent."""
        if self._comm is not None:
            comm, self._comm = self._comm, None
            self.lib.check(self._nccl.ncclCommDestroy(comm), "ncclCommDestroy")

    def _buf(self, t: torch.Tensor) -> int:
        if t.device != self.device or not t.is_contiguous():
            raise ValueError(
                f"NCCL needs contiguous tensors on {self.device}; got {t.device}, "
                f"contiguous={t.is_contiguous()}: move it or call .contiguous()"
            )
        return t.data_ptr()

    def _type(self, t: torch.Tensor) -> int:
        return nccl_dtype(t.dtype, self.lib.version)

    def _call(self, name: str, *args: Any) -> Callable[[], None]:
        """A zero-argument call of NCCL's ``name`` with ``args`` + the current stream, checked."""
        fn = getattr(self._nccl, name)
        stream, check = self._stream, self.lib.check

        def call() -> None:
            if self._comm is None:
                raise RuntimeError(f"{name} on a closed DirectComm")
            result = fn(*args, stream())
            if result:
                check(result, name)

        return call

    def _group(self, calls: list[Callable[[], None]]) -> Callable[[], None]:
        """The ``calls`` between ``ncclGroupStart`` and ``ncclGroupEnd``, as one call."""
        start, end, check = self._nccl.ncclGroupStart, self._nccl.ncclGroupEnd, self.lib.check

        def call() -> None:
            check(start(), "ncclGroupStart")
            try:
                for c in calls:
                    c()
            finally:
                check(end(), "ncclGroupEnd")

        return call

    def prepare(self, call: str, /, *args: Any, **kwargs: Any) -> Callable[[], None]:
        """Validate once; a zero-argument call that enqueues ``call`` on the current stream.

        ``call`` is a method name below (``all_reduce``, ``all_gather``, ``reduce_scatter``,
        ``broadcast``, ``reduce``, ``send``, ``recv``, ``send_recv``, ``all_to_all``) and
        the arguments are that method's. Each call costs the ctypes call and the stream
        lookup only (what a timed loop should repeat); the tensors must stay alive.
        """
        builders = {
            "all_reduce": self._all_reduce,
            "all_gather": self._all_gather,
            "reduce_scatter": self._reduce_scatter,
            "broadcast": self._broadcast,
            "reduce": self._reduce,
            "send": self._send,
            "recv": self._recv,
            "send_recv": self._send_recv,
            "all_to_all": self._all_to_all,
        }
        if call not in builders:
            raise ValueError(f"no NCCL call {call!r}: use one of {', '.join(builders)}")
        if self._comm is None:
            raise RuntimeError("DirectComm is closed")
        return builders[call](*args, **kwargs)

    # --- the calls (each method: prepare, then call once) ------------------------------

    def all_reduce(
        self, tensor: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum"
    ) -> None:
        """``ncclAllReduce``: ``out`` (default: ``tensor``, in place) = op over ranks."""
        self.prepare("all_reduce", tensor, out, op=op)()

    def all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> None:
        """``ncclAllGather``: ``out`` (size x ``inp``) = every rank's ``inp``, in rank order."""
        self.prepare("all_gather", out, inp)()

    def reduce_scatter(self, out: torch.Tensor, inp: torch.Tensor, *, op: str = "sum") -> None:
        """``ncclReduceScatter``: ``out`` = this rank's chunk of op over ranks of ``inp``."""
        self.prepare("reduce_scatter", out, inp, op=op)()

    def broadcast(self, tensor: torch.Tensor, *, root: int = 0) -> None:
        """``ncclBroadcast`` in place: every rank's ``tensor`` = group rank ``root``'s."""
        self.prepare("broadcast", tensor, root=root)()

    def reduce(self, tensor: torch.Tensor, *, root: int = 0, op: str = "sum") -> None:
        """``ncclReduce`` in place: group rank ``root``'s ``tensor`` = op over ranks."""
        self.prepare("reduce", tensor, root=root, op=op)()

    def send(self, tensor: torch.Tensor, peer: int) -> None:
        """``ncclSend`` of ``tensor`` to group rank ``peer`` (pair it with the peer's recv)."""
        self.prepare("send", tensor, peer)()

    def recv(self, tensor: torch.Tensor, peer: int) -> None:
        """``ncclRecv`` into ``tensor`` from group rank ``peer``."""
        self.prepare("recv", tensor, peer)()

    def send_recv(self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> None:
        """One group: send ``send`` to ``dst`` and receive ``recv`` from ``src`` (a ring step)."""
        self.prepare("send_recv", send, dst, recv, src)()

    def all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: Sequence[int] | None = None,
        in_splits: Sequence[int] | None = None,
    ) -> None:
        """All-to-all as one group of send/recv per peer (nccl-tests' alltoall does the same).

        Equal chunks by default (``numel / size`` each); with splits, ``in_splits[j]``
        elements go to rank j and ``out_splits[j]`` come from rank j, in rank order.
        """
        self.prepare("all_to_all", out, inp, out_splits, in_splits)()

    # --- builders: validate and bind the arguments -------------------------------------

    def _all_reduce(
        self, tensor: torch.Tensor, out: torch.Tensor | None = None, *, op: str = "sum"
    ) -> Callable[[], None]:
        out = tensor if out is None else out
        if out.numel() != tensor.numel() or out.dtype != tensor.dtype:
            raise ValueError("all_reduce: out must match the input's numel and dtype")
        return self._call(
            "ncclAllReduce",
            self._buf(tensor),
            self._buf(out),
            tensor.numel(),
            self._type(tensor),
            nccl_redop(op),
            self._comm,
        )

    def _all_gather(self, out: torch.Tensor, inp: torch.Tensor) -> Callable[[], None]:
        if out.numel() != inp.numel() * self.size or out.dtype != inp.dtype:
            raise ValueError("all_gather: out must hold group size x the input's numel")
        return self._call(
            "ncclAllGather",
            self._buf(inp),
            self._buf(out),
            inp.numel(),
            self._type(inp),
            self._comm,
        )

    def _reduce_scatter(
        self, out: torch.Tensor, inp: torch.Tensor, *, op: str = "sum"
    ) -> Callable[[], None]:
        if inp.numel() != out.numel() * self.size or out.dtype != inp.dtype:
            raise ValueError("reduce_scatter: the input must hold group size x out's numel")
        return self._call(
            "ncclReduceScatter",
            self._buf(inp),
            self._buf(out),
            out.numel(),
            self._type(out),
            nccl_redop(op),
            self._comm,
        )

    def _root(self, root: int) -> int:
        if not 0 <= root < self.size:
            raise ValueError(f"root {root} is not a rank of this group of {self.size}")
        return root

    def _broadcast(self, tensor: torch.Tensor, *, root: int = 0) -> Callable[[], None]:
        ptr = self._buf(tensor)
        return self._call(
            "ncclBroadcast",
            ptr,
            ptr,
            tensor.numel(),
            self._type(tensor),
            self._root(root),
            self._comm,
        )

    def _reduce(
        self, tensor: torch.Tensor, *, root: int = 0, op: str = "sum"
    ) -> Callable[[], None]:
        ptr = self._buf(tensor)
        return self._call(
            "ncclReduce",
            ptr,
            ptr,
            tensor.numel(),
            self._type(tensor),
            nccl_redop(op),
            self._root(root),
            self._comm,
        )

    def _send(self, tensor: torch.Tensor, peer: int) -> Callable[[], None]:
        return self._call(
            "ncclSend",
            self._buf(tensor),
            tensor.numel(),
            self._type(tensor),
            self._root(peer),
            self._comm,
        )

    def _recv(self, tensor: torch.Tensor, peer: int) -> Callable[[], None]:
        return self._call(
            "ncclRecv",
            self._buf(tensor),
            tensor.numel(),
            self._type(tensor),
            self._root(peer),
            self._comm,
        )

    def _send_recv(
        self, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int
    ) -> Callable[[], None]:
        return self._group([self._send(send, dst), self._recv(recv, src)])

    def _all_to_all(
        self,
        out: torch.Tensor,
        inp: torch.Tensor,
        out_splits: Sequence[int] | None = None,
        in_splits: Sequence[int] | None = None,
    ) -> Callable[[], None]:
        n = self.size
        if inp.dim() != 1 or out.dim() != 1:
            raise ValueError("all_to_all: give 1-D tensors (flatten them with .view(-1))")
        if in_splits is None:
            if inp.numel() % n:
                raise ValueError("all_to_all: equal chunks need numel divisible by the group size")
            in_splits = [inp.numel() // n] * n
        if out_splits is None:
            if out.numel() % n:
                raise ValueError("all_to_all: equal chunks need numel divisible by the group size")
            out_splits = [out.numel() // n] * n
        if len(in_splits) != n or len(out_splits) != n:
            raise ValueError(f"all_to_all: give {n} input and {n} output splits")
        if sum(in_splits) != inp.numel() or sum(out_splits) != out.numel():
            raise ValueError("all_to_all: the splits must add up to the tensors' numel")
        calls: list[Callable[[], None]] = []
        s_off = r_off = 0
        for j in range(n):
            calls.append(self._send(inp.narrow(0, s_off, in_splits[j]), j))
            calls.append(self._recv(out.narrow(0, r_off, out_splits[j]), j))
            s_off += in_splits[j]
            r_off += out_splits[j]
        return self._group(calls)

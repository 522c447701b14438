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

The library is the NCCL torch already loaded (``find_library``), so both paths run the
same NCCL build: ``PARLAB_NCCL_LIBRARY`` if set, else the ``libnccl.so*`` mapped into this
process (``/proc/self/maps``, after torch's CUDA initialisation), else
``ctypes.util.find_library("nccl")``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from parlab.errors import UsageError

LIBRARY_ENV = "PARLAB_NCCL_LIBRARY"
"""Environment variable naming the NCCL shared library to load (wins over discovery)."""

NCCL_DTYPES: dict[torch.dtype, int] = {
    torch.int8: 0,  # ncclInt8
    torch.uint8: 1,  # ncclUint8
    torch.int32: 2,  # ncclInt32
    torch.int64: 4,  # ncclInt64
    torch.float16: 6,  # ncclFloat16
    torch.float32: 7,  # ncclFloat32
    torch.float64: 8,  # ncclFloat64
    torch.bfloat16: 9,  # ncclBfloat16
    torch.float8_e4m3fn: 10,  # ncclFloat8e4m3 (NCCL >= 2.24)
    torch.float8_e5m2: 11,  # ncclFloat8e5m2 (NCCL >= 2.24)
}
"""torch dtype -> ``ncclDataType_t`` (values from ``nccl.h``)."""

FP8_MIN_VERSION = (2, 24, 0)
"""The first NCCL with the fp8 types."""

NCCL_REDOPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
"""Reduction name -> ``ncclRedOp_t`` (``ncclSum`` .. ``ncclAvg``, values from ``nccl.h``)."""

UNIQUE_ID_BYTES = 128
"""``NCCL_UNIQUE_ID_BYTES``: the size of ``ncclUniqueId``."""


class NcclUniqueId(ctypes.Structure):
    """``ncclUniqueId``: 128 opaque bytes, passed by value to ``ncclCommInitRank``."""

    _fields_ = [("internal", ctypes.c_byte * UNIQUE_ID_BYTES)]


_VP = ctypes.c_void_p
_SIZE = ctypes.c_size_t
_INT = ctypes.c_int

_SIGNATURES: dict[str, list[Any]] = {
    "ncclGetVersion": [ctypes.POINTER(_INT)],
    "ncclGetUniqueId": [ctypes.POINTER(NcclUniqueId)],
    "ncclCommInitRank": [ctypes.POINTER(_VP), _INT, NcclUniqueId, _INT],
    "ncclCommDestroy": [_VP],
    # (sendbuff, recvbuff, count, datatype, op, comm, stream)
    "ncclAllReduce": [_VP, _VP, _SIZE, _INT, _INT, _VP, _VP],
    # (sendbuff, recvbuff, sendcount, datatype, comm, stream)
    "ncclAllGather": [_VP, _VP, _SIZE, _INT, _VP, _VP],
    # (sendbuff, recvbuff, recvcount, datatype, op, comm, stream)
    "ncclReduceScatter": [_VP, _VP, _SIZE, _INT, _INT, _VP, _VP],
    # (sendbuff, recvbuff, count, datatype, root, comm, stream)
    "ncclBroadcast": [_VP, _VP, _SIZE, _INT, _INT, _VP, _VP],
    # (sendbuff, recvbuff, count, datatype, op, root, comm, stream)
    "ncclReduce": [_VP, _VP, _SIZE, _INT, _INT, _INT, _VP, _VP],
    # (buff, count, datatype, peer, comm, stream)
    "ncclSend": [_VP, _SIZE, _INT, _INT, _VP, _VP],
    "ncclRecv": [_VP, _SIZE, _INT, _INT, _VP, _VP],
    "ncclGroupStart": [],
    "ncclGroupEnd": [],
}
"""Every bound function returning ``ncclResult_t`` and its argument types (``nccl.h``)."""


def _mapped_nccl(maps: Path = Path("/proc/self/maps")) -> str | None:
    """The ``libnccl.so*`` file mapped into this process (torch's), or None."""
    if torch.cuda.is_available():
        torch.cuda.init()  # a CUDA build maps its NCCL by now at the latest
    try:
        text = maps.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        path = line.split(maxsplit=5)[-1] if line.count(" ") >= 5 else ""
        if os.path.basename(path).startswith("libnccl.so") and os.path.isfile(path):
            return path
    return None


def check_library_env(environ: dict[str, str] | None = None) -> None:
    """``UsageError`` when ``PARLAB_NCCL_LIBRARY`` is set and names no file (the driver
    checks this before launching; discovery itself runs on the ranks, after CUDA init)."""
    env = os.environ if environ is None else environ
    given = env.get(LIBRARY_ENV)
    if given and not os.path.isfile(given):
        raise UsageError(
            f"NCCL library not found: {LIBRARY_ENV}={given} is not a file; "
            f"set {LIBRARY_ENV}=/path/libnccl.so.2 (needs GPUs)"
        )


def find_library(environ: dict[str, str] | None = None) -> str:
    """The NCCL library to load (see the module docstring); ``UsageError`` if there is none."""
    env = os.environ if environ is None else environ
    check_library_env(env)
    if env.get(LIBRARY_ENV):
        return env[LIBRARY_ENV]
    found = _mapped_nccl() or ctypes.util.find_library("nccl")
    if not found:
        raise UsageError(
            "NCCL library not found: torch has not loaded a libnccl.so and the system has none; "
            f"set {LIBRARY_ENV}=/path/libnccl.so.2 (needs GPUs)"
        )
    return found


class NcclLibrary:
    """The NCCL functions parlab calls, bound with their C signatures; every result checked."""

    def __init__(self, path: str) -> None:
        try:
            self.lib = ctypes.CDLL(path)
        except OSError as e:
            raise UsageError(
                f"NCCL library not loadable: {path} ({e}); set {LIBRARY_ENV}=/path/libnccl.so.2"
            ) from e
        self.path = path
        """Where the library was loaded from."""
        for name, argtypes in _SIGNATURES.items():
            fn = getattr(self.lib, name)
            fn.argtypes = argtypes
            fn.restype = ctypes.c_int
        self.lib.ncclGetErrorString.argtypes = [ctypes.c_int]
        self.lib.ncclGetErrorString.restype = ctypes.c_char_p
        v = _INT()
        self.check(self.lib.ncclGetVersion(ctypes.byref(v)), "ncclGetVersion")
        self.version = version_tuple(v.value)
        """NCCL's (major, minor, patch)."""

    def error_string(self, result: int) -> str:
        raw = self.lib.ncclGetErrorString(result)
        return raw.decode(errors="replace") if raw else "unknown error"

    def check(self, result: int, what: str) -> None:
        """``RuntimeError`` naming the call and NCCL's own message when ``result`` is not 0."""
        if result != 0:
            raise RuntimeError(
                f"{what} failed: {self.error_string(result)} (ncclResult_t {result})"
            )

    def unique_id(self) -> bytes:
        uid = NcclUniqueId()
        self.check(self.lib.ncclGetUniqueId(ctypes.byref(uid)), "ncclGetUniqueId")
        return bytes(uid.internal)

    def comm_init_rank(self, nranks: int, uid: bytes, rank: int) -> int:
        """``ncclCommInitRank`` on the current CUDA device; the ``ncclComm_t`` handle."""
        if len(uid) != UNIQUE_ID_BYTES:
            raise RuntimeError(f"ncclUniqueId must be {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
        comm = _VP()
        self.check(
            self.lib.ncclCommInitRank(
                ctypes.byref(comm), nranks, NcclUniqueId.from_buffer_copy(uid), rank
            ),
            "ncclCommInitRank",
        )
        assert comm.value, "ncclCommInitRank returned success and a null communicator"
        return comm.value


def version_tuple(code: int) -> tuple[int, int, int]:
    """``ncclGetVersion``'s integer -> (major, minor, patch) (two encodings, before/after 2.9)."""
    if code >= 10000:  # NCCL >= 2.9: major * 10000 + minor * 100 + patch
        return code // 10000, (code % 10000) // 100, code % 100
    return code // 1000, (code % 1000) // 100, code % 100


_LOADED: dict[str, NcclLibrary] = {}


def load_library(path: str | None = None) -> NcclLibrary:
    """The bound library at ``path`` (default: ``find_library()``), loaded once per process."""
    path = path or find_library()
    if path not in _LOADED:
        _LOADED[path] = NcclLibrary(path)
    return _LOADED[path]


def nccl_dtype(dtype: torch.dtype, version: tuple[int, int, int] | None = None) -> int:
    """``ncclDataType_t`` of ``dtype``; ``UsageError`` when NCCL (this version) has none."""
    if dtype not in NCCL_DTYPES:
        have = ", ".join(str(d).removeprefix("torch.") for d in NCCL_DTYPES)
        raise UsageError(f"NCCL has no type for {dtype}: use one of {have}")
    if dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and version and version < FP8_MIN_VERSION:
        raise UsageError(
            f"{dtype} needs NCCL >= 2.24 and this NCCL is {'.'.join(map(str, version))}: "
            "use bfloat16"
        )
    return NCCL_DTYPES[dtype]


def nccl_redop(op: str) -> int:
    """``ncclRedOp_t`` of ``sum``/``prod``/``max``/``min``/``avg``."""
    key = op.strip().lower()
    if key not in NCCL_REDOPS:
        raise UsageError(f"unknown reduction {op!r}: use one of {', '.join(NCCL_REDOPS)}")
    return NCCL_REDOPS[key]


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
        import torch.distributed as dist

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

    @contextlib.contextmanager
    def grouped(self) -> Iterator[None]:
        """``ncclGroupStart`` ... ``ncclGroupEnd``: the calls inside launch as one operation."""
        self.lib.check(self._nccl.ncclGroupStart(), "ncclGroupStart")
        try:
            yield
        finally:
            self.lib.check(self._nccl.ncclGroupEnd(), "ncclGroupEnd")

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

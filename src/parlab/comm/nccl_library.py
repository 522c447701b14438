"""NCCL's C library bound through ctypes: discovery, the type and reduction codes, checked calls.

``NcclLibrary`` binds every function ``parlab.comm.nccl_direct.DirectComm`` calls with its C
signature (``nccl.h``) and turns a non-zero ``ncclResult_t`` into a ``RuntimeError`` naming
the call and NCCL's own message. Nothing here crosses the wire.

The library is the NCCL torch already loaded (``find_library``), so both paths run the
same NCCL build: ``PARLAB_NCCL_LIBRARY`` if set, else the ``libnccl.so*`` mapped into this
process (``/proc/self/maps``, after torch's CUDA initialisation), else
``ctypes.util.find_library("nccl")``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
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

"""Which trace events are communication, memory copies or compute; which collective; how many bytes.

GPU kernels follow Holistic Trace Analysis's rule, so the overlap figures
mean the same thing: a kernel whose name starts with ``ncclKernel`` or
``ncclDevKernel`` is communication, one with ``Memcpy``/``Memset`` in its
name is a memory copy, one with ``Sync`` in its name is neither (it waits), everything
else is compute. The collective and its
payload come, by preference, from the metadata the profiler attaches
(``Collective name``, ``In msg nelems``, ``Out msg nelems``, ``dtype``,
``Group size`` on the kernel or on its ``record_param_comms`` CPU op), else
from the kernel name (``ncclDevKernel_AllReduce_Sum_f32_RING_LL``).

On CPU (gloo) there are no kernels: the collectives are the ``gloo:*``
events on gloo's worker threads (the transfer itself; their ``Input Dims``
and ``Input type`` give the payload), else the ``c10d::*`` ops that enqueue
them; compute is the ``aten::`` ops (the wrappers around them -- autograd
nodes, custom autograd Functions, DDP's reducer hooks -- can hold a thread
that is waiting for a collective, so they do not count).
"""

from __future__ import annotations

import math
from typing import Any

COMM = "comm"
MEMORY = "memory"
OTHER = "other"
COMPUTE = "compute"

_DTYPE_BYTES = {
    "float": 4,
    "float32": 4,
    "f32": 4,
    "int": 4,
    "int32": 4,
    "i32": 4,
    "uint32": 4,
    "bfloat16": 2,
    "bf16": 2,
    "half": 2,
    "float16": 2,
    "f16": 2,
    "short": 2,
    "int16": 2,
    "double": 8,
    "float64": 8,
    "f64": 8,
    "long": 8,
    "int64": 8,
    "i64": 8,
    "uint64": 8,
    "u64": 8,
    "char": 1,
    "byte": 1,
    "int8": 1,
    "uint8": 1,
    "i8": 1,
    "u8": 1,
    "int8_t": 1,
    "uint8_t": 1,
    "bool": 1,
    "float8_e4m3fn": 1,
    "float8_e5m2": 1,
    "fp8": 1,
}

# normalised collective names, matched against a name with '_' removed, lower case
_COLLECTIVES = (
    ("reducescatter", "reduce_scatter"),
    ("allgather", "all_gather"),
    ("allreduce", "all_reduce"),
    ("alltoall", "all_to_all"),
    ("broadcast", "broadcast"),
    ("sendrecv", "send_recv"),
    ("barrier", "barrier"),
    ("reduce", "reduce"),
    ("gather", "gather"),
    ("scatter", "scatter"),
    ("send", "send"),
    ("recv", "recv"),
)


def kernel_kind(name: str) -> str:
    """``comm``, ``memory``, ``other`` (synchronisation) or ``compute`` for a GPU kernel or
    copy (HTA's rule)."""
    if name.startswith("ncclDevKernel") or name.startswith("ncclKernel"):
        return COMM
    if "Memcpy" in name or "Memset" in name:
        return MEMORY
    if "Sync" in name:
        return OTHER
    return COMPUTE


COMPUTE_KINDS = (
    "gemm", "attention", "norm", "optimizer", "copy", "elementwise", "reduction", "other",
)  # fmt: skip
"""What a compute kernel (or CPU ATen op) does, for the per-step breakdown of compute time."""

_KIND_RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    # order matters: an attention kernel may say "gemm", a norm backward "elementwise"
    ("attention", ("flash", "fmha", "sdpa", "attention", "dot_do_o", "convert_dq")),
    ("gemm", ("gemm", "nvjet", "cutlass", "xmma", "cublas", "aten::mm", "aten::addmm",
              "aten::bmm", "aten::matmul", "aten::linear", "aten::baddbmm")),
    ("norm", ("layer_norm", "rms_norm", "gammabeta", "batch_norm", "group_norm")),
    ("optimizer", ("fusedoptimizer", "adam", "aten::_fused_", "sgd")),
    ("copy", ("copy", "cat_", "catarray", "chunk_cat", "split_with_sizes", "aten::cat",
              "aten::to", "aten::clone", "aten::contiguous", "fill")),
    ("reduction", ("reduce", "softmax", "nll_loss", "aten::sum", "aten::mean", "cross_entropy")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "multi_tensor_apply",
                     "aten::add", "aten::mul", "aten::silu", "aten::gelu", "aten::div")),
)  # fmt: skip


def compute_kind(name: str) -> str:
    """The ``COMPUTE_KINDS`` entry of a compute kernel or CPU ATen op, by its name (a
    heuristic on cuBLAS/cuDNN/ATen kernel names; ``other`` when no rule matches)."""
    low = name.lower()
    for kind, needles in _KIND_RULES:
        if any(n in low for n in needles):
            return kind
    return "other"


def collective_name(raw: str) -> str:
    """A collective's normalised name (``all_reduce``, ``all_gather``, ...) from any spelling.

    Accepts kernel names (``ncclDevKernel_AllGather_RING_LL``), c10d ops
    (``c10d::_reduce_scatter_base_``), gloo events (``gloo:all_reduce``) and
    profiler metadata (``allreduce``, ``allgather_into_tensor_coalesced``).
    """
    text = raw
    for prefix in ("ncclDevKernel_", "ncclKernel_", "c10d::", "gloo:", "nccl:"):
        if text.startswith(prefix):
            text = text[len(prefix) :]
            break
    if raw.startswith(("ncclDevKernel_", "ncclKernel_")):
        text = text.split("_", 1)[0]  # AllReduce_Sum_f32_RING_LL -> AllReduce
    key = text.replace("_", "").lower()
    for needle, name in _COLLECTIVES:
        if needle in key:
            return name
    return text.split("(", 1)[0].strip("_") or raw


def dtype_bytes(dtype: Any) -> int | None:
    """Bytes per element of a dtype as the profiler spells it (``Float``, ``BFloat16``, ``c10::Half``)."""
    if not isinstance(dtype, str):
        return None
    key = dtype.lower().removeprefix("c10::").removeprefix("torch.").replace(" ", "")
    return _DTYPE_BYTES.get(key)


def payload_from_meta(args: dict[str, Any]) -> int | None:
    """Bytes moved by a collective from the profiler's metadata, nccl-tests' convention.

    The larger of the input and output message (the whole gathered or
    scattered buffer for all-gather and reduce-scatter); ``None`` when the
    metadata is missing.
    """
    size = dtype_bytes(args.get("dtype"))
    n_in = args.get("In msg nelems")
    n_out = args.get("Out msg nelems")
    counts = [int(n) for n in (n_in, n_out) if isinstance(n, (int, float))]
    if size is None or not counts:
        return None
    return max(counts) * size


def payload_from_shapes(args: dict[str, Any], *, largest: bool = False) -> int | None:
    """Bytes of a CPU collective from its recorded input shapes and types.

    ``largest=False`` sums every tensor (a gloo transfer's inputs); ``largest=True``
    takes the largest one (a ``c10d::`` op lists output and input buffers: the
    largest is the gathered or scattered buffer, nccl-tests' size).
    """
    dims = args.get("Input Dims")
    types = args.get("Input type")
    if not isinstance(dims, list) or not isinstance(types, list):
        return None
    total = 0
    found = False
    for shape, typ in zip(dims, types, strict=False):
        size = dtype_bytes(typ)
        if size is None:
            continue
        shapes = shape if shape and isinstance(shape[0], list) else [shape]  # TensorList
        for s in shapes:
            if isinstance(s, list) and all(isinstance(d, int) for d in s):
                n = math.prod(s) * size
                total = max(total, n) if largest else total + n
                found = True
    return total if found else None


def is_cpu_comm(name: str) -> bool:
    """A CPU-side op that belongs to communication (enqueue, transfer or wait)."""
    return (
        name.startswith(("c10d::", "gloo:", "nccl:", "record_param_comms"))
        or "wait" in name.lower()
    )

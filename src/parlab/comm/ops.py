"""What each collective exchanges: sizes, busbw factors, dtypes and the size rounding.

Analytic and tensor-only: nothing here joins a process group. The benchmark
(``parlab.comm.bench``) and the cost model (``parlab.comm.model``) both take
their definitions from this file, so measurement and prediction agree on what
"size" means.

Size and count (as nccl-tests prints them; ``n`` = ranks in the group, ``e`` =
element size in bytes):

=================== =============================== =============== ===========
op                  size S means                    count printed   busbw/algbw
=================== =============================== =============== ===========
all_reduce          the buffer on each rank         S/e             2(n-1)/n
all_gather          the whole gathered buffer       S/(n e)         (n-1)/n
reduce_scatter      the whole buffer scattered      S/(n e)         (n-1)/n
all_to_all          the whole send buffer per rank  S/(n e)         (n-1)/n
all_to_all_uneven   the whole send buffer per rank  S/(n e) (mean)  (n-1)/n
broadcast           the buffer                      S/e             1
reduce              the buffer                      S/e             1
send_recv           the buffer each rank sends      S/e             1
barrier             no payload                      0               -
=================== =============================== =============== ===========

The factors are nccl-tests' (``doc/PERFORMANCE.md`` of NVIDIA/nccl-tests,
"bus bandwidth"): busbw = algbw x factor, algbw = S / time, so busbw is
comparable to the link's peak whatever n is. Ops that split the buffer over
ranks round S *down* to a multiple of n x e (nccl-tests does the same,
``count / nranks``), ``all_to_all_uneven`` to a multiple of n(n+1)/2 x e; a
size that rounds to zero is skipped. Both are reported in the sweep's notes.

Uneven all-to-all split: rank ``r`` sends ``base * ((r + j) % n + 1)``
elements to rank ``j``. Every row and column of that matrix is a permutation
of ``1..n``, so every rank sends and receives the same total S while the
per-peer chunks differ by up to n x.

The exact patterns the benchmark checks results with are in ``parlab.comm.patterns``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from parlab.errors import UsageError

OPS: tuple[str, ...] = (
    "all_reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_to_all_uneven",
    "broadcast",
    "reduce",
    "send_recv",
    "barrier",
)
"""Every op the sweep knows, in the order it runs them."""

ALIASES = {
    "allreduce": "all_reduce",
    "allgather": "all_gather",
    "reducescatter": "reduce_scatter",
    "alltoall": "all_to_all",
    "all_to_allv": "all_to_all_uneven",
    "alltoallv": "all_to_all_uneven",
    "sendrecv": "send_recv",
    "bcast": "broadcast",
}


@dataclass(frozen=True, kw_only=True)
class OpSpec:
    """One collective's semantics as the benchmark and the cost model see them."""

    name: str
    """Canonical name (one of ``OPS``)."""
    factor: str
    """busbw/algbw factor as a formula of n: ``2(n-1)/n``, ``(n-1)/n``, ``1`` or ``-``."""
    split: int
    """What S must be a multiple of, in elements, as a multiple of n (0: no split,
    1: n elements, -1: n(n+1)/2 elements for the uneven all-to-all)."""
    reduces: bool
    """Whether it sums values (needs a reduction-capable dtype)."""
    inplace: str
    """``optional`` (both forms exist), ``always`` (torch's API is in place) or ``never``."""
    nccl_tests: str
    """The matching nccl-tests binary, for comparison."""
    size_meaning: str
    """What the size S counts."""


SPECS: dict[str, OpSpec] = {
    s.name: s
    for s in (
        OpSpec(
            name="all_reduce",
            factor="2(n-1)/n",
            split=0,
            reduces=True,
            inplace="always",
            nccl_tests="all_reduce_perf",
            size_meaning="buffer on each rank",
        ),
        OpSpec(
            name="all_gather",
            factor="(n-1)/n",
            split=1,
            reduces=False,
            inplace="optional",
            nccl_tests="all_gather_perf",
            size_meaning="whole gathered buffer",
        ),
        OpSpec(
            name="reduce_scatter",
            factor="(n-1)/n",
            split=1,
            reduces=True,
            inplace="optional",
            nccl_tests="reduce_scatter_perf",
            size_meaning="whole buffer before scattering",
        ),
        OpSpec(
            name="all_to_all",
            factor="(n-1)/n",
            split=1,
            reduces=False,
            inplace="never",
            nccl_tests="alltoall_perf",
            size_meaning="whole send buffer per rank",
        ),
        OpSpec(
            name="all_to_all_uneven",
            factor="(n-1)/n",
            split=-1,
            reduces=False,
            inplace="never",
            nccl_tests="alltoall_perf (even splits only)",
            size_meaning="whole send buffer per rank (uneven per-peer chunks)",
        ),
        OpSpec(
            name="broadcast",
            factor="1",
            split=0,
            reduces=False,
            inplace="always",
            nccl_tests="broadcast_perf",
            size_meaning="buffer",
        ),
        OpSpec(
            name="reduce",
            factor="1",
            split=0,
            reduces=True,
            inplace="always",
            nccl_tests="reduce_perf",
            size_meaning="buffer",
        ),
        OpSpec(
            name="send_recv",
            factor="1",
            split=0,
            reduces=False,
            inplace="never",
            nccl_tests="sendrecv_perf",
            size_meaning="buffer each rank sends to the next (ring)",
        ),
        OpSpec(
            name="barrier",
            factor="-",
            split=0,
            reduces=False,
            inplace="never",
            nccl_tests="-",
            size_meaning="no payload",
        ),
    )
}


def busbw_factor(op: str, n: int) -> float:
    """nccl-tests' busbw/algbw factor for ``op`` over ``n`` ranks (0 for barrier)."""
    f = SPECS[op].factor
    if f == "2(n-1)/n":
        return 2 * (n - 1) / n
    if f == "(n-1)/n":
        return (n - 1) / n
    if f == "1":
        return 1.0
    return 0.0


def parse_ops(text: str) -> list[str]:
    """``all_reduce,all_gather`` or ``all`` -> canonical op names in run order."""
    names = [t.strip().lower().replace("-", "_") for t in text.split(",") if t.strip()]
    if not names:
        raise UsageError("--op is empty: name ops (e.g. all_reduce,all_gather) or 'all'")
    if "all" in names:
        return list(OPS)
    out = []
    for name in names:
        canon = ALIASES.get(name.replace("_", ""), ALIASES.get(name, name))
        if canon not in SPECS:
            raise UsageError(f"unknown op {name!r}: use 'all' or any of {', '.join(OPS)}")
        if canon not in out:
            out.append(canon)
    return sorted(out, key=OPS.index)


# --- dtypes ---------------------------------------------------------------

DTYPES: dict[str, torch.dtype] = {
    "float": torch.float32,
    "float32": torch.float32,
    "fp32": torch.float32,
    "half": torch.float16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "double": torch.float64,
    "float64": torch.float64,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "int32": torch.int32,
    "int": torch.int32,
    "int64": torch.int64,
    "fp8_e4m3": torch.float8_e4m3fn,
    "fp8_e5m2": torch.float8_e5m2,
}
"""Names accepted by ``-d``: nccl-tests' (float, half, ...) and torch's (float32, bf16, ...)."""

NCCL_TESTS_NAMES = {
    torch.float32: "float",
    torch.float16: "half",
    torch.bfloat16: "bfloat16",
    torch.float64: "double",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.int32: "int32",
    torch.int64: "int64",
    torch.float8_e4m3fn: "f8e4m3",
    torch.float8_e5m2: "f8e5m2",
}

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
"""The fp8 dtypes (gloo has none; NCCL cannot reduce them through torch)."""


def parse_dtype(name: str) -> torch.dtype:
    """A ``-d`` name -> torch dtype; ``UsageError`` naming the accepted ones."""
    key = name.strip().lower()
    if key not in DTYPES:
        raise UsageError(f"unknown dtype {name!r}: use one of {', '.join(DTYPES)}")
    return DTYPES[key]


def dtype_name(dtype: torch.dtype) -> str:
    """The short name printed in the table (nccl-tests' where it has one)."""
    return NCCL_TESTS_NAMES.get(dtype, str(dtype).removeprefix("torch."))


def check_backend_dtype(backend: str, dtype: torch.dtype, ops: list[str]) -> None:
    """``UsageError`` when ``backend`` cannot run ``ops`` in ``dtype``."""
    if dtype in FP8 and backend == "gloo":
        raise UsageError(
            f"dtype {dtype_name(dtype)} is not supported by the gloo backend: "
            "use float, half, bfloat16, double or an integer type on CPU"
        )
    if dtype in FP8 and backend == "nccl":
        bad = [op for op in ops if SPECS[op].reduces]
        if bad:
            raise UsageError(
                f"dtype {dtype_name(dtype)} cannot be reduced by torch's NCCL backend "
                f"({', '.join(bad)}): drop those ops (--op all_gather,...) or use bfloat16"
            )


# --- sizes ----------------------------------------------------------------


def size_range(minbytes: int, maxbytes: int, factor: int) -> list[int]:
    """The requested sizes: ``minbytes``, x ``factor``, ... up to ``maxbytes`` (nccl-tests -b/-e/-f)."""
    if minbytes < 1:
        raise UsageError(f"-b/--minbytes {minbytes} must be at least 1 byte")
    if maxbytes < minbytes:
        raise UsageError(
            f"size range inverted: -b/--minbytes {minbytes} is above -e/--maxbytes {maxbytes}: "
            "swap them"
        )
    if factor < 2:
        raise UsageError(f"-f/--stepfactor {factor} must be a whole number of at least 2")
    sizes = []
    s = minbytes
    while s <= maxbytes:
        sizes.append(s)
        s *= factor
    return sizes


def split_unit(op: str, n: int) -> int:
    """S must be a multiple of this many elements for ``op`` over ``n`` ranks."""
    split = SPECS[op].split
    if split == 1:
        return n
    if split == -1:
        return n * (n + 1) // 2
    return 1


def round_size(op: str, nbytes: int, n: int, elem: int) -> int:
    """``nbytes`` rounded down as nccl-tests does for ``op`` (0: too small to run)."""
    if op == "barrier":
        return 0
    unit = split_unit(op, n) * elem
    return (nbytes // unit) * unit


def op_sizes(op: str, sizes: list[int], n: int, elem: int) -> list[tuple[int, int]]:
    """``(requested, rounded)`` for each size ``op`` runs at: rounded as ``round_size`` does,
    sizes that round to zero or to an earlier size dropped (what the sweep measures)."""
    seen: set[int] = set()
    out = []
    for s in sizes:
        r = round_size(op, s, n, elem)
        if r and r not in seen:
            seen.add(r)
            out.append((s, r))
    return out


def count_of(op: str, nbytes: int, n: int, elem: int) -> int:
    """The element count nccl-tests prints for ``op`` at ``nbytes`` (its ``paramcount``)."""
    if SPECS[op].split != 0:
        return nbytes // elem // n
    return nbytes // elem


def uneven_splits(rank: int, n: int, base: int) -> list[int]:
    """Elements rank ``rank`` sends to each rank in the uneven all-to-all."""
    return [base * ((rank + j) % n + 1) for j in range(n)]


def uneven_base(nbytes: int, n: int, elem: int) -> int:
    """The split unit (elements) for an uneven all-to-all of ``nbytes`` per rank."""
    return nbytes // elem // (n * (n + 1) // 2)

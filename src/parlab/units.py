"""Sizes and durations as people write them.

Inside parlab everything is bytes and seconds. GB/s means 1e9 bytes/s (as
nccl-tests prints it). Sizes given by users accept both binary (KiB, MiB, GiB,
TiB) and decimal (KB, MB, GB, TB) suffixes and mean what they say; a bare
number, or the nccl-tests shorthands ``K``/``M``/``G``, are bytes and binary
multiples respectively (``-e 8G`` is 8 GiB in nccl-tests).
"""

from __future__ import annotations

import re

from parlab.errors import UsageError

_SUFFIX = {
    "": 1,
    "b": 1,
    "k": 1024,
    "m": 1024**2,
    "g": 1024**3,
    "t": 1024**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
}

_SIZE_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(text: str | int) -> int:
    """Parse ``"8"``, ``"64KiB"``, ``"1.5GB"``, ``"8G"`` into bytes."""
    if isinstance(text, int):
        if text < 0:
            raise UsageError(f"size {text} is negative: give a size of 0 or more bytes")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _SUFFIX:
        raise UsageError(
            f"cannot parse size {text!r}: write a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K/M/G mean KiB/MiB/GiB)"
        )
    value = float(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value != int(value):
        raise UsageError(f"size {text!r} is not a whole number of bytes")
    return int(value)


def format_bytes(n: float) -> str:
    """Binary units for memory: ``1.50 GiB``."""
    sign = "-" if n < 0 else ""
    n = abs(n)
    for unit, scale in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= scale:
            return f"{sign}{n / scale:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_seconds(s: float) -> str:
    """``12.3 us``, ``4.56 ms``, ``1.23 s``."""
    if s < 1e-3:
        return f"{s * 1e6:.1f} us"
    if s < 1:
        return f"{s * 1e3:.2f} ms"
    return f"{s:.2f} s"

"""Sizes, counts, degrees, clusters and durations as people write them.

Inside parlab everything is bytes and seconds. GB/s means 1e9 bytes/s (as
nccl-tests prints it). Sizes given by users accept both binary (KiB, MiB, GiB,
TiB) and decimal (KB, MB, GB, TB) suffixes and mean what they say; a bare
number, or the nccl-tests shorthands ``K``/``M``/``G``, are bytes and binary
multiples respectively (``-e 8G`` is 8 GiB in nccl-tests).
"""

from __future__ import annotations

import math
import re
from fractions import Fraction

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
_COUNT_RE = re.compile(r"^\s*\+?([0-9]+)\s*$")
_CLUSTER_RE = re.compile(r"^\s*(?:([0-9]+)\s*[xX*]\s*)?([A-Za-z][A-Za-z0-9._-]{0,39})\s*$")

MAX_VALUE = 2**63 - 1
"""The largest whole number or size parlab takes (a signed 64-bit integer)."""
MAX_WORLD = 2**20
"""The most ranks a layout or cluster may have (1,048,576 GPUs)."""


def shown(text: object, limit: int = 40) -> str:
    """``repr(text)``, cut to ``limit`` characters, for a one-line error message."""
    r = repr(text) if isinstance(text, str) else str(text)
    return r if len(r) <= limit else r[: limit - 4] + "...'"


def parse_size(text: str | int, flag: str = "size") -> int:
    """Parse ``"8"``, ``"64KiB"``, ``"1.5GB"``, ``"8G"`` into bytes (ASCII digits, at most
    ``MAX_VALUE``); ``UsageError`` naming ``flag`` otherwise."""
    if isinstance(text, int):
        if text < 0 or text > MAX_VALUE:
            raise UsageError(f"{flag} {text} is out of range: give 0 to {MAX_VALUE} bytes")
        return text
    m = _SIZE_RE.match(str(text))
    if not m or m.group(2).lower() not in _SUFFIX:
        raise UsageError(
            f"cannot parse {flag} {shown(text)}: write a number with an optional unit "
            "(B, KiB, MiB, GiB, TiB, KB, MB, GB, TB; K/M/G mean KiB/MiB/GiB)"
        )
    if len(m.group(1)) > 40:
        raise UsageError(f"{flag} {shown(text)} is larger than {MAX_VALUE} bytes")
    value = Fraction(m.group(1)) * _SUFFIX[m.group(2).lower()]
    if value.denominator != 1:
        raise UsageError(f"{flag} {shown(text)} is not a whole number of bytes")
    if value > MAX_VALUE:
        raise UsageError(f"{flag} {shown(text)} is larger than {MAX_VALUE} bytes")
    return int(value)


def parse_count(text: str | int, flag: str, *, minimum: int = 1, maximum: int = MAX_VALUE) -> int:
    """A whole number written in ASCII digits, ``minimum`` to ``maximum``; ``UsageError``
    naming ``flag`` otherwise (``²``, ``①`` and Arabic-Indic digits are refused)."""
    if isinstance(text, bool):
        raise UsageError(f"{flag} {shown(text)} is not a whole number")
    if isinstance(text, int):
        value, display = text, str(text)
    else:
        m = _COUNT_RE.match(str(text))
        if not m:
            raise UsageError(
                f"{flag} {shown(text)} is not a whole number: write ASCII digits, e.g. 8"
            )
        digits = m.group(1).lstrip("0") or "0"
        value = int(digits) if len(digits) <= 20 else maximum + 1
        display = digits if len(digits) <= 24 else digits[:20] + "..."
    if not minimum <= value <= maximum:
        raise UsageError(f"{flag} {display} is out of range: give {minimum} to {maximum}")
    return value


def parse_degrees(
    text: str, axes: tuple[str, ...], flag: str, example: str = "dp=8,tp=2"
) -> dict[str, int]:
    """``dp=2,tp=4`` -> ``{"dp": 2, "tp": 4}``: axes from ``axes``, each once, degrees of at
    least 1 in ASCII digits; ``UsageError`` naming ``flag`` otherwise."""
    out: dict[str, int] = {}
    for part in str(text).split(","):
        name, eq, value = part.strip().partition("=")
        name = name.strip().lower()
        if not eq or name not in axes or not _COUNT_RE.match(value):
            raise UsageError(
                f"cannot parse {flag} part {shown(part.strip())}: write axis=degree pairs like "
                f"{example} with axes from {', '.join(axes)}"
            )
        if name in out:
            raise UsageError(f"{flag} {shown(text)} names {name} twice: give each axis once")
        out[name] = parse_count(value, f"{flag} {name}", maximum=MAX_WORLD)
    world = math.prod(out.values())
    if world > MAX_WORLD:
        raise UsageError(f"{flag} {shown(text)} makes {world} ranks: at most {MAX_WORLD}")
    return out


def parse_cluster(text: str, flag: str = "--gpus", *, count: bool = True) -> tuple[int | None, str]:
    """``64xH100`` -> (64, ``"H100"``); ``H100`` -> (None, ``"H100"``). ``count=True``: the
    count is required. The GPU name is checked against the catalog by the caller."""
    m = _CLUSTER_RE.match(str(text or ""))
    if not m or (count and m.group(1) is None):
        shape = "COUNTxGPU, e.g. 64xH100" if count else "[COUNTx]GPU, e.g. H100 or 8xH100"
        raise UsageError(f"{flag} {shown(text)}: write {shape}")
    n = None if m.group(1) is None else parse_count(m.group(1), flag, maximum=MAX_WORLD)
    return n, m.group(2)


def parse_seconds(value: str | float, flag: str = "--timeout") -> float:
    """A duration in seconds: a finite number above 0 (``nan``, ``inf`` are refused)."""
    try:
        seconds = float(value)
    except (TypeError, ValueError, OverflowError):
        raise UsageError(f"{flag} {shown(value)} is not a number of seconds") from None
    if not math.isfinite(seconds) or seconds <= 0:
        raise UsageError(f"{flag} {shown(value)} must be a finite number of seconds above 0")
    return seconds


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

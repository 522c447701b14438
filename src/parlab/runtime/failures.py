"""Turning what went wrong on a rank into a contract ``Failure`` kind."""

from __future__ import annotations

import torch


def classify(exc: BaseException) -> str:
    """``oom``, ``timeout`` or ``crash`` for an exception raised on a rank."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return "oom"
    if isinstance(exc, torch.OutOfMemoryError):
        return "oom"
    text = str(exc).lower()
    if "out of memory" in text:
        return "oom"
    if isinstance(exc, TimeoutError) or "timed out" in text or "timeout" in text:
        return "timeout"
    return "crash"


def one_line(exc: BaseException, limit: int = 300) -> str:
    """The exception as one line a person can read."""
    text = " ".join(str(exc).split()) or type(exc).__name__
    text = f"{type(exc).__name__}: {text}"
    return text if len(text) <= limit else text[: limit - 3] + "..."

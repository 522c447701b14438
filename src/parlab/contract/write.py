"""Writing documents: run ids and times, atomic writes (temp file, fsync, rename), and
``write_result``, which checks a document against the schema before it lands."""

from __future__ import annotations

import contextlib
import datetime as _dt
import json
import math
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

from parlab.contract.document import Document
from parlab.contract.validation import validate


def now_iso() -> str:
    """The current UTC time, ISO 8601 with a ``Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(prefix: str) -> str:
    """``<prefix>-<UTC timestamp>-<6 hex>``: unique, sortable, a safe file name."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in prefix).strip("-.") or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(3)}"


def json_default(obj: Any) -> Any:
    """``json.dumps`` fallback: numpy/torch scalars become numbers, arrays lists, paths strings."""
    if hasattr(obj, "item") and getattr(obj, "ndim", 0) == 0:
        return obj.item()
    if hasattr(obj, "tolist"):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"{type(obj).__name__} is not JSON serialisable")


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` to ``path`` atomically: temp file, fsync, rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _non_finite(data: Any) -> str:
    """The path (``metrics.x.value = inf``) of the first inf or nan in ``data``."""
    stack: list[tuple[str, Any]] = [("", data)]
    while stack:
        where, x = stack.pop()
        if isinstance(x, float) and not math.isfinite(x):
            return f"{where} = {x}"
        if isinstance(x, dict):
            stack.extend((f"{where}.{k}".lstrip("."), v) for k, v in x.items())
        elif isinstance(x, list):
            stack.extend((f"{where}[{i}]", v) for i, v in enumerate(x))
    return "a value"


def write_result(doc: Document, results_dir: str | Path) -> Path:
    """Validate ``doc`` and write it to ``<results_dir>/<project>/<run_id>.json``."""
    data = doc.to_json()
    path = Path(results_dir) / doc.project / f"{doc.run_id}.json"
    try:
        text = json.dumps(data, indent=2, default=json_default, allow_nan=False)
    except ValueError:  # JSON has no inf or nan: say which field of which document
        where = _non_finite(data)
        raise ValueError(f"cannot write {path}: {where} is not a finite number") from None
    validate(json.loads(text))
    atomic_write_text(path, text + "\n")
    return path


def write_document(doc: Document, results_dir: str | Path, *, quiet: bool = False) -> Path:
    """``write_result``, then one line on stderr saying where it went (``quiet``: none): how
    every layer writes a document a person is running."""
    path = write_result(doc, results_dir)
    if not quiet:
        sys.stderr.write(f"wrote {path} ({doc.evidence_level}, {doc.role})\n")
        sys.stderr.flush()
    return path

"""Reading documents back: one file (``read_document``, capped and checked), a results folder
(``read_results``, foreign and corrupt files skipped by name), and the filters and headline
metric the listings use."""

from __future__ import annotations

import gc
import json
import os
import stat
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from parlab.contract.document import EVIDENCE_LEVELS, PROJECTS, ROLES, Document, Metric
from parlab.errors import UsageError


@dataclass(frozen=True)
class Skipped:
    """A file in a results folder that is not a readable contract document."""

    path: Path
    reason: str


@dataclass(frozen=True)
class Entry:
    """A contract document and where it lies."""

    path: Path
    doc: Document


class NotADocument(UsageError):
    """A file given as a document that is not one (a reader skips it with this reason)."""


MAX_DOCUMENT_BYTES = 64 * 2**20
"""Readers skip a file larger than this (a document of the committed results is < 2 MiB)."""
MAX_NESTING = 64
"""Readers skip JSON nested deeper than this (a document nests about 12 deep)."""
STALE_TEMP_S = 3600.0
"""A hidden ``.*.tmp`` file this old is what an interrupted atomic write left: readers remove it."""
NESTED_DEPTH = 4
"""How deep ``read_results(nested=True)`` looks for results folders inside a results folder."""


_BRACKETS = bytes(range(256)).translate(None, b'[]{}"')
"""Every byte but JSON's brackets and quotes (``bytes.translate``'s delete set)."""


def _too_deep(raw: bytes) -> bool:
    """Whether the valid JSON in ``raw`` nests more than ``MAX_NESTING`` containers deep, from
    its bytes alone: escapes dropped, then everything but brackets and quotes, then strings; each
    ``bytes.replace`` pass of ``[]`` then takes one level off. No recursion and no Python loop
    over values: a deep document cannot exhaust the stack, and a long list costs C."""
    if raw.count(b"[") + raw.count(b"{") <= MAX_NESTING:
        return False
    encoding = json.detect_encoding(raw)
    if not encoding.startswith("utf-8"):  # UTF-16/32 (which json.loads accepts) to UTF-8
        raw = raw.decode(encoding).encode()
    text = raw.replace(b"\\\\", b"").replace(b'\\"', b"").translate(None, _BRACKETS)
    text = b"".join(text.split(b'"')[::2]).replace(b"{", b"[").replace(b"}", b"]")
    for _ in range(MAX_NESTING):  # a pass per level: stops at the document's depth (~12)
        shorter = text.replace(b"[]", b"")
        if len(shorter) == len(text):
            break
        text = shorter
    return bool(text)


def _read_capped(path: Path) -> bytes:
    """The bytes of a regular file of at most ``MAX_DOCUMENT_BYTES``; ``NotADocument`` for a FIFO,
    a device, a folder, or a file too large (opened without blocking, checked on the open file)."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as exc:
        raise NotADocument(f"{path}: cannot read: {exc.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise NotADocument(f"{path}: not a regular file (a FIFO, device or folder): not read")
        if st.st_size > MAX_DOCUMENT_BYTES:
            raise NotADocument(
                f"{path}: {st.st_size / 2**20:.0f} MiB, larger than a document can be "
                f"({MAX_DOCUMENT_BYTES // 2**20} MiB): not read"
            )
        chunks, left = [], MAX_DOCUMENT_BYTES + 1
        while left > 0 and (chunk := os.read(fd, min(left, max(st.st_size, 2**16) + 1))):
            chunks.append(chunk)
            left -= len(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)


def read_document(path: str | Path) -> Document:
    """Read one document; ``NotADocument`` (a ``UsageError``) naming the file when it is not
    one: not a regular file, too large, nested too deep, not JSON, not the schema."""
    path = Path(path)
    raw = _read_capped(path)
    try:
        data = json.loads(raw)
    except UnicodeDecodeError:
        raise NotADocument(f"{path}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise NotADocument(f"{path}: corrupt JSON ({exc.msg} at line {exc.lineno})") from None
    except RecursionError:
        raise NotADocument(f"{path}: JSON nested too deep to parse") from None
    if not isinstance(data, dict):
        raise NotADocument(f"{path}: foreign file (a JSON {type(data).__name__}, not a document)")
    if _too_deep(raw):
        raise NotADocument(f"{path}: JSON nested more than {MAX_NESTING} deep: not a document")
    try:
        return Document.from_json(data)
    except ValueError as exc:
        raise NotADocument(f"{path}: {exc}") from None
    except (TypeError, KeyError, AttributeError, RecursionError) as exc:
        raise NotADocument(f"{path}: malformed field ({type(exc).__name__}: {exc})") from None


def _results_folders(root: Path, nested: bool) -> list[Path]:
    """``root``'s project subfolders; ``nested``: also those of results folders inside it (a
    doctor reproduction's ``case/`` and ``healthy/``), at most ``NESTED_DEPTH`` below."""
    out = [root / p for p in PROJECTS if (root / p).is_dir()]
    if not nested:
        return out
    for dirpath, dirnames, _ in os.walk(root):
        depth = len(Path(dirpath).relative_to(root).parts)
        dirnames[:] = sorted(d for d in dirnames if not d.startswith(".") and d not in PROJECTS)
        if depth >= NESTED_DEPTH:
            dirnames[:] = []
        if depth > 0:
            out += [Path(dirpath) / p for p in PROJECTS if (Path(dirpath) / p).is_dir()]
    return out


def _clean_stale_temp(folder: Path, skipped: list[Skipped]) -> None:
    now = time.time()
    for tmp in folder.glob(".*.tmp"):
        try:
            st = tmp.lstat()
            if stat.S_ISREG(st.st_mode) and now - st.st_mtime > STALE_TEMP_S:
                tmp.unlink()
                skipped.append(
                    Skipped(tmp, f"removed: temp file of an interrupted write ({st.st_size} B)")
                )
        except OSError:
            continue


def read_results(
    results_dir: str | Path, *, nested: bool = False, freeze: bool = False
) -> tuple[list[Entry], list[Skipped]]:
    """The documents of a results folder (sorted by creation) and the files skipped, each
    with its reason.

    Reads the ``*.json`` files of the folder's project subfolders (``PAR-TRAINING-STATE/``,
    ...) and nothing else (``nested``: those of results folders inside it too); opens regular
    files only, each at most ``MAX_DOCUMENT_BYTES``, and removes the hidden temp files an
    interrupted write left there more than ``STALE_TEMP_S`` ago.

    The garbage collector pauses while the folder is read (parsed JSON holds no cycles: it would
    only rescan what is kept). ``freeze``: it resumes with what is alive frozen (``gc.freeze``),
    for a caller that holds the documents to its end and then calls ``gc.unfreeze``
    (``build_report``): 10,000 documents are otherwise scanned again by each collection that
    moves them to the oldest generation."""
    root = Path(results_dir)
    if not root.is_dir():
        raise UsageError(
            f"results folder {root} does not exist: run a command that writes documents first, "
            "or give the folder they wrote"
        )
    entries: list[Entry] = []
    skipped: list[Skipped] = []
    collecting = gc.isenabled()
    gc.disable()
    try:
        for folder in _results_folders(root, nested):
            _clean_stale_temp(folder, skipped)
            for name in _json_names(folder):
                path = folder / name
                try:
                    entries.append(Entry(path, read_document(path)))
                except NotADocument as exc:
                    skipped.append(Skipped(path, str(exc).removeprefix(f"{path}: ")))
        entries.sort(key=lambda e: (e.doc.created, e.doc.run_id))
    finally:
        if collecting:
            gc.enable()
    if freeze and collecting:  # only what a finished read holds, never after a failure
        gc.freeze()
    return entries, skipped


def _json_names(folder: Path) -> list[str]:
    """The names of ``folder``'s ``*.json`` entries, hidden ones left out, sorted."""
    try:
        with os.scandir(folder) as it:
            return sorted(e.name for e in it if e.name.endswith(".json") and e.name[0] != ".")
    except OSError:  # a folder it may not list holds no document it can read (as Path.glob)
        return []


# The metric the asset table shows for a document, by preference.
HEADLINE_METRICS = (
    "tokens_per_s_per_gpu",
    "busbw_peak",
    "output_throughput",
    "step_time",
    "peak_memory",
    "exposed_comm_fraction",
    "overflow_rate",
    "sanity_allreduce_ok",
)


def headline(doc: Document) -> tuple[str, Metric] | None:
    """The metric that best sums up a document, for one-line listings."""
    for name in HEADLINE_METRICS:
        if name in doc.metrics:
            return name, doc.metrics[name]
    for name, m in doc.metrics.items():
        return name, m
    return None


def filter_entries(
    entries: Iterable[Entry],
    *,
    project: str | None = None,
    role: str | None = None,
    level: str | None = None,
) -> list[Entry]:
    """Entries matching every filter that is set."""
    for name, value, allowed in (
        ("project", project, PROJECTS),
        ("role", role, ROLES),
        ("level", level, EVIDENCE_LEVELS),
    ):
        if value is not None and value not in allowed:
            raise UsageError(f"unknown {name} {value!r}: use one of {', '.join(allowed)}")
    return [
        e
        for e in entries
        if (project is None or e.doc.project == project)
        and (role is None or e.doc.role == role)
        and (level is None or e.doc.evidence_level == level)
    ]

"""The ``distributed-benchmark/v1`` contract: one JSON document per run.

Every command that measures, predicts or decides writes one ``Document``
through ``write_result``: it is checked (dataclass invariants always, the
shipped JSON Schema too where ``jsonschema`` is installed), then written
atomically -- temp file in the same folder, fsync, rename -- under
``<results>/<project>/<run_id>.json``, so no half-written document can ever
exist. ``read_results`` reads a folder back, reporting foreign or corrupt
files by name and skipping them.

A metric's value may be ``None``: unknown, never guessed (an MFU on a GPU the
catalog does not know, say).
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import functools
import json
import math
import os
import secrets
import stat
import sys
import tempfile
import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from parlab.errors import UsageError

SCHEMA_ID = "distributed-benchmark/v1"

PROJECTS = (
    "PAR-TRAINING-STATE",
    "PAR-MODEL-INTERNAL",
    "PAR-MOE-EXPERT",
    "PAR-DISTRIBUTED-INFERENCE",
    "PAR-COLLECTIVES",
    "PAR-ENV",
)
TASKS = ("T0", "T1", "T2", "T3", "T4", "T5", "T6")
ROLES = ("baseline", "candidate", "failure", "decision")
EVIDENCE_LEVELS = (
    "analytic",
    "cpu-mechanism",
    "env-precheck",
    "real-nccl",
    "real-training",
    "serving-benchmark",
)
FAILURE_KINDS = ("oom", "timeout", "crash", "invalid-input", "unsupported")


@dataclass(frozen=True, kw_only=True)
class Metric:
    """A measured or computed quantity."""

    value: float | None
    """The value; ``None`` means unknown (shown as unknown, never guessed)."""
    unit: str
    """Its unit: ``B``, ``s``, ``GB/s``, ``tokens/s``, ``%``, ``count``, ..."""
    per_rank: list[float | None] | None = None
    """The value on each rank, where it varies by rank."""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"value": self.value, "unit": self.unit}
        if self.per_rank is not None:
            out["per_rank"] = list(self.per_rank)
        return out


@dataclass(frozen=True, kw_only=True)
class Prediction:
    """What an analytic model said before the run."""

    value: float | None
    """The predicted value; ``None`` when the model has no basis for one."""
    unit: str
    """Its unit, the same as the matching metric's."""
    model: str
    """Which model made it (``ledger``, ``alpha-beta:calibration-id``, ...)."""

    def to_json(self) -> dict[str, Any]:
        return {"value": self.value, "unit": self.unit, "model": self.model}


@dataclass(frozen=True, kw_only=True)
class Failure:
    """Why a run failed."""

    kind: str
    """``oom``, ``timeout``, ``crash``, ``invalid-input`` or ``unsupported``."""
    message: str
    """One line a person can act on."""
    rank: int | None = None
    """The rank that failed first, where one did."""

    def __post_init__(self) -> None:
        if self.kind not in FAILURE_KINDS:
            raise ValueError(f"failure kind {self.kind!r} is not one of {', '.join(FAILURE_KINDS)}")


@dataclass(frozen=True, kw_only=True)
class Decision:
    """The outcome of ``parlab decide`` (role ``decision`` only)."""

    chosen: str | None
    """The chosen candidate's name (or run_id); ``None`` if none qualifies."""
    rejected: list[dict[str, str]]
    """``[{candidate, reason}, ...]``."""
    rests_on: list[str]
    """The run_ids the decision rests on."""
    reason: str = ""
    """Why the chosen one was chosen."""


@dataclass(frozen=True, kw_only=True)
class Document:
    """One ``distributed-benchmark/v1`` document (see DESIGN.md, "The contract")."""

    run_id: str
    """Unique id; also the file name."""
    created: str
    """ISO 8601 UTC time the run ended."""
    project: str
    """One of ``PROJECTS``."""
    task: str
    """``T0`` ... ``T6``."""
    role: str
    """``baseline``, ``candidate``, ``failure`` or ``decision``."""
    evidence_level: str
    """One of ``EVIDENCE_LEVELS``."""
    command: str
    """The exact command line that reproduces the run."""
    environment: dict[str, Any]
    """Hardware and software snapshot (``parlab.hardware.env.snapshot``)."""
    workload: dict[str, Any]
    """Model, batch, sequence, steps, dataset or request trace."""
    layout: dict[str, Any]
    """``world_size``, ``mesh`` (axis -> degree), ``strategy`` and its knobs."""
    metrics: dict[str, Metric]
    """Name -> measured or computed metric."""
    status: str = "ok"
    """``ok`` or ``failed``."""
    predictions: dict[str, Prediction] = field(default_factory=dict)
    """Name -> what the analytic model predicted, before the run."""
    failure: Failure | None = None
    """Why it failed (required when ``status`` is ``failed``)."""
    decision: Decision | None = None
    """The decision (role ``decision`` only)."""
    artifacts: dict[str, str] = field(default_factory=dict)
    """Files written beside the document, relative to its folder."""
    notes: list[str] = field(default_factory=list)
    """Short remarks a reader needs (roundings applied, assumptions)."""

    def __post_init__(self) -> None:
        checks = (
            ("project", self.project, PROJECTS),
            ("task", self.task, TASKS),
            ("role", self.role, ROLES),
            ("evidence_level", self.evidence_level, EVIDENCE_LEVELS),
            ("status", self.status, ("ok", "failed")),
        )
        for name, value, allowed in checks:
            if value not in allowed:
                raise ValueError(f"{name} {value!r} is not one of {', '.join(allowed)}")
        if self.status == "failed" and self.failure is None:
            raise ValueError("a failed document needs a failure")
        if self.role == "failure" and self.status != "failed":
            raise ValueError("a document with role 'failure' must have status 'failed'")
        if self.role == "decision" and self.decision is None:
            raise ValueError("a document with role 'decision' needs a decision")
        if "world_size" not in self.layout:
            raise ValueError("layout needs world_size")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SCHEMA_ID,
            "run_id": self.run_id,
            "created": self.created,
            "project": self.project,
            "task": self.task,
            "role": self.role,
            "evidence_level": self.evidence_level,
            "command": self.command,
            "environment": self.environment,
            "workload": self.workload,
            "layout": self.layout,
            "metrics": {k: m.to_json() for k, m in self.metrics.items()},
            "status": self.status,
        }
        if self.predictions:
            out["predictions"] = {k: p.to_json() for k, p in self.predictions.items()}
        if self.failure is not None:
            out["failure"] = asdict(self.failure)
        if self.decision is not None:
            out["decision"] = asdict(self.decision)
        if self.artifacts:
            out["artifacts"] = dict(self.artifacts)
        if self.notes:
            out["notes"] = list(self.notes)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Document:
        """Build a document from parsed JSON; ``ValueError`` if it is not one."""
        if data.get("schema") != SCHEMA_ID:
            raise ValueError(f"not a {SCHEMA_ID} document (schema={data.get('schema')!r})")
        validate(data)
        failure = data.get("failure")
        decision = data.get("decision")
        return cls(
            run_id=data["run_id"],
            created=data["created"],
            project=data["project"],
            task=data["task"],
            role=data["role"],
            evidence_level=data["evidence_level"],
            command=data["command"],
            environment=dict(data["environment"]),
            workload=dict(data["workload"]),
            layout=dict(data["layout"]),
            metrics={k: Metric(**v) for k, v in data["metrics"].items()},
            status=data["status"],
            predictions={k: Prediction(**v) for k, v in data.get("predictions", {}).items()},
            failure=Failure(**failure) if failure else None,
            decision=Decision(**decision) if decision else None,
            artifacts=dict(data.get("artifacts", {})),
            notes=list(data.get("notes", [])),
        )

    def metric(self, name: str) -> float | None:
        """The value of metric ``name``, or ``None`` when absent or unknown."""
        m = self.metrics.get(name)
        return None if m is None else m.value


def now_iso() -> str:
    """The current UTC time, ISO 8601 with a ``Z``."""
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def new_run_id(prefix: str) -> str:
    """``<prefix>-<UTC timestamp>-<6 hex>``: unique, sortable, a safe file name."""
    stamp = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
    safe = "".join(c if c.isalnum() or c in "._-" else "-" for c in prefix).strip("-.") or "run"
    return f"{safe}-{stamp}-{secrets.token_hex(3)}"


def schema() -> dict[str, Any]:
    """The JSON Schema that ships with the package."""
    text = resources.files("parlab").joinpath("schema/distributed-benchmark-v1.schema.json")
    return json.loads(text.read_text())


@functools.cache
def _validator() -> Any:
    """The schema's validator, its own schema checked once (``jsonschema.validate`` checks it
    again on every call: 20 of the 22 s it took to read 457 documents); None without
    ``jsonschema``."""
    try:
        import jsonschema
    except ImportError:
        return None
    body = schema()
    cls = jsonschema.validators.validator_for(body)
    cls.check_schema(body)
    return cls(body)


def validate(data: Mapping[str, Any]) -> None:
    """Validate against the JSON Schema where ``jsonschema`` is installed.

    The dataclass invariants hold regardless; the GPU machines' image has no
    ``jsonschema``, and parlab must run there from the source tree.
    """
    validator = _validator()
    if validator is None:
        return
    from jsonschema.exceptions import best_match

    exc = best_match(validator.iter_errors(dict(data)))
    if exc is not None:  # the error jsonschema.validate would raise
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise ValueError(
            f"document fails the {SCHEMA_ID} schema at {where}: {exc.message}"
        ) from None


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


def _nesting(data: Any) -> int:
    """How deeply ``data`` nests (iteratively: a deep document must not exhaust the stack)."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        x, d = stack.pop()
        deepest = max(deepest, d)
        if deepest > MAX_NESTING:
            break
        if isinstance(x, dict):
            stack.extend((v, d + 1) for v in x.values())
        elif isinstance(x, list):
            stack.extend((v, d + 1) for v in x)
    return deepest


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
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(MAX_DOCUMENT_BYTES + 1)
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
    if _nesting(data) > MAX_NESTING:
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
    results_dir: str | Path, *, nested: bool = False
) -> tuple[list[Entry], list[Skipped]]:
    """The documents of a results folder (sorted by creation) and the files skipped, each
    with its reason.

    Reads the ``*.json`` files of the folder's project subfolders (``PAR-TRAINING-STATE/``,
    ...) and nothing else (``nested``: those of results folders inside it too); opens regular
    files only, each at most ``MAX_DOCUMENT_BYTES``, and removes the hidden temp files an
    interrupted write left there more than ``STALE_TEMP_S`` ago."""
    root = Path(results_dir)
    if not root.is_dir():
        raise UsageError(
            f"results folder {root} does not exist: run a command that writes documents first, "
            "or give the folder they wrote"
        )
    entries: list[Entry] = []
    skipped: list[Skipped] = []
    for folder in _results_folders(root, nested):
        _clean_stale_temp(folder, skipped)
        for path in sorted(folder.glob("*.json")):
            if path.name.startswith("."):
                continue
            try:
                entries.append(Entry(path, read_document(path)))
            except NotADocument as exc:
                skipped.append(Skipped(path, str(exc).removeprefix(f"{path}: ")))
    entries.sort(key=lambda e: (e.doc.created, e.doc.run_id))
    return entries, skipped


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

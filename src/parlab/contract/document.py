"""The ``distributed-benchmark/v1`` document as dataclasses: ``Document`` and the ``Metric``,
``Prediction``, ``Failure`` and ``Decision`` it holds, with the vocabulary each field allows."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from parlab.contract.validation import SCHEMA_ID, validate

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

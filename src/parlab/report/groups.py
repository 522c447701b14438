"""Like for like: which documents ran the same job, what tells their configurations apart,
and how repeats of one configuration become one entry with a spread.

A *job* is what a run was asked to do (model, sequence, global batch, GPU model, ranks, request
trace ...), named per project by ``JOB_FIELDS``; documents of one job and one evidence level
are comparable. A *configuration* is how it was done: the strategy plus every knob that varies
inside the job (``labels``). Runs of one configuration are repeats: one ``Spread``.
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from parlab.contract import Document


def field(doc: Document, path: str) -> Any:
    """A value by dotted path: ``workload.model`` (a model's name), ``layout.knobs.dtype``,
    ``gpu`` (the first GPU's name)."""
    if path == "gpu":
        gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or []
        return str(gpus[0].get("name")) if gpus else "no GPU"
    keys = path.split(".")
    value: Any = doc.workload if keys[0] == "workload" else doc.layout
    for key in keys[1:]:
        if not isinstance(value, dict):
            return None
        value = value.get(key)
    if path == "workload.model" and isinstance(value, dict):
        return value.get("name")
    return value


JOB_FIELDS: dict[str, tuple[str, ...]] = {
    "PAR-TRAINING-STATE": (
        "workload.model",
        "workload.seq",
        "workload.global_batch",
        "workload.dataset.kind",
        "workload.optimizer",
        "layout.world_size",
        "gpu",
    ),
    "PAR-MODEL-INTERNAL": (
        "workload.model",
        "workload.seq",
        "workload.global_batch",
        "workload.dtype",
        "gpu",
    ),
    "PAR-MOE-EXPERT": (
        "workload.tokens_per_rank",
        "workload.hidden",
        "workload.ffn_hidden",
        "workload.dtype",
        "layout.experts",
        "layout.top_k",
        "layout.capacity_factor",
        "layout.drop_policy",
        "layout.world_size",
        "gpu",
    ),
    "PAR-DISTRIBUTED-INFERENCE": (
        "workload.dataset",
        "workload.dataset_params.input_len",
        "workload.dataset_params.output_len",
        "workload.dataset_params.prefix_len",
        "workload.dataset_params.num_groups",
        "workload.num_requests",
        "workload.request_rate",
        "workload.model",
        "layout.replicas",
        "layout.world_size",
        "gpu",
    ),
}
"""Per project, the fields that define the job (what was asked, not how it was done)."""

LABEL_FIELDS: dict[str, tuple[str, ...]] = {
    "PAR-TRAINING-STATE": ("layout.strategy",),
    "PAR-MODEL-INTERNAL": ("layout.strategy",),
    "PAR-MOE-EXPERT": ("workload.name",),
    "PAR-DISTRIBUTED-INFERENCE": ("layout.strategy",),
}
"""Per project, the fields that name a configuration; knobs that vary inside a job are added."""


def job_key(doc: Document) -> tuple[Any, ...]:
    """The job a document ran, with its evidence level (comparable documents share it)."""
    fields = JOB_FIELDS.get(doc.project, ("workload.kind", "layout.world_size", "gpu"))
    return (doc.project, doc.evidence_level, *(str(field(doc, f)) for f in fields))


def job_title(doc: Document) -> str:
    """The job in words: ``1.3b, seq 4096, global batch 4, 2 x NVIDIA H200``."""
    names = {
        "workload.model": "",
        "workload.seq": "seq ",
        "workload.global_batch": "global batch ",
        "workload.batch": "batch ",
        "workload.dataset": "",
        "workload.request_rate": "rate ",
        "workload.num_requests": "requests ",
        "workload.tokens_per_rank": "tokens/rank ",
        "layout.experts": "experts ",
        "layout.top_k": "top-",
        "layout.capacity_factor": "cf ",
    }
    parts = []
    for f in JOB_FIELDS.get(doc.project, ()):
        v = field(doc, f)
        if f in names and v is not None:
            parts.append(f"{names[f]}{v}")
    world = doc.layout.get("world_size")
    fields = JOB_FIELDS.get(doc.project, ("layout.world_size",))
    gpu = str(field(doc, "gpu"))
    if gpu == "no GPU":
        parts.append(f"{world} CPU ranks" if world and "layout.world_size" in fields else "CPU")
    else:
        parts.append(f"{world} x {gpu}" if world and "layout.world_size" in fields else gpu)
    return ", ".join(parts)


def _knobs(doc: Document) -> dict[str, str]:
    knobs = doc.layout.get("knobs")
    if not isinstance(knobs, dict):
        return {}
    return {k: str(v) for k, v in knobs.items() if not isinstance(v, (dict, list))}


def labels(docs: Sequence[Document]) -> dict[str, str]:
    """run_id -> configuration name: the label fields, plus every scalar knob whose value
    varies inside ``docs`` and differs from its most common value (``fsdp compile=True``)."""
    if not docs:
        return {}
    project = docs[0].project
    common: dict[str, str] = {}
    values: dict[str, Counter[str]] = defaultdict(Counter)
    for d in docs:
        for k, v in _knobs(d).items():
            values[k][v] += 1
    for k, counts in values.items():
        if len(counts) > 1:
            common[k] = counts.most_common(1)[0][0]
    out = {}
    for d in docs:
        base = " ".join(
            str(v) for f in LABEL_FIELDS.get(project, ()) if (v := field(d, f)) is not None
        ) or str(d.layout.get("strategy") or d.workload.get("kind") or d.run_id)
        extra = [f"{k}={v}" for k, v in sorted(_knobs(d).items()) if k in common and v != common[k]]
        out[d.run_id] = " ".join([base, *extra])
    return out


@dataclass(frozen=True)
class Spread:
    """Repeats of one configuration: the median and the range of a metric."""

    median: float
    lo: float
    hi: float
    n: int

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread | None:
        vals = sorted(values)
        if not vals:
            return None
        return cls(statistics.median(vals), vals[0], vals[-1], len(vals))


@dataclass(frozen=True, kw_only=True)
class Config:
    """One configuration of a job: its repeats."""

    label: str
    """The configuration's name."""
    docs: tuple[Document, ...]
    """Its documents, oldest first (failed ones included)."""

    def spread(self, metric: str) -> Spread | None:
        return Spread.of(
            v for d in self.docs if d.status == "ok" and (v := d.metric(metric)) is not None
        )

    @property
    def failed(self) -> list[Document]:
        return [d for d in self.docs if d.status == "failed"]

    def nearest(self, metric: str) -> Document:
        """The repeat closest to the median of ``metric`` (the one to link to)."""
        s = self.spread(metric)
        ok = [d for d in self.docs if d.metric(metric) is not None]
        if s is None or not ok:
            return self.docs[-1]
        return min(ok, key=lambda d: abs((d.metric(metric) or 0.0) - s.median))


def configs(docs: Sequence[Document]) -> list[Config]:
    """The configurations of one job's documents, in order of first appearance."""
    names = labels(docs)
    by: dict[str, list[Document]] = {}
    for d in docs:
        by.setdefault(names[d.run_id], []).append(d)
    return [Config(label=k, docs=tuple(v)) for k, v in by.items()]


def jobs(docs: Iterable[Document]) -> dict[tuple[Any, ...], list[Document]]:
    """Documents grouped by job (oldest first inside each)."""
    out: dict[tuple[Any, ...], list[Document]] = {}
    for d in docs:
        out.setdefault(job_key(d), []).append(d)
    return out


def main_job(
    docs: Iterable[Document] | dict[tuple[Any, ...], list[Document]],
    measured: Callable[[Document], bool],
) -> list[Document] | None:
    """The job with the most configurations that ``measured`` something (then the most
    documents, then the newest): the one a project's answer is about. ``docs`` may be grouped
    by ``jobs`` already."""
    grouped = docs if isinstance(docs, dict) else jobs(docs)
    groups = [g for g in grouped.values() if any(measured(d) for d in g)]
    if not groups:
        return None

    def distinct(g: list[Document]) -> int:  # as many as ``labels`` names, without naming them
        fields = LABEL_FIELDS.get(g[0].project, ())
        return len({(*(str(field(d, f)) for f in fields), *sorted(_knobs(d).items())) for d in g})

    return max(groups, key=lambda g: (distinct(g), len(g), g[-1].created))

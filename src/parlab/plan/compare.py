"""Like with like: which measured runs ``parlab decide`` may rank against each other.

Two parts of every run document decide what it may be compared with:

- its **workload** -- what was asked of the machine: the evidence level, the GPU model, the
  GPU count (``layout.world_size``) and ``workload`` less what a run records of itself
  (``IGNORED_WORKLOAD_KEYS``: loss curves, step times, measurement rows, seeds, step counts)
  and less the knobs that sit there (``Knobs.in_workload``, e.g. the micro-batch);
- its **configuration** -- the knobs it ran with: every ``layout`` entry (``layout.knobs``
  flattened, the mesh as one knob) except the world size and the names in ``Knobs.labels``,
  plus the knobs in ``Knobs.in_workload``. A knob a document does not record is ``absent``
  (``ABSENT_MEANS`` lists the few whose absence has one meaning).

Runs of one workload and one configuration are **repeats** of each other: the configuration's
value is their median, its spread their min-max (one repeat: the interquartile range of its
measured steps, ``workload.step_times``). Configurations that agree on every knob except the
compared ones (``--compare``, ``--across``) form one **class**: they are ranked against each
other; every other configuration of the workload is named with the knobs it differs in.
Nothing here crosses a wire: documents in, groups out.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from statistics import median, quantiles
from typing import Any

from parlab.contract import Document
from parlab.hardware import catalog

RUN_RECORDS = frozenset({"losses", "step_times", "phase_times", "host_probe"})
"""Workload keys a training run records of itself (every step's loss and time, its phases, its
host probe): they differ from run to run of the same job."""

IGNORED_WORKLOAD_KEYS = RUN_RECORDS | frozenset(
    {
        # step counts and seeds: a repeat may run more steps or another seed of the same job
        *("steps", "warmup_steps", "measure_steps", "warmup", "seed", "iters"),
        # raw measurements and where they were taken
        *("measurements", "partial", "bad_lines", "target", "records", "trace", "rows"),
        # MoE: the routing each run drew and measured
        *("per_expert_routed", "per_expert_kept", "dispatch_plan", "phases", "per_step"),
        *("reference_a2a_curve", "calibration_a2a", "zipf_rank_to_expert", "sweep"),
        # serving: the replica profile each run measured, the transfer run it rests on
        *("replica_profile", "profile", "kv_transfer_run"),
    }
)
"""Workload keys that vary from run to run without changing the job."""

ABSENT = "absent"
"""The value of a knob a document does not record."""

ABSENT_MEANS: dict[str, Any] = {"compile": False, "via": "torch", "nccl_direct": None}
"""Knobs recorded only once they had a choice: documents from before ran without
``torch.compile``, and issued every collective through torch (``via nccl``, with its
``nccl_direct`` library, came later)."""


@dataclass(frozen=True, kw_only=True)
class Knobs:
    """What one project's runs vary, and what ``decide`` compares by default."""

    compare: str
    """The knob (or group) ranked by default."""
    groups: Mapping[str, tuple[str, ...]]
    """Named knob sets: comparing a group lets all its members differ (a strategy brings its
    own settings: DDP records ``ddp_first_buckets``, DeepSpeed its config)."""
    in_workload: tuple[str, ...] = ()
    """Dotted ``workload`` paths that are knobs, not workload (the micro-batch under a fixed
    global batch); named by their last part."""
    labels: tuple[str, ...] = ()
    """``layout`` keys that only name a run (its other knobs say what it ran)."""


PROJECT_KNOBS: dict[str, Knobs] = {
    "PAR-TRAINING-STATE": Knobs(
        compare="strategy",
        groups={
            "strategy": ("strategy", "ddp_first_buckets", "deepspeed", "reshard_after_forward")
        },
        in_workload=("micro_batch",),
    ),
    "PAR-MODEL-INTERNAL": Knobs(
        compare="layout",
        groups={
            "layout": (
                *("mesh", "sequence_parallel", "sp_saved_input", "loss_parallel"),
                *("cp_variant", "pp_schedule", "vpp"),
            )
        },
        in_workload=("micro_batch", "microbatches"),
        labels=("strategy",),
    ),
    "PAR-MOE-EXPERT": Knobs(
        compare="layout",
        groups={
            "layout": (
                *("mesh", "strategy", "experts", "experts_per_rank", "expert_placement"),
                *("capacity_factor", "drop_policy", "gating", "top_k"),
            )
        },
    ),
    "PAR-DISTRIBUTED-INFERENCE": Knobs(compare="policy", groups={"policy": ("policy", "strategy")}),
    "PAR-COLLECTIVES": Knobs(
        compare="via",
        groups={"via": ("via", "timing", "nccl_direct"), "graph": ("graph", "timing")},
        in_workload=(
            *("collectives.via", "collectives.graph", "collectives.inplace"),
            *("collectives.timing", "nccl_direct"),
        ),
    ),
}
"""Per project: what its runs vary. Projects not listed compare ``strategy``."""

_DEFAULT_KNOBS = Knobs(compare="strategy", groups={})


def project_knobs(project: str) -> Knobs:
    """The project's ``Knobs`` (``strategy`` compared for a project not listed)."""
    return PROJECT_KNOBS.get(project, _DEFAULT_KNOBS)


def is_probe(doc: Document) -> bool:
    """A document that measures an instrument or another run, not a run to choose: a probe's
    calibration (``workload.kind`` ``...-calibration``: GEMM shapes, host dispatch, the
    per-parameter work) or a profile of a run (``workload.profiled_run_id``)."""
    w = doc.workload or {}
    return str(w.get("kind") or "").endswith("-calibration") or "profiled_run_id" in w


def configuration(doc: Document) -> dict[str, Any]:
    """The knobs ``doc`` ran with: name -> value (see the module docstring)."""
    spec = project_knobs(doc.project)
    out: dict[str, Any] = {}
    for key, value in doc.layout.items():
        if key in ("world_size", "knobs", *spec.labels):
            continue
        out[key] = value
    for key, value in (doc.layout.get("knobs") or {}).items():
        out.setdefault(key, value)
    for path in spec.in_workload:
        found, value = _lookup(doc.workload, path)
        if found:
            out.setdefault(path.rsplit(".", 1)[-1], value)
    return out


def knob_value(config: Mapping[str, Any], name: str) -> Any:
    """A knob's value in a configuration, ``ABSENT_MEANS`` applied; ``ABSENT`` if not recorded."""
    return config.get(name, ABSENT_MEANS.get(name, ABSENT))


def workload_of(doc: Document) -> dict[str, Any]:
    """What was asked of the machine (see the module docstring)."""
    spec = project_knobs(doc.project)
    drop = set(spec.in_workload)
    return {
        "evidence_level": doc.evidence_level,
        "gpu": ", ".join(gpu_models(doc)) or "none",
        "gpus": doc.layout.get("world_size"),
        **_strip(doc.workload, drop, ""),
    }


def workload_key(doc: Document) -> str:
    """Equal keys: one workload."""
    return json.dumps(workload_of(doc), sort_keys=True, default=str)


def key_of(config: Mapping[str, Any], names: Iterable[str]) -> str:
    """Equal keys: the same values of ``names``."""
    return json.dumps([knob_value(config, n) for n in names], sort_keys=True, default=str)


def gpu_models(doc: Document) -> list[str]:
    """The catalog names of the document's GPUs (the reported name where the catalog has none)."""
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or []
    names = []
    for g in gpus:
        spec = catalog.lookup(str(g.get("name", "")))
        names.append(spec.name if spec else str(g.get("name")))
    return sorted(set(names))


def knob_text(value: Any) -> str:
    """A knob's value as a person reads it: on/off, ``tp=2``, ``absent``."""
    if value is True:
        return "on"
    if value is False:
        return "off"
    if value is None:
        return "none"
    if isinstance(value, dict) and all(isinstance(v, int) for v in value.values()):
        return ",".join(f"{k}={v}" for k, v in value.items() if v != 1) or "1"
    return short(value)


def short(v: Any, limit: int = 40) -> str:
    """``v`` as text, cut to ``limit`` characters."""
    text = json.dumps(v, default=str) if isinstance(v, (dict, list)) else str(v)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def knob_differences(a: Mapping[str, Any], b: Mapping[str, Any], names: Iterable[str]) -> list[str]:
    """``["compile (on vs off)", ...]``: the knobs among ``names`` where ``a`` and ``b`` differ."""
    out = []
    for n in names:
        va, vb = knob_value(a, n), knob_value(b, n)
        if json.dumps(va, sort_keys=True, default=str) != json.dumps(
            vb, sort_keys=True, default=str
        ):
            out.append(f"{n} ({knob_text(va)} vs {knob_text(vb)})")
    return out


def workload_differences(ref: Document, doc: Document) -> list[str]:
    """``["workload.seq: 4096 vs 2048", ...]``: what makes ``doc`` another workload than ``ref``."""
    out: list[str] = []
    a, b = workload_of(ref), workload_of(doc)
    for key, label in (
        ("evidence_level", "evidence level"),
        ("gpu", "GPU model"),
        ("gpus", "GPUs"),
    ):
        va, vb = a.pop(key), b.pop(key)
        if va != vb:
            out.append(f"{label}: {va} vs {vb}")
    _diff(a, b, "workload", out)
    return out


def workload_label(doc: Document) -> str:
    """``1.3b, seq 4096, global batch 4 on 2 x NVIDIA H200 [real-training]``, from what the
    workload records of the usual keys."""
    w = doc.workload or {}
    model = w.get("preset") or w.get("model")
    if isinstance(model, dict):
        model = model.get("name")
    parts = [str(model)] if model else []
    for key, name in _LABEL_KEYS:
        found, value = _lookup(w, key)
        if found and value not in (None, "") and not isinstance(value, dict):
            part = f"{name} {short(value, 30)}".strip()
            if part not in parts:
                parts.append(part)
    gpus = ", ".join(gpu_models(doc))
    n = doc.layout.get("world_size")
    where = f"{n} x {gpus}" if gpus else f"{n} CPU rank(s)"
    return f"{', '.join(parts) or 'workload'} on {where} [{doc.evidence_level}]"


_LABEL_KEYS = (
    ("seq", "seq"),
    ("seq_len", "seq"),
    ("global_batch", "global batch"),
    ("name", ""),
    ("kind", ""),
    ("tokens_per_rank", "tokens/rank"),
    ("dataset", "dataset"),
    ("num_requests", "requests"),
    ("request_rate", "rate"),
    ("collectives.ops", "ops"),
    ("collectives.dtype", ""),
    ("collectives.maxbytes", "up to bytes"),
)


@dataclass(frozen=True, kw_only=True)
class Spread:
    """Where a configuration's value lies, in the objective's unit."""

    lo: float
    hi: float
    kind: str
    """``min-max of 3 repeats`` or ``IQR of 10 steps``."""


@dataclass(frozen=True, kw_only=True)
class Config:
    """One configuration of a workload and its repeats."""

    knobs: dict[str, Any]
    """The configuration (``configuration`` of its documents)."""
    docs: tuple[Document, ...]
    """Its repeats: every document of this workload and configuration."""
    values: tuple[tuple[Document, float], ...] = ()
    """The repeats that qualify, with their objective value."""

    @property
    def median(self) -> float | None:
        return median(v for _, v in self.values) if self.values else None

    @property
    def representative(self) -> Document | None:
        """The repeat nearest the median: the run a decision points at."""
        m = self.median
        if m is None:
            return None
        return min(self.values, key=lambda x: abs(x[1] - m))[0]

    def spread(self, higher: bool) -> Spread | None:
        """The interquartile range of 4 or more repeats, the min-max of 2 or 3; for one repeat,
        the IQR of its measured steps turned into the objective's unit (a rate scales as
        1/step, a time as the step); None if unknown."""
        vals = sorted(v for _, v in self.values)
        if len(vals) >= 4:
            q1, _, q3 = quantiles(vals, n=4)
            return Spread(lo=q1, hi=q3, kind=f"IQR of {len(vals)} repeats")
        if len(vals) >= 2:
            return Spread(lo=vals[0], hi=vals[-1], kind=f"min-max of {len(vals)} repeats")
        if not vals:
            return None
        doc, v = self.values[0]
        ts = [float(t) for t in (doc.workload or {}).get("step_times") or []]
        if len(ts) < 4 or median(ts) <= 0:
            return None
        q1, _, q3 = quantiles(ts, n=4)
        m = median(ts)
        lo, hi = (v * m / q3, v * m / q1) if higher else (v * q1 / m, v * q3 / m)
        return Spread(lo=lo, hi=hi, kind=f"IQR of {len(ts)} steps")


def lead(best: float, other: float, higher: bool) -> float:
    """How much ``best`` beats ``other``, as a fraction of ``other`` (a rate's gain, a time's
    saving)."""
    if other == 0:
        return 0.0
    return (best - other) / abs(other) if higher else (other - best) / abs(other)


def inside_spread(a: Spread | None, b: Spread | None, va: float, vb: float) -> bool | None:
    """Whether the lead between values ``va`` and ``vb`` is inside their spreads ``a``, ``b``:
    the spreads overlap, or -- one spread unknown -- its value lies inside the other spread.
    None when that cannot be told (no spread known, or a value outside the one known)."""
    if a is not None and b is not None:
        return a.lo <= b.hi and b.lo <= a.hi
    if a is not None and a.lo <= vb <= a.hi:
        return True
    if b is not None and b.lo <= va <= b.hi:
        return True
    return None


def group_configs(docs: Sequence[Document]) -> list[Config]:
    """The configurations of ``docs`` (assumed one workload), in order of first appearance."""
    names = sorted({n for d in docs for n in configuration(d)})
    groups: dict[str, list[Document]] = {}
    for d in docs:
        groups.setdefault(key_of(configuration(d), names), []).append(d)
    return [Config(knobs=configuration(g[0]), docs=tuple(g)) for g in groups.values()]


def knob_names(docs: Iterable[Document]) -> list[str]:
    """Every knob the documents record."""
    return sorted({n for d in docs for n in configuration(d)})


def _lookup(tree: Mapping[str, Any], path: str) -> tuple[bool, Any]:
    node: Any = tree
    for part in path.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def _strip(tree: Mapping[str, Any], drop: set[str], prefix: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in tree.items():
        path = f"{prefix}{k}"
        if path in drop or (not prefix and k in IGNORED_WORKLOAD_KEYS):
            continue
        out[k] = _strip(v, drop, path + ".") if isinstance(v, Mapping) else v
    return out


def _diff(a: Any, b: Any, where: str, out: list[str]) -> None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b), key=str):
            if k not in a:
                out.append(f"{where}.{k}: absent vs {short(b[k])}")
            elif k not in b:
                out.append(f"{where}.{k}: {short(a[k])} vs absent")
            else:
                _diff(a[k], b[k], f"{where}.{k}", out)
    elif a != b:
        out.append(f"{where}: {short(a)} vs {short(b)}")

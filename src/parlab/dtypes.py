"""The names of precision: ``--dtype`` recipes and ``--tensor-dtype`` element types.

A recipe says what a training run holds in bf16 (``docs/cli.md`` has the table):

- ``fp32``: everything fp32;
- ``bf16-compute``: bf16 compute (autocast, or FSDP2's ``param_dtype``) over fp32
  parameters, gradients and optimizer states;
- ``bf16-params``: bf16 compute, parameters and gradients; fp32 master weights and
  optimizer states;
- ``bf16-all``: everything bf16, optimizer states too; no master copy.

A tensor dtype is one element type (a collective's buffer, a replica's weights).

Retired spellings answer with one line naming the new one. Documents written before
the rename carry the old names; ``recorded_dtype`` is the one place that reads them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from parlab.errors import UsageError
from parlab.units import shown

RECIPES: dict[str, str] = {
    "fp32": "everything fp32",
    "bf16-compute": "bf16 compute over fp32 parameters, gradients and optimizer states",
    "bf16-params": "bf16 compute, parameters and gradients; fp32 master weights and states",
    "bf16-all": "everything bf16, optimizer states too; no fp32 master",
}
"""Recipe name -> what is in bf16."""

RETIRED_RECIPES: dict[str, str] = {
    "bf16-mixed": "bf16-compute",
    "mixed": "bf16-compute",
    "amp": "bf16-compute",
    "bf16-master": "bf16-params",
    "float32": "fp32",
}
"""Old ``--dtype`` spelling -> the recipe that replaced it."""

AMBIGUOUS_RECIPES: dict[str, tuple[str, str]] = {"bf16": ("bf16-compute", "bf16-all")}
"""Old spellings that meant different recipes in different commands."""

TENSOR_DTYPES = (
    "bf16", "fp16", "fp32", "fp64", "int8", "uint8", "int32", "int64", "fp8_e4m3", "fp8_e5m2",
)  # fmt: skip
"""``--tensor-dtype`` names (serving takes the first three)."""
SERVING_DTYPES = ("bf16", "fp16", "fp32")
TORCH_NAMES = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "fp64": "float64"}
"""``--tensor-dtype`` name -> torch's (what the serving engine and the KV transfer take)."""
TENSOR_DTYPE_OF = {torch_name: name for name, torch_name in TORCH_NAMES.items()}
"""torch's name -> the ``--tensor-dtype`` name."""

RETIRED_TENSOR_DTYPES: dict[str, str] = {
    "bfloat16": "bf16",
    "half": "fp16",
    "float16": "fp16",
    "float": "fp32",
    "float32": "fp32",
    "double": "fp64",
    "float64": "fp64",
    "int": "int32",
}
"""nccl-tests' and torch's long names -> the ``--tensor-dtype`` name."""


def retired_message(value: str, flag: str, choices: Iterable[str]) -> str | None:
    """The one line for a retired spelling of ``flag`` (None if ``value`` is not one)."""
    allowed = list(choices)
    table = RETIRED_TENSOR_DTYPES if flag in ("--tensor-dtype", "-d") else RETIRED_RECIPES
    new = table.get(value)
    if new is not None and new in allowed:
        return f"{flag} {value} is now {new}"
    if value in AMBIGUOUS_RECIPES and flag == "--dtype":
        options = [c for c in AMBIGUOUS_RECIPES[value] if c in allowed]
        what = " or ".join(f"{c} ({RECIPES[c]})" for c in options)
        return f"--dtype {value} is retired, it meant different recipes in different commands: use {what}"
    return None


def check_recipe(value: str, choices: Iterable[str] = tuple(RECIPES), flag: str = "--dtype") -> str:
    """``value`` if it is one of ``choices``; else ``UsageError`` in one line."""
    allowed = list(choices)
    if value in allowed:
        return value
    msg = retired_message(value, flag, allowed)
    if msg is None:
        msg = f"{flag} {shown(value)} is not one of {', '.join(allowed)}"
        if value in RECIPES:
            msg = f"{flag} {value} is not run here ({RECIPES[value]}): use one of {', '.join(allowed)}"
    raise UsageError(msg)


def _writer_is_train(project: str, evidence: str, strategy: str) -> bool:
    """Whether ``parlab train`` wrote the document (its ``bf16`` was bf16 compute)."""
    return project == "PAR-TRAINING-STATE" and evidence != "analytic" and bool(strategy)


def recorded_dtype(
    *,
    value: str | None,
    project: str,
    evidence_level: str,
    strategy: str = "",
) -> str | None:
    """The recipe a document recorded, in today's names, whatever name it was written with.

    ``parlab train`` wrote ``bf16`` for bf16 compute over fp32 states (DeepSpeed's ``bf16``:
    bf16 parameters with an fp32 master) and ``bf16-master`` for bf16 parameters; the
    ledger, ``fit``, ``plan``, model-internal and MoE runs wrote ``bf16`` for everything in
    bf16 and ``bf16-mixed`` for bf16 compute. None stays None; an unknown name is returned
    as it is.
    """
    if value is None or value in RECIPES:
        return value
    if value == "bf16":
        if _writer_is_train(project, evidence_level, strategy):
            return "bf16-params" if strategy.startswith("deepspeed") else "bf16-compute"
        return "bf16-all"
    return RETIRED_RECIPES.get(value, value)


def document_dtype(doc: Any) -> str | None:
    """``recorded_dtype`` of a contract document (``layout.knobs.dtype``, else
    ``workload.dtype``)."""
    layout: Mapping[str, Any] = doc.layout or {}
    knobs = layout.get("knobs") or {}
    value = knobs.get("dtype") if isinstance(knobs, Mapping) else None
    value = value or (doc.workload or {}).get("dtype")
    return recorded_dtype(
        value=value if isinstance(value, str) else None,
        project=doc.project,
        evidence_level=doc.evidence_level,
        strategy=str(layout.get("strategy") or ""),
    )

"""The GEMM-shape factor: a model's measured GEMM efficiency against the roofline's reference.

The roofline (``parlab.plan.roofline``) runs a step's GEMM FLOPs at ``gemm`` x the bf16 peak,
``gemm`` measured at one per-GPU width (``Roofline.gemm_width``, the 1.3B's 2048) and carried to
other widths by the width law ``f(n) = n / (n + n0)``, fitted on Llama-style runs of hidden 2048
and 4096. The law sees only the width. GPT-2 1.5B (hidden 1600, FFN 6400, vocabulary 50257:
none a multiple of 128) has GEMMs whose shapes run further from peak than the law says: a
profile of its runs found 147-162 ms of GEMM kernels a step against ~100 ms for the 1.3B at
similar FLOPs (``results/PAR-TRAINING-STATE/profile-train-{ddp,fsdp}-20261130T2136*``).

``benchmarks/gemm_shapes_probe.py`` times every GEMM of one layer and of the output layer of
each model (forward, and the two backward GEMMs: the input gradient ``dgrad`` and the weight
gradient ``wgrad``), bf16, on one GPU, at the tokens per micro-batch its runs use, and writes
each model's FLOP-weighted efficiency (total FLOPs / total seconds / the catalog's bf16 peak)
to a ``gemm-shape-calibration`` document under ``PAR-TRAINING-STATE``. Where the GPU
(``real-training``) such documents of the newest one's device (merged: each measurement the
mean of the probes that made it) cover both a run's model and the reference model -- the one
whose width is the roofline's ``gemm_width`` -- at the run's tokens per micro-batch, and the run
is not tensor- or context-sharded differently from the probe (tp 1; tokens per rank = micro-batch
x sequence / cp), the run's GEMM efficiency is::

    gemm x eff_measured(model, tokens) / eff_measured(reference, tokens)

**instead of** ``gemm x f(width) / f(gemm_width)``: the measured shape factor replaces the width
law for the models the probe measured; the width law stays the default for everything else
(other models, tp > 1, token counts the probe did not run, no calibration). The reference's own
runs get factor 1 either way. Nothing is fitted to any run's step time here.

What it does not change: the attention core stays the roofline's attention term (GPT-2's head
dim 64 runs through the same flash kernel term as every model), and the elementwise and
optimizer terms. Nothing here imports torch or crosses a wire.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

from parlab.errors import UsageError

FORMAT = "parlab-gemm-shapes/v1"
KIND = "gemm-shape-calibration"
PROJECT = "PAR-TRAINING-STATE"
PREFIX = "gemm-shapes"


@dataclass(frozen=True, kw_only=True)
class GemmShapes:
    """One GEMM-shape calibration (``benchmarks/gemm_shapes_probe.py``)."""

    run_id: str
    """The probe document it comes from."""
    evidence_level: str
    """``real-training`` (a GPU) or ``cpu-mechanism`` (the CPU: says nothing of a GPU)."""
    device: str
    """The device it ran on (``cpu`` on the CPU)."""
    efficiency: dict[tuple[str, int], float] = field(default_factory=dict)
    """(model, tokens per micro-batch) -> FLOP-weighted achieved fraction of the bf16 peak of
    its layer and output GEMMs, forward and backward, at tp 1."""
    hidden: dict[str, int] = field(default_factory=dict)
    """model -> its hidden width (the reference is found by width)."""

    def reference(self, width: float, tokens: int) -> str | None:
        """The measured model of hidden ``width`` at ``tokens``, or None."""
        for (model, t), _ in sorted(self.efficiency.items()):
            if t == tokens and self.hidden.get(model) == width:
                return model
        return None

    def factor(self, model: str, tokens: int, width: float) -> tuple[float, str] | None:
        """(eff(model) / eff(reference), the reference's name) at ``tokens``, the reference the
        measured model of hidden ``width``; None when either was not measured there."""
        ref = self.reference(width, tokens)
        eff = self.efficiency.get((model, tokens))
        if ref is None or eff is None:
            return None
        return eff / self.efficiency[(ref, tokens)], ref

    @property
    def label(self) -> str:
        return f"{self.run_id} ({self.device})"


def load_gemm_shapes(doc: Any) -> GemmShapes:
    """The calibration a probe document holds; ``UsageError`` when it holds none (or its shapes
    were shrunk, a CPU dry run's)."""
    body = (doc.workload or {}).get("calibration") or {}
    if doc.workload.get("kind") != KIND or body.get("format") != FORMAT:
        raise UsageError(f"{doc.run_id}: not a {KIND} document ({FORMAT})")
    if int(body.get("shrink", 1)) != 1:
        raise UsageError(f"{doc.run_id}: its shapes were shrunk {body['shrink']}x (a dry run)")
    eff: dict[tuple[str, int], float] = {}
    hidden: dict[str, int] = {}
    for m in body["models"]:
        if m.get("efficiency") is None or int(m.get("tp", 1)) != 1:
            continue
        eff[(str(m["model"]), int(m["tokens"]))] = float(m["efficiency"])
        hidden[str(m["model"])] = int(m["hidden"])
    return GemmShapes(
        run_id=doc.run_id,
        evidence_level=doc.evidence_level,
        device=str(body["device"]),
        efficiency=eff,
        hidden=hidden,
    )


def gemm_shape_calibration(root: Any) -> GemmShapes | None:
    """The GPU (``real-training``) GEMM-shape calibrations under ``root``/PAR-TRAINING-STATE
    made on the newest one's device, merged (``merge``), or None."""
    from parlab.plan.host import newest_device_calibrations

    cals = newest_device_calibrations(root, PROJECT, PREFIX, load_gemm_shapes)
    return merge(cals) if cals else None


def merge(cals: list[GemmShapes]) -> GemmShapes:
    """Several probes of one device as one: each (model, tokens) the mean of the probes that
    measured it. The probe's own repeatability is a few percent (the 1.3B at 8,192 tokens:
    0.696, then 0.673 of peak on another H200), so a later probe adds to the earlier ones
    instead of replacing them."""
    if len(cals) == 1:
        return cals[0]
    seen: dict[tuple[str, int], list[float]] = {}
    hidden: dict[str, int] = {}
    for c in cals:
        for k, v in c.efficiency.items():
            seen.setdefault(k, []).append(v)
        hidden.update(c.hidden)
    return GemmShapes(
        run_id=" + ".join(c.run_id for c in cals),
        evidence_level=cals[-1].evidence_level,
        device=cals[-1].device,
        efficiency={k: sum(v) / len(v) for k, v in seen.items()},
        hidden=hidden,
    )


def run_shape(doc: Any) -> tuple[str, int, int, str]:
    """(model, tokens per micro-batch per rank, tp, GPU name) of a measured training run."""
    from parlab.plan.calibrate import _model_name

    w, lay = doc.workload, doc.layout or {}
    mesh = lay.get("mesh") or {}
    cp = int(mesh.get("cp", 1))
    tokens = int(w.get("micro_batch") or 1) * int(w.get("seq") or 0) // cp
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or [{}]
    return _model_name(doc), tokens, int(mesh.get("tp", 1)), str(gpus[0].get("name"))


def shape_factor(doc: Any, roof: Any, shapes: GemmShapes | None) -> tuple[float, str] | None:
    """(measured shape factor, its reference model) for this run under ``shapes``, or None
    where the calibration does not cover it (the width law then stays)."""
    if shapes is None or roof.gemm_width <= 0:
        return None
    model, tokens, tp, gpu = run_shape(doc)
    if tp != 1 or gpu != shapes.device or aligned(model):
        return None
    return shapes.factor(model, tokens, roof.gemm_width)


ALIGN = 128
"""The GEMM tile the width law's fitting runs all divide into (their every GEMM dimension)."""


def aligned(model: str) -> bool:
    """Every GEMM dimension of ``model`` (hidden, FFN, vocabulary, query and KV widths) is a
    multiple of ``ALIGN``, as in the Llama-style runs the width law was fitted on: the law
    describes it, and the measured factor is not applied. (On the H200s the probe put the 8B's
    GEMMs at 0.92 of the 1.3B's (``gemm-shapes-20261130T232027-2c4a49``) while the runs the law was fitted on ran both at the law's
    efficiency: a bare GEMM's ratio does not carry to aligned shapes inside a training step.)
    Unknown models count as aligned (no factor)."""
    from parlab.models import get_spec

    try:
        spec = get_spec(model)
    except ValueError:
        return True
    kv = spec.kv_heads or spec.heads
    dims = (spec.hidden, spec.ffn_hidden, spec.vocab_size, spec.q_dim, kv * spec.d_head)
    return all(d % ALIGN == 0 for d in dims)


def shaped_roofline(doc: Any, roof: Any, shapes: GemmShapes | None) -> Any:
    """``roof`` for this run: where ``shapes`` covers it, its GEMM efficiency ``gemm`` x the
    measured shape factor with the width law switched off (the factor replaces it); else
    ``roof`` unchanged."""
    got = shape_factor(doc, roof, shapes)
    if got is None:
        return roof
    factor, ref = got
    assert shapes is not None
    return replace(
        roof,
        gemm=min(1.0, roof.gemm * factor),
        gemm_width_half=0.0,
        source=f"{roof.source}; GEMM x {factor:.3f} measured against {ref} ({shapes.label})",
    )

"""The shape factors: a model's measured GEMM and attention-core efficiencies against the
roofline's reference model (the one whose width is ``Roofline.gemm_width``).

**GEMMs.** The roofline runs GEMM FLOPs at ``gemm`` x the bf16 peak, carried from
``gemm_width`` to other widths by the width law ``f(n) = n / (n + n0)``. Models whose GEMM
dimensions are not all multiples of 128 (``aligned``) run further from peak than the law says
(GPT-2 1.5B: 147-162 ms of GEMM kernels a step against ~100 ms for the 1.3B at similar FLOPs,
``results/PAR-TRAINING-STATE/profile-train-{ddp,fsdp}-20261130T2136*``).
``benchmarks/gemm_shapes_probe.py`` times every GEMM of one layer and the output layer of each
model (forward, ``dgrad``, ``wgrad``; from format v2 also ``bgrad``, the bias gradients), bf16,
on one GPU, and writes FLOP-weighted efficiencies to ``gemm-shape-calibration`` documents
(``parlab.plan.fit.shape_probe``). Where a calibration of the run's GPU covers both the run's
model and the reference at the run's tokens per micro-batch, the run has tp 1, and the model is
not aligned, the run's GEMM efficiency is::

    gemm x eff_measured(model, tokens) / eff_measured(reference, tokens)

instead of ``gemm x f(width) / f(gemm_width)``; the width law stays for everything else. In v2
a biased model's factor also carries its bias reductions, priced nowhere else.

**Attention core.** The roofline prices the causal flash core at one efficiency,
``attention``, fitted on the reference (head dim 128). From v2 the probe times one layer's
causal SDPA forward + backward per (model, micro-batch, sequence). Where both the run's model
and the reference were measured there and the run has tp 1 and cp 1 (tp splits the heads; the
ring of cp > 1 is ``ring_attention``), aligned models included, the run's efficiency is::

    attention x eff_attn(model, micro-batch, seq) / eff_attn(reference, micro-batch, seq)

Where the 7B/8B have fewer KV heads, the probe times the reference model's ``repeat_interleave``
of k and v too, as their runs do. (The 8B's data-parallel runs fitted the width law's ``n0``
with the unscaled ``attention``: a factor there moves them off that fit by their attention
core's share of the step, about 7 % of their FLOPs at 4,096 tokens, times its distance from 1.)

The reference's own runs get factor 1. The elementwise and optimizer terms are unchanged;
nothing here is fitted to a step time, imports torch or crosses a wire.
"""

from __future__ import annotations

import functools
from dataclasses import replace
from typing import Any

from parlab.hardware.catalog import lookup
from parlab.models import get_spec
from parlab.plan.compute import StepShape
from parlab.plan.fit.runs import gpu_name, model_name, recompute_of
from parlab.plan.fit.shape_probe import GemmShapes, canonical


def run_batch(doc: Any) -> tuple[str, int, int, int, int, str]:
    """(model, micro-batch, sequence, tp, cp, GPU name) of a measured training run."""

    w, lay = doc.workload, doc.layout or {}
    mesh = lay.get("mesh") or {}
    return (
        model_name(doc),
        int(w.get("micro_batch") or 1),
        int(w.get("seq") or 0),
        int(mesh.get("tp", 1)),
        int(mesh.get("cp", 1)),
        gpu_name(doc),
    )


def doc_batch(doc: Any) -> StepShape:
    """The ``StepShape`` of a measured training run."""

    model, mb, seq, tp, cp, gpu = run_batch(doc)
    return StepShape(
        model=canonical(model),
        micro_batch=mb,
        seq=seq,
        tp=tp,
        cp=cp,
        gpu=gpu,
        recompute=recompute_of(doc),
    )


@functools.cache
def same_gpu(a: str, b: str) -> bool:
    """The same GPU model: equal names, or names the catalog resolves to one entry
    (``NVIDIA H200`` from torch, ``H200`` from ``--gpus``)."""
    if a == b:
        return True
    ga, gb = lookup(a), lookup(b)
    return ga is not None and gb is not None and ga.name == gb.name


def gemm_factor(batch: StepShape, roof: Any, shapes: GemmShapes | None) -> tuple[float, str] | None:
    """(measured shape factor, its reference model) for ``batch`` under ``shapes``, or None
    where the calibration does not cover it (the width law then stays)."""
    if shapes is None or roof.gemm_width <= 0:
        return None
    if batch.tp != 1 or not same_gpu(batch.gpu, shapes.device) or aligned(batch.model):
        return None
    return shapes.factor(batch.model, batch.tokens, roof.gemm_width)


def attn_factor(batch: StepShape, roof: Any, shapes: GemmShapes | None) -> tuple[float, str] | None:
    """(measured attention factor, its reference model) for ``batch`` under ``shapes``, or None
    where the calibration does not cover it: not measured at its micro-batch and sequence (for
    the model or the reference, the model of ``roof.gemm_width``), tp > 1 (the heads split),
    cp > 1 (the ring: ``ring_attention``), or another GPU."""
    if shapes is None or roof.gemm_width <= 0 or not shapes.attention:
        return None
    if batch.tp != 1 or batch.cp != 1 or not same_gpu(batch.gpu, shapes.device):
        return None
    return shapes.attention_factor(batch.model, batch.micro_batch, batch.seq, roof.gemm_width)


def rc_efficiency(batch: StepShape, shapes: GemmShapes | None) -> float | None:
    """The measured efficiency of the model's layer forward GEMMs at ``batch``'s tokens per
    micro-batch (``GemmShapes.forward``), where it recomputes fully
    (``Roofline.recompute_gemm``: the replayed GEMMs run at their kernels' speed), ``shapes``
    measured them there, it is not tensor-sharded (the probe runs tp 1) and runs on the probe's
    GPU; else None. Aligned models included: this is the kernels' own speed, not a ratio
    carried into a step."""
    if shapes is None or batch.recompute != "full":
        return None
    if batch.tp != 1 or not same_gpu(batch.gpu, shapes.device):
        return None
    return shapes.forward.get((batch.model, batch.tokens))


def shaped(batch: StepShape, roof: Any, shapes: GemmShapes | None) -> Any:
    """``roof`` for ``batch``: where ``shapes`` covers its GEMMs, the GEMM efficiency ``gemm`` x
    the measured shape factor with the width law switched off (the factor replaces it); where
    it covers its attention core, ``attention`` x the measured attention factor; where it
    recomputes fully and ``shapes`` measured its model's layer GEMMs at its tokens, the replayed
    GEMMs at that efficiency (``rc_efficiency``); ``source`` names each change. ``roof`` itself
    where none applies."""
    gemm = gemm_factor(batch, roof, shapes)
    attn = attn_factor(batch, roof, shapes)
    kernel = rc_efficiency(batch, shapes)
    if gemm is None and attn is None and kernel is None:
        return roof
    assert shapes is not None
    changes: dict[str, Any] = {}
    source = roof.source
    if kernel is not None:
        changes["recompute_gemm"] = kernel
        source += (
            f"; the full recompute's GEMMs at {kernel:.3f} of peak, the measured efficiency "
            f"of the model's layer forward GEMMs ({shapes.label})"
        )
    if gemm is not None:
        factor, ref = gemm
        changes.update(gemm=min(1.0, roof.gemm * factor), gemm_width_half=0.0)
        source += f"; GEMM x {factor:.3f} measured against {ref} ({shapes.label})"
    if attn is not None:
        factor, ref = attn
        changes["attention"] = min(1.0, roof.attention * factor)
        source += f"; attention x {factor:.3f} measured against {ref} ({shapes.label})"
    return replace(roof, **changes, source=source)


def shape_factor(doc: Any, roof: Any, shapes: GemmShapes | None) -> tuple[float, str] | None:
    """``gemm_factor`` of a measured run."""
    return gemm_factor(doc_batch(doc), roof, shapes)


def attention_factor(doc: Any, roof: Any, shapes: GemmShapes | None) -> tuple[float, str] | None:
    """``attn_factor`` of a measured run."""
    return attn_factor(doc_batch(doc), roof, shapes)


def shaped_roofline(doc: Any, roof: Any, shapes: GemmShapes | None) -> Any:
    """``shaped`` for a measured run."""
    return shaped(doc_batch(doc), roof, shapes)


ALIGN = 128
"""The GEMM tile the width law's fitting runs all divide into (their every GEMM dimension)."""


@functools.cache
def aligned(model: str) -> bool:
    """Every GEMM dimension of ``model`` (hidden, FFN, vocabulary, query and KV widths) is a
    multiple of ``ALIGN``, as in the runs the width law was fitted on: the law describes it,
    and the measured factor is not applied (a bare GEMM's ratio does not carry to aligned
    shapes inside a training step: the probe put the 8B's GEMMs at 0.92 of the 1.3B's,
    ``gemm-shapes-20261130T232027-2c4a49``, where the runs the law was fitted on ran both at
    the law's efficiency). Unknown models count as aligned (no factor)."""
    try:
        spec = get_spec(model)
    except ValueError:
        return True
    kv = spec.kv_heads or spec.heads
    dims = (spec.hidden, spec.ffn_hidden, spec.vocab_size, spec.q_dim, kv * spec.d_head)
    return all(d % ALIGN == 0 for d in dims)

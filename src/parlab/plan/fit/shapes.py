"""The shape factors: a model's measured GEMM and attention-core efficiencies against the
roofline's reference.

**GEMMs.** The roofline (``parlab.plan.roofline``) runs a step's GEMM FLOPs at ``gemm`` x the
bf16 peak, ``gemm`` measured at one per-GPU width (``Roofline.gemm_width``, the 1.3B's 2048) and
carried to other widths by the width law ``f(n) = n / (n + n0)``, fitted on Llama-style runs of
hidden 2048 and 4096. The law sees only the width. GPT-2 1.5B (hidden 1600, FFN 6400,
vocabulary 50257: none a multiple of 128) has GEMMs whose shapes run further from peak than the
law says: a profile of its runs found 147-162 ms of GEMM kernels a step against ~100 ms for the
1.3B at similar FLOPs (``results/PAR-TRAINING-STATE/profile-train-{ddp,fsdp}-20261130T2136*``).

``benchmarks/gemm_shapes_probe.py`` times every GEMM of one layer and of the output layer of
each model (forward, and the two backward GEMMs: the input gradient ``dgrad`` and the weight
gradient ``wgrad``; from format v2 also each biased linear's bias gradient ``bgrad``, 0 FLOPs),
bf16, on one GPU, at the tokens per micro-batch its runs use, and writes each model's
FLOP-weighted efficiency (total FLOPs / total seconds / the catalog's bf16 peak) to a
``gemm-shape-calibration`` document under ``PAR-TRAINING-STATE`` (read by
``parlab.plan.fit.shape_probe``). Where the GPU (``real-training``) such documents of the newest
one's device (merged, ``shape_probe.merge``) cover both a run's model and the reference model --
the one whose width is the roofline's ``gemm_width`` -- at the run's tokens per micro-batch,
the run is not tensor- or context-sharded differently from the probe (tp 1; tokens per rank =
micro-batch x sequence / cp), and the model's GEMM dimensions are not all multiples of 128
(``aligned``), the run's GEMM efficiency is::

    gemm x eff_measured(model, tokens) / eff_measured(reference, tokens)

**instead of** ``gemm x f(width) / f(gemm_width)``: the measured shape factor replaces the width
law for the models the probe measured; the width law stays the default for everything else
(other models, tp > 1, token counts the probe did not run, no calibration). The reference's own
runs get factor 1 either way. In v2 the bias gradients' seconds are part of a model's GEMM
seconds, so a biased model's factor also carries its bias reductions, which the roofline prices
nowhere else (GPT-2 1.5B's profile: 12.1 ms of reductions a step against the unbiased 1.3B's
1.9 ms, ``results/PAR-TRAINING-STATE/profile-train-fsdp-20261201T042202-8b95ce.json``).

**Attention core.** The roofline prices the causal flash attention core at one efficiency,
``attention``, fitted on the 1.3B (head dim 128). The same GPT-2 1.5B profile put 17.5 ms a step
in it at head dim 64, where that term says 7.4 ms. From v2 the probe times one layer's causal
SDPA forward + backward per (model, micro-batch, sequence), its efficiency on the roofline's
causal FLOPs. Where a calibration measured both the run's model and the reference at the run's
micro-batch and sequence, and the run has tp 1 and cp 1 (tensor parallelism splits the heads,
which the probe does not; the ring of cp > 1 is its own term, ``ring_attention``, left as it
is), the run's attention efficiency is::

    attention x eff_attn(model, micro-batch, seq) / eff_attn(reference, micro-batch, seq)

applied wherever both were measured, aligned models included: the width law and its evidence
concern GEMMs, and no fitted term describes another model's attention core (``attention`` was
fitted on the 1.3B alone), so the measured ratio is the only evidence there is. The reference's
own runs get 1; the 7B/8B models share its head dim 128, and where they have fewer KV heads the
probe times the reference model's ``repeat_interleave`` of k and v too, as their runs do. (The
8B's data-parallel runs fitted the width law's ``n0`` and the contention with the unscaled
``attention``: a factor there moves them off that fit by their attention core's share of the
step, about 7 % of their FLOPs at 4,096 tokens, times the factor's distance from 1.)

The elementwise and optimizer terms are unchanged. Nothing is fitted to any run's step time
here; nothing imports torch or crosses a wire.
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


def recompute_efficiency(doc: Any, shapes: GemmShapes | None) -> float | None:
    """``rc_efficiency`` of a measured run."""
    return rc_efficiency(doc_batch(doc), shapes)


def shaped_roofline(doc: Any, roof: Any, shapes: GemmShapes | None) -> Any:
    """``shaped`` for a measured run."""
    return shaped(doc_batch(doc), roof, shapes)


ALIGN = 128
"""The GEMM tile the width law's fitting runs all divide into (their every GEMM dimension)."""


@functools.cache
def aligned(model: str) -> bool:
    """Every GEMM dimension of ``model`` (hidden, FFN, vocabulary, query and KV widths) is a
    multiple of ``ALIGN``, as in the Llama-style runs the width law was fitted on: the law
    describes it, and the measured factor is not applied. (On the H200s the probe put the 8B's
    GEMMs at 0.92 of the 1.3B's (``gemm-shapes-20261130T232027-2c4a49``) while the runs the law was fitted on ran both at the law's
    efficiency: a bare GEMM's ratio does not carry to aligned shapes inside a training step.)
    Unknown models count as aligned (no factor)."""
    try:
        spec = get_spec(model)
    except ValueError:
        return True
    kv = spec.kv_heads or spec.heads
    dims = (spec.hidden, spec.ffn_hidden, spec.vocab_size, spec.q_dim, kv * spec.d_head)
    return all(d % ALIGN == 0 for d in dims)

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
``gemm-shape-calibration`` document under ``PAR-TRAINING-STATE``. Where the GPU
(``real-training``) such documents of the newest one's device (merged, ``merge``) cover both a
run's model and the reference model -- the one whose width is the roofline's ``gemm_width`` --
at the run's tokens per micro-batch, the run is not tensor- or context-sharded differently from
the probe (tp 1; tokens per rank = micro-batch x sequence / cp), and the model's GEMM dimensions
are not all multiples of 128 (``aligned``), the run's GEMM efficiency is::

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
import math
from dataclasses import dataclass, field, replace
from typing import Any

from parlab.errors import UsageError
from parlab.plan.compute import StepShape
from parlab.plan.fit.runs import model_name, recompute_of

FORMATS = ("parlab-gemm-shapes/v1", "parlab-gemm-shapes/v2", "parlab-gemm-shapes/v3")
"""The probe's formats, oldest first. v2: GEMM seconds include the bias gradients (``bgrad``),
and ``attention`` entries. v3: each timed sample queued behind a GPU sleep, so small kernels are
timed back to back, not at the host's launch rate (GPT-2 124M's GEMMs at 8,192 tokens: 0.198
of peak in a v2 probe, about 0.27 in the v1 probes)."""
FORMAT = FORMATS[-1]
KIND = "gemm-shape-calibration"
PROJECT = "PAR-TRAINING-STATE"
PREFIX = "gemm-shapes"


@dataclass(frozen=True, kw_only=True)
class GemmShapes:
    """One GEMM-shape calibration (``benchmarks/gemm_shapes_probe.py``), or several merged."""

    run_id: str
    """The probe document it comes from."""
    evidence_level: str
    """``real-training`` (a GPU) or ``cpu-mechanism`` (the CPU: says nothing of a GPU)."""
    device: str
    """The device it ran on (``cpu`` on the CPU)."""
    efficiency: dict[tuple[str, int], float] = field(default_factory=dict)
    """(model, tokens per micro-batch) -> FLOP-weighted achieved fraction of the bf16 peak of
    its layer and output GEMMs, forward and backward (v2: bias gradients' seconds included), at
    tp 1."""
    hidden: dict[str, int] = field(default_factory=dict)
    """model -> its hidden width (the reference is found by width)."""
    version: int = 1
    """The format's version (``FORMATS``); merged: the newest."""
    biased: frozenset[str] = frozenset()
    """The models with a bias on some linear (their v1 and v2 GEMM efficiencies differ)."""
    attention: dict[tuple[str, int, int], float] = field(default_factory=dict)
    """(model, micro-batch, sequence) -> achieved fraction of the bf16 peak of one layer's
    causal attention core, forward + backward, on the roofline's causal FLOPs (v2 on)."""
    forward: dict[tuple[str, int], float] = field(default_factory=dict)
    """(model, tokens per micro-batch) -> FLOP-weighted achieved fraction of the bf16 peak of
    one layer's forward GEMMs, the output layer's left out: what a full recompute replays
    (``forward_efficiency``). GPT-2 124M at 32,768 tokens: 0.70, where all its GEMMs together
    reach 0.28 (its output layer, vocabulary 50257, runs unaligned kernels)."""

    def __post_init__(self) -> None:
        # one name per model, the catalog's (``canonical``): runs and candidates look it up so
        for name in ("efficiency", "forward", "attention"):
            table = getattr(self, name)
            fixed = {(canonical(k[0]), *k[1:]): v for k, v in table.items()}
            object.__setattr__(self, name, fixed)
        object.__setattr__(self, "hidden", {canonical(k): v for k, v in self.hidden.items()})
        object.__setattr__(self, "biased", frozenset(canonical(m) for m in self.biased))

    def reference(self, width: float, tokens: int) -> str | None:
        """The measured model of hidden ``width`` at ``tokens``, or None."""
        for (model, t), _ in sorted(self.efficiency.items()):
            if t == tokens and self.hidden.get(model) == width:
                return model
        return None

    def factor(self, model: str, tokens: int, width: float) -> tuple[float, str] | None:
        """(eff(model) / eff(reference), the reference's name) at ``tokens``, the reference the
        measured model of hidden ``width``. Where the probe measured both at token counts on
        either side of ``tokens`` but not at it, the factor between the nearest two, linear in
        log(tokens) (GPT-2 124M at 16,384 tokens: between its 8,192 and 32,768; the width law
        had put its GEMMs at twice the efficiency they reach on either side). None where no
        measured pair brackets ``tokens``: no extrapolation."""
        exact = self._factor_at(model, tokens, width)
        if exact is not None:
            return exact
        known = sorted(
            t for (m, t) in self.efficiency if m == model and self._factor_at(m, t, width)
        )
        below = [t for t in known if t < tokens]
        above = [t for t in known if t > tokens]
        if not below or not above:
            return None
        lo, hi = below[-1], above[0]
        at_lo, at_hi = self._factor_at(model, lo, width), self._factor_at(model, hi, width)
        assert at_lo is not None and at_hi is not None  # both are in ``known``
        share = math.log(tokens / lo) / math.log(hi / lo)
        factor = at_lo[0] + share * (at_hi[0] - at_lo[0])
        return factor, f"{at_lo[1]}, between {lo:,} and {hi:,} tokens"

    def _factor_at(self, model: str, tokens: int, width: float) -> tuple[float, str] | None:
        ref = self.reference(width, tokens)
        eff = self.efficiency.get((model, tokens))
        if ref is None or eff is None:
            return None
        return eff / self.efficiency[(ref, tokens)], ref

    def attention_factor(
        self, model: str, micro_batch: int, seq: int, width: float
    ) -> tuple[float, str] | None:
        """(eff_attn(model) / eff_attn(reference), the reference's name) at ``micro_batch`` x
        ``seq``, the reference the model of hidden ``width`` measured there; None when either
        was not measured there."""
        ref = next(
            (
                m
                for (m, b, s) in sorted(self.attention)
                if (b, s) == (micro_batch, seq) and self.hidden.get(m) == width
            ),
            None,
        )
        eff = self.attention.get((model, micro_batch, seq))
        if ref is None or eff is None:
            return None
        return eff / self.attention[(ref, micro_batch, seq)], ref

    @property
    def label(self) -> str:
        return f"{self.run_id} ({self.device})"


def load_gemm_shapes(doc: Any) -> GemmShapes:
    """The calibration a probe document (v1 or v2) holds; ``UsageError`` when it holds none (or
    its shapes were shrunk, a CPU dry run's)."""
    body = (doc.workload or {}).get("calibration") or {}
    if doc.workload.get("kind") != KIND or body.get("format") not in FORMATS:
        raise UsageError(f"{doc.run_id}: not a {KIND} document ({', '.join(FORMATS)})")
    if int(body.get("shrink", 1)) != 1:
        raise UsageError(f"{doc.run_id}: its shapes were shrunk {body['shrink']}x (a dry run)")
    eff: dict[tuple[str, int], float] = {}
    forward: dict[tuple[str, int], float] = {}
    hidden: dict[str, int] = {}
    biased: set[str] = set()
    for m in body["models"]:
        if m.get("efficiency") is None or int(m.get("tp", 1)) != 1:
            continue
        eff[(str(m["model"]), int(m["tokens"]))] = float(m["efficiency"])
        fwd = forward_efficiency(m.get("gemms") or [], float(body.get("peak_flops") or 0.0))
        if fwd is not None:
            forward[(str(m["model"]), int(m["tokens"]))] = fwd
        hidden[str(m["model"])] = int(m["hidden"])
        if any(g.get("bias") for g in m.get("gemms", [])):
            biased.add(str(m["model"]))
    attention: dict[tuple[str, int, int], float] = {}
    for a in body.get("attention") or []:
        if a.get("efficiency") is None or int(a.get("tp", 1)) != 1 or int(a.get("cp", 1)) != 1:
            continue
        attention[(str(a["model"]), int(a["micro_batch"]), int(a["seq"]))] = float(a["efficiency"])
        hidden[str(a["model"])] = int(a["hidden"])
    return GemmShapes(
        run_id=doc.run_id,
        evidence_level=doc.evidence_level,
        device=str(body["device"]),
        efficiency=eff,
        hidden=hidden,
        version=FORMATS.index(body["format"]) + 1,
        biased=frozenset(biased),
        attention=attention,
        forward=forward,
    )


def forward_efficiency(gemms: list[dict[str, Any]], peak_flops: float) -> float | None:
    """The FLOP-weighted fraction of ``peak_flops`` of a probe entry's layer forward GEMMs (pass
    ``fwd``, the ``output`` layer left out), or None without them or a peak."""
    flops = secs = 0.0
    for g in gemms:
        if g.get("pass") == "fwd" and g.get("name") != "output":
            flops += float(g["count"]) * float(g["flops"])
            secs += float(g["count"]) * float(g["time_s"])
    if not peak_flops or not flops or not secs:
        return None
    return flops / secs / peak_flops


def gemm_shape_calibration(root: Any) -> GemmShapes | None:
    """The GPU (``real-training``) GEMM-shape calibrations under ``root``/PAR-TRAINING-STATE
    made on the newest one's device, merged (``merge``), or None."""
    from parlab.plan.fit.probes import newest_device_calibrations

    cals = newest_device_calibrations(root, PROJECT, PREFIX, load_gemm_shapes)
    return merge(cals) if cals else None


def merge(cals: list[GemmShapes]) -> GemmShapes:
    """Several probes of one device as one. The probe's own repeatability is a few percent (the
    1.3B at 8,192 tokens: 0.696, then 0.673 of peak on another H200), so a later probe adds to
    the earlier ones instead of replacing them:

    - a (model, tokens)'s GEMM efficiency is the mean over the probes that measured it, of the
      newest era among them (``_era``): v1 left out the bias gradients that v2 counts, so a
      biased model's v1 and v2 efficiencies measure different work and are not averaged (v2
      alone); an unbiased model has no bias gradient, so its v1 and v2 measurements time the
      same GEMMs the same way and all count (more repeats, the same work); v3 times the kernels
      without the host's launch gaps, so where a v3 probe measured it, v3 alone counts;
    - a (model, tokens)'s forward efficiency (``forward``) likewise, v1 and v2 one era (no bias
      gradient among the forward GEMMs), v3 its own;
    - a (model, micro-batch, sequence)'s attention efficiency is the mean over the probes of
      the newest format that measured it (v2 timed it with launch gaps, v3 without)."""
    if len(cals) == 1:
        return cals[0]
    seen: dict[tuple[str, int], list[tuple[int, float]]] = {}
    forward: dict[tuple[str, int], list[tuple[int, float]]] = {}
    attention: dict[tuple[str, int, int], list[tuple[int, float]]] = {}
    hidden: dict[str, int] = {}
    biased: set[str] = set()
    for c in cals:
        biased |= c.biased
    for c in cals:
        for k, v in c.efficiency.items():
            seen.setdefault(k, []).append((_era(c.version, k[0] in biased), v))
        for k, v in c.forward.items():  # no bias gradient among them: v1 and v2 alike
            forward.setdefault(k, []).append((_era(c.version, False), v))
        for k, v in c.attention.items():
            attention.setdefault(k, []).append((c.version, v))
        hidden.update(c.hidden)

    def newest_mean(vals: list[tuple[int, float]]) -> float:
        top = max(v for v, _ in vals)
        kept = [e for v, e in vals if v == top]
        return sum(kept) / len(kept)

    return GemmShapes(
        run_id=" + ".join(c.run_id for c in cals),
        evidence_level=cals[-1].evidence_level,
        device=cals[-1].device,
        efficiency={k: newest_mean(v) for k, v in seen.items()},
        hidden=hidden,
        version=max(c.version for c in cals),
        biased=frozenset(biased),
        attention={k: newest_mean(v) for k, v in attention.items()},
        forward={k: newest_mean(v) for k, v in forward.items()},
    )


def _era(version: int, biased: bool) -> int:
    """The formats whose GEMM efficiencies measure the same thing share an era: v1 and v2 for a
    model without biases (no bias gradient to count), every version apart otherwise."""
    return 1 if version <= 2 and not biased else version


def run_batch(doc: Any) -> tuple[str, int, int, int, int, str]:
    """(model, micro-batch, sequence, tp, cp, GPU name) of a measured training run."""

    w, lay = doc.workload, doc.layout or {}
    mesh = lay.get("mesh") or {}
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or [{}]
    return (
        model_name(doc),
        int(w.get("micro_batch") or 1),
        int(w.get("seq") or 0),
        int(mesh.get("tp", 1)),
        int(mesh.get("cp", 1)),
        str(gpus[0].get("name")),
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
    from parlab.hardware.catalog import lookup

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
def canonical(model: Any) -> str:
    """The catalog's name of ``model`` (``8b`` and ``llama3.1-8b`` are one model), or the name
    as given where the catalog has none."""
    from parlab.models import get_spec

    try:
        return get_spec(str(model)).name
    except ValueError:
        return str(model)


@functools.cache
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

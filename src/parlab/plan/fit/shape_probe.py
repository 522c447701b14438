"""The GEMM-shape probe's calibration (``benchmarks/gemm_shapes_probe.py``'s
``gemm-shape-calibration`` documents): ``GemmShapes``, read from one document and merged over
several; ``parlab.plan.fit.shapes`` applies its factors to a step (its docstring says how)."""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Any

from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.plan.fit.probes import newest_device_calibrations

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


@functools.cache
def canonical(model: Any) -> str:
    """The catalog's name of ``model`` (``8b`` and ``llama3.1-8b`` are one model), or the name
    as given where the catalog has none."""
    try:
        return get_spec(str(model)).name
    except ValueError:
        return str(model)

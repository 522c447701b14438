"""The planner's built-in compute model: how fast GEMMs and the attention core run, by shape and
GPU, with no results folder (``parlab plan`` without ``--roofline`` or ``--mfu``).

**GEMMs.** A bf16 matrix product of ``rows x inner`` by ``inner x cols`` on one GPU runs at

    eff = min(ceiling, E x T / (T + T0) x K / (K + K0)) x (P where a dimension is not a
          multiple of 8)

of the dense bf16 peak, ``T = rows x cols`` output elements (how many tiles the GPU's SMs share:
small outputs leave SMs idle) and ``K`` the inner dimension (how long each tile's main loop runs
against its fixed prologue and epilogue). Every GEMM of a block is priced at its own shape, on
one tensor-parallel rank: a linear ``y = x W^T`` of ``x`` (tokens x in) and ``W`` (out x in) is
the forward ``(tokens, in, out)``, the input gradient ``(tokens, out, in)`` and the weight
gradient ``(out, tokens, in)``; routed experts see ``tokens x top_k x ep / experts`` tokens
each. The step's GEMM efficiency is their FLOP-weighted harmonic mean (total FLOPs over total
seconds), the output layer's apart (``Roofline.head_gemm``).

**Attention core** (flash, causal): ``A x W / (W + W0) x d / (d + D0)`` with ``W`` the causal
score pairs of one layer's kernel on one rank (micro-batch x local heads x tokens^2 / 2) and
``d`` the head dimension; the context-parallel ring runs blocks of ``(seq / cp)^2`` pairs. With
the materialised kernel (``math``) the scores are batched GEMMs priced as above.

**Memory-bound work** runs at ``memory`` x the catalog's HBM bandwidth.

The figures per GPU (``EFFICIENCY``, shipped in ``efficiency.json``) are fitted by
``benchmarks/plan_efficiency.py`` on the committed H200 GEMM-shape probes, and for GPUs the lab
has not measured taken from the public figures that script cites; each GPU says what it rests on
(``GpuEfficiency.rests_on``). Nothing here imports torch or crosses a wire.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Protocol

from parlab.errors import UsageError
from parlab.hardware.catalog import GPUSpec
from parlab.ledger.implementation import Implementation
from parlab.ledger.sharding import tp_local_shape
from parlab.models.spec import ModelSpec
from parlab.plan.roofline import Roofline


@dataclass(frozen=True, kw_only=True)
class StepShape:
    """What a compute model looks up for one rank's step: a planned candidate's or a measured
    run's shapes."""

    model: str
    """Model name (canonical, as the catalog spells it)."""
    micro_batch: int
    """Sequences per rank per micro-batch."""
    seq: int
    """Tokens per sequence."""
    tp: int = 1
    """Tensor-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    ep: int = 1
    """Expert-parallel degree."""
    gpu: str
    """The GPU's name, as the run's environment or the catalog gives it."""
    recompute: str = "none"
    """Recompute mode in the planner's names."""

    @property
    def tokens(self) -> int:
        """Tokens per micro-batch per rank."""
        return self.micro_batch * self.seq // self.cp


class ComputeModel(Protocol):
    """Efficiencies per step shape: the built-in model (``BuiltinCompute``) or one fitted on a
    results folder (``parlab.plan.fit.lab.LabCompute``)."""

    kind: str
    """``built-in`` or ``fitted``: which error band its predictions carry
    (``parlab.plan.precision``)."""

    def roofline(self, shape: StepShape) -> Roofline:
        """The efficiencies of one rank's step of ``shape``."""
        ...

    def describe(self, shape: StepShape) -> str:
        """One line: what the efficiencies for ``shape`` rest on."""
        ...


@dataclass(frozen=True, kw_only=True)
class GpuEfficiency:
    """One GPU's figures (the module docstring's E, T0, K0, P, A, W0, D0)."""

    gpu: str
    """Catalog name."""
    gemm_max: float
    """E: the asymptote of the GEMM law."""
    gemm_ceiling: float
    """The most any GEMM reaches (the best a sustained large GEMM measured)."""
    gemm_tiles: float
    """T0: output elements at which the tile term halves."""
    gemm_depth: float
    """K0: inner dimension at which the depth term halves."""
    misaligned: float
    """P: the factor of a GEMM with a dimension not a multiple of 8."""
    attention_max: float
    """A: the asymptote of the causal flash attention core."""
    attention_work: float
    """W0: score pairs per kernel at which the attention term halves."""
    attention_head_dim: float
    """D0: head dimension at which the head-dimension term halves."""
    memory: float
    """Fraction of the catalog's HBM bandwidth the memory-bound kernels reach."""
    contention: float = 0.0
    """Compute lost per second of communication hidden under it."""
    link: float = 0.0
    """Fraction of the catalog's per-direction link bandwidth an all-reduce reaches inside a
    node (its bus bandwidth); 0: not measured (the catalog's figure)."""
    step_overhead: float = 0.0
    """What a real step adds to the sum of its kernels (launch gaps, synchronisation, the
    framework), as a fraction of that sum."""
    rests_on: str
    """What these figures rest on: the lab's probes (run ids) or the public sources cited."""

    def gemm(self, rows: float, inner: float, cols: float) -> float:
        """Efficiency of one GEMM (fraction of the dense bf16 peak)."""
        t = rows * cols
        eff = self.gemm_max * t / (t + self.gemm_tiles) * inner / (inner + self.gemm_depth)
        eff = min(self.gemm_ceiling, eff)
        if any(int(x) % 8 for x in (rows, inner, cols)):
            eff *= self.misaligned
        return eff

    def attention(self, pairs: float, head_dim: float) -> float:
        """Efficiency of the causal flash attention core on its causal FLOPs."""
        return (
            self.attention_max
            * pairs
            / (pairs + self.attention_work)
            * head_dim
            / (head_dim + self.attention_head_dim)
        )


FORMAT = "parlab-efficiency/v1"


@cache
def efficiency_table() -> dict[str, GpuEfficiency]:
    """The shipped figures (``efficiency.json``, written by ``benchmarks/plan_efficiency.py``)."""
    text = resources.files("parlab.plan").joinpath("efficiency.json").read_text()
    data = json.loads(text)
    if data.get("format") != FORMAT:
        raise ValueError(f"efficiency.json: format {data.get('format')!r}, expected {FORMAT}")
    return {name: GpuEfficiency(gpu=name, **fig) for name, fig in data["gpus"].items()}


def efficiency_for(gpu: GPUSpec) -> GpuEfficiency:
    """The figures of ``gpu``; ``UsageError`` naming the missing figure where it has none."""
    fig = efficiency_table().get(gpu.name)
    if fig is None:
        known = ", ".join(efficiency_table())
        raise UsageError(
            f"{gpu.name} has no GEMM and attention efficiency figures (needed by the built-in "
            f"compute model; known: {known}): give --mfu, or --roofline RESULTS measured on it"
        )
    return fig


def linear_gemms(
    spec: ModelSpec, layer: int, *, tokens: int, tp: int, ep: int = 1
) -> list[tuple[float, float, float, float]]:
    """Forward ``(rows, inner, cols, count)`` of every matmul of block ``layer`` on one TP/EP
    rank at ``tokens`` tokens per micro-batch (routed experts at their share of the tokens)."""
    out = []
    m = spec.moe
    for name, shape in spec.block_shapes(layer):
        if len(shape) < 2 or not name.endswith(("weight", "w1", "w2", "w3")):
            continue
        local = tp_local_shape(spec, name, shape, tp, ep)
        if ".experts." in name and m is not None:
            per = tokens * m.top_k * ep / m.num_experts
            out.append((per, local[2], local[1], float(local[0])))
        else:
            out.append((float(tokens), local[1], local[0], 1.0))
    return out


def passes(rows: float, inner: float, cols: float) -> list[tuple[float, float, float]]:
    """The forward, input-gradient and weight-gradient GEMMs of a linear's forward shape."""
    return [(rows, inner, cols), (rows, cols, inner), (cols, rows, inner)]


def mean_efficiency(
    fig: GpuEfficiency, gemms: list[tuple[float, float, float, float]], *, forward_only: bool
) -> float:
    """FLOP-weighted harmonic mean efficiency of ``gemms`` (forward shapes) and their passes."""
    flops = seconds = 0.0
    for rows, inner, cols, count in gemms:
        shapes = [(rows, inner, cols)] if forward_only else passes(rows, inner, cols)
        for r, k, c in shapes:
            f = 2.0 * r * k * c * count
            flops += f
            seconds += f / fig.gemm(r, k, c)
    return flops / seconds if seconds else fig.gemm_ceiling


@dataclass(frozen=True, kw_only=True)
class BuiltinCompute:
    """The built-in compute model for one model on one GPU (see the module docstring)."""

    spec: ModelSpec
    """The model."""
    gpu: GPUSpec
    """The GPU."""
    impl: Implementation = field(default_factory=Implementation)
    """Kernels (flash or materialised attention)."""
    kind: str = "built-in"
    """Which error band its predictions carry."""
    figures: GpuEfficiency | None = None
    """The GPU's figures (default: the shipped ones, ``efficiency_for``)."""

    def __post_init__(self) -> None:
        if self.figures is None:
            object.__setattr__(self, "figures", efficiency_for(self.gpu))

    def roofline(self, shape: StepShape) -> Roofline:
        assert self.figures is not None
        return _builtin_roofline(self.spec, self.figures, self.impl, shape)

    def describe(self, shape: StepShape) -> str:
        roof = self.roofline(shape)
        fig = self.figures
        assert fig is not None
        return (
            f"compute (built-in, parlab.plan.compute): {self.spec.name}'s GEMMs at "
            f"{shape.tokens:,} tokens per micro-batch on tp {shape.tp} run at {roof.gemm:.2f} of "
            f"the {self.gpu.name} bf16 peak (the output layer {roof.head_gemm:.2f}), the attention "
            f"core at {roof.attention:.2f}, memory-bound work at {roof.memory:.2f} of its HBM "
            f"bandwidth, the step {100 * fig.step_overhead:.0f} % over its kernels' sum; "
            f"{self.gpu.name}'s figures rest on {fig.rests_on}"
        )


@cache
def _builtin_roofline(
    spec: ModelSpec, fig: GpuEfficiency, impl: Implementation, shape: StepShape
) -> Roofline:
    tokens, tp = shape.tokens, shape.tp
    kinds = {spec.is_moe_layer(i): i for i in range(spec.layers)}
    blocks = [
        g for i in kinds.values() for g in linear_gemms(spec, i, tokens=tokens, tp=tp, ep=shape.ep)
    ]
    vocab = spec.vocab_size // tp
    head = [(float(tokens), float(spec.hidden), float(vocab), 1.0)]
    heads_local = max(1, spec.heads // tp)
    d = spec.mla.qk_head_dim if spec.mla is not None else spec.d_head
    if impl.attention_kernel == "flash":
        # one kernel's causal pairs; the ring's blocks are of the local sequence too
        pairs = shape.micro_batch * heads_local * (shape.seq / shape.cp) ** 2 / 2
        attn = ring = fig.attention(pairs, d)
    else:  # materialised scores: two batched GEMMs per head (QK^T, then P V)
        s = shape.seq / shape.cp
        bh = shape.micro_batch * heads_local
        attn = mean_efficiency(fig, [(s, d, s, bh), (s, s, d, bh)], forward_only=False)
        ring = attn
    return Roofline(
        gemm=mean_efficiency(fig, blocks, forward_only=False),
        head_gemm=mean_efficiency(fig, head, forward_only=False),
        recompute_gemm=mean_efficiency(fig, blocks, forward_only=True),
        attention=attn,
        ring_attention=ring,
        memory=fig.memory,
        contention=fig.contention,
        overhead=fig.step_overhead,
        source=f"built-in ({fig.rests_on})",
    )

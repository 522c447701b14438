"""The compute model fitted on a results folder (``parlab plan --roofline RESULTS``): the lab's
roofline, with the GEMM-shape probe's measured factors where they cover a step's shapes.

A client of ``parlab.plan.compute``'s protocol; ``parlab.plan`` never imports it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.plan.compute import StepShape
from parlab.plan.fit.shapes import attn_factor, gemm_factor, rc_efficiency, shaped
from parlab.plan.roofline import Roofline


@dataclass(frozen=True, kw_only=True)
class LabCompute:
    """The lab's fitted roofline, shaped per step where the probe measured it."""

    roofline_fit: Roofline
    """The roofline fitted on the folder's runs (``parlab.plan.fit.calibrate.lab_roofline``)."""
    shapes: Any = None
    """The folder's GEMM-shape calibration (``parlab.plan.fit.shape_probe.GemmShapes``), or None."""
    kind: str = "fitted"
    """Which error band its predictions carry."""

    def roofline(self, shape: StepShape) -> Roofline:
        if self.shapes is None:
            return self.roofline_fit
        return shaped(shape, self.roofline_fit, self.shapes)

    def describe(self, shape: StepShape) -> str:
        roof = self.roofline_fit
        out = (
            f"compute (fitted on the lab's runs, parlab.plan.fit): GEMMs at {roof.gemm:.3f} of "
            f"the bf16 peak at width {roof.gemm_width:g}, x f(hidden/tp) / f(width), f(n) = "
            f"n / (n + {roof.gemm_width_half:g}); the causal flash attention core at "
            f"{roof.attention:.3f} ({roof.ring_attention:.3f} as the context-parallel ring); "
            f"memory-bound work at {roof.memory:.3f} of HBM; contention {roof.contention:.3f} -- "
            f"{roof.source or 'efficiencies as given'}"
        )
        return out + (f"; {note}" if (note := shapes_note(shape, roof, self.shapes)) else "")


def shapes_note(shape: StepShape, roof: Roofline, shapes: Any) -> str:
    """What the GEMM-shape calibration changed for ``shape``, in words; '' where nothing."""
    if shapes is None:
        return ""
    parts = []
    if (g := gemm_factor(shape, roof, shapes)) is not None:
        parts.append(f"GEMMs x {g[0]:.3f} against {g[1]}'s (instead of the width law)")
    if (a := attn_factor(shape, roof, shapes)) is not None:
        parts.append(f"attention core x {a[0]:.3f} against {a[1]}'s")
    if (k := rc_efficiency(shape, shapes)) is not None:
        parts.append(f"the full recompute's GEMMs at {k:.3f} of peak")
    if not parts:
        return ""
    return (
        f"shapes: the GEMM-shape probe measured {shape.model} at {shape.micro_batch} x "
        f"{shape.seq} on {shape.gpu}: {'; '.join(parts)} ({shapes.label})"
    )

"""How ``--mfu`` and ``--measured`` price compute: every FLOP (PaLM's count, ``6 N + 12 L H Q T``
per token) at one achieved FLOP/s, assumed or measured by a training run."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.hardware.catalog import lookup
from parlab.models import flops, get_spec
from parlab.models.spec import ModelSpec
from parlab.plan.roofline import ComputeParts, Work


@dataclass(frozen=True, kw_only=True)
class Throughput:
    """Achieved FLOP/s per GPU and where it comes from."""

    mfu: float
    """Model FLOPs utilisation (fraction of the dense bf16 peak)."""
    peak_flops: float
    """The GPU's dense bf16 peak, FLOP/s."""
    source: str
    """``assumed MFU 0.40`` or ``measured: <run_id> ...``."""
    assumed: bool
    """True when the MFU is an assumption, not a measurement."""

    @property
    def achieved(self) -> float:
        return self.mfu * self.peak_flops


def flops_per_token(spec: ModelSpec, seq: int) -> tuple[float, str]:
    """Training FLOPs per token (forward + backward, no recompute) and the formula's source."""
    return float(flops.train_flops_per_token(spec, seq=seq)), "parlab.models.flops (6N + 12LHQT)"


def mfu_parts(work: Work, throughput: Throughput) -> ComputeParts:
    """Compute at one MFU: every FLOP of ``work`` (the attention core as PaLM counts it, the
    whole score square: twice the causal FLOPs) at ``throughput``; no memory-bound term."""
    total = work.gemm_flops + 2.0 * work.attention_flops
    return ComputeParts(
        gemm_s=total / throughput.achieved,
        attention_s=0.0,
        elementwise_s=0.0,
        step_s=0.0,
        forward_fraction=work.forward_fraction,
    )


def assumed_throughput(mfu: float, peak_flops: float | None, gpu: str) -> Throughput:
    """An assumed MFU on the catalog peak; ``UsageError`` when the peak is unknown."""
    if not 0.0 < mfu <= 1.0:
        raise UsageError(f"--mfu {mfu}: give a fraction in (0, 1], e.g. 0.4")
    if not peak_flops:
        raise UsageError(f"{gpu} has no bf16 peak in the catalog: MFU cannot be turned into time")
    return Throughput(mfu=mfu, peak_flops=peak_flops, source=f"assumed MFU {mfu:g}", assumed=True)


def measured_throughput(doc: Any, peak_flops: float) -> Throughput:
    """The MFU a training document measured on a GPU, applied to ``peak_flops``.

    Its ``mfu`` metric where known; else its ``tokens_per_s_per_gpu`` x FLOPs per
    token of its own model and sequence / its GPU's peak. ``UsageError`` when it
    has neither or did not run on a catalog GPU.
    """
    if doc.status != "ok":
        raise UsageError(f"{doc.run_id} failed: give a successful training run for --measured")
    gpus = ((doc.environment or {}).get("hardware") or {}).get("gpus") or []
    gpu = lookup(str(gpus[0]["name"])) if gpus else None
    if gpu is None or not gpu.peak("bf16"):
        raise UsageError(
            f"{doc.run_id} did not run on a catalog GPU ({doc.evidence_level}): its MFU is "
            "unknown; give a GPU training document or --mfu"
        )
    mfu = doc.metric("mfu")
    how = "its mfu metric"
    if mfu is None:
        tps = doc.metric("tokens_per_s_per_gpu")
        model = doc.workload.get("model")
        seq = doc.workload.get("seq")
        if tps is None or not isinstance(model, dict) or not seq:
            raise UsageError(
                f"{doc.run_id} has neither mfu nor tokens_per_s_per_gpu with its model and seq"
            )
        try:
            spec = get_spec(str(model.get("name")))
        except ValueError:
            fields = {k: v for k, v in model.items() if k in ModelSpec.__dataclass_fields__}
            spec = ModelSpec(**fields)
        fpt, _ = flops_per_token(spec, int(seq))
        mfu = tps * fpt / gpu.peak("bf16")  # type: ignore[operator]
        how = f"{tps:,.0f} tokens/s per GPU x {fpt / 1e9:.3g} GFLOP per token"
    return Throughput(
        mfu=float(mfu),
        peak_flops=peak_flops,
        source=f"measured MFU {mfu:.3f} of {doc.run_id} ({doc.evidence_level}, {gpu.name}; {how})",
        assumed=False,
    )

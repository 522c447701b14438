"""The built-in compute model's figures (``parlab.plan.compute``), fitted on the lab's probes.

For each GPU the lab measured (the newest device of the committed probes):

- the GEMM law ``E x T / (T + T0) x K / (K + K0)`` (``GpuEfficiency.gemm``) by least squares
  on log efficiency over every GEMM pass of the GEMM-shape probes of format v3 (timed back to
  back, not at the host's launch rate: ``parlab.plan.fit.shapes``), shapes whose dimensions are
  all multiples of 8; ``P`` the mean factor of the others; the ceiling the best aligned
  efficiency measured, or on Hopper the best sustained shape of the public table
  (``H100_GEMM_BEST``: the probe's short bursts run above what 100 iterations sustain);
- the causal flash attention law ``A x W / (W + W0) x d / (d + D0)`` on the probes'
  ``attention_efficiency`` metrics;
- ``memory``: the median fraction of the catalog's HBM bandwidth the param-work probes' passes
  reached (``parlab.plan.fit.paramwork``);
- ``link``: the best all-reduce bus bandwidth the NCCL sweeps on this GPU reached, over the
  catalog's per-direction link bandwidth;
- ``contention``: the compute lost per second of communication hidden under it, as the lab's
  roofline fit on its data-parallel runs found it (``parlab.plan.fit.calibrate.lab_roofline``);
- ``step_overhead``: what a real step adds to the sum of its kernels: the median, over the lab's
  one-GPU training runs (no communication) of models of at least 1e9 parameters at 4,096 tokens
  or more per micro-batch (``GPU_BOUND_TOKENS``: where the GPU, not the host, sets the step),
  of measured step / the built-in model's step, minus 1.

GPUs of the same die at the same clocks carry the measured GPU's figures (``SAME_DIE``: the
H100 SXM is the H200's GH100 at the same clocks and 700 W, with less and slower memory, so its
compute figures are the H200's and its memory figure a fraction of its own bandwidth). Others
take the public figures in ``PUBLIC``, each with its source. ``benchmarks/plan_efficiency.py``
writes the result to ``src/parlab/plan/efficiency.json``; a test checks that the shipped file
is what this module computes from the committed results.
"""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import replace
from importlib import resources
from pathlib import Path
from typing import Any

from parlab import contract
from parlab.hardware.catalog import lookup
from parlab.models import get_spec
from parlab.plan.admission import evaluate
from parlab.plan.compute import FORMAT, BuiltinCompute, GpuEfficiency
from parlab.plan.fit.requests import run_request
from parlab.plan.fit.runs import gpu_name, implementation_of

T0_GRID = (1e5, 2e5, 3e5, 5e5, 7e5, 1e6, 1.5e6, 2e6, 3e6)
K0_GRID = (0.0, 25.0, 50.0, 100.0, 150.0, 200.0, 300.0, 400.0, 600.0)
W0_GRID = tuple(float(x) for x in (1e6, 3e6, 1e7, 3e7, 5e7, 7e7, 1e8, 2e8))
D0_GRID = (0.0, 8.0, 16.0, 32.0, 64.0, 128.0)

GPU_BOUND_TOKENS = 4096
"""Tokens per micro-batch from which the lab's one-GPU runs of 1B+ models are GPU-bound: their
steps are tens to hundreds of milliseconds of kernels, far above the host's issue time."""

SAME_DIE = {"H200": ("H100-SXM",)}
"""Measured GPU -> catalog GPUs on the same die at the same clocks (compute figures shared)."""

A100_GEMM_BEST = 271.2e12 / 312e12
"""A100 SXM's best-shape bf16 matmul, 271.2 TFLOP/s of 312 (86.9 %): Stas Bekman, "Machine
Learning Engineering", compute/accelerator/README.md, the maximum achievable matmul FLOPS table
(stas00/ml-engineering @ 744d01e, torch 2.6.0+cu126, shape 1024 x 10240 x 5120)."""
H100_GEMM_BEST = 794.5e12 / 989e12
"""H100 SXM's, 794.5 TFLOP/s of 989 (80.3 %), the same table ("H200 is the same")."""
A100_SMS, HOPPER_SMS = 108, 132
"""Streaming multiprocessors of an A100 and of an H100/H200 SXM (their datasheets): the tile
term's T0 scales with how many output tiles keep every SM busy."""
FA2_A100_CAUSAL = {  # (head dim, sequence) -> TFLOP/s forward + backward
    (64, 512): 88, (64, 1024): 119, (64, 2048): 140, (64, 4096): 156, (64, 8192): 165,
    (64, 16384): 171, (128, 512): 99, (128, 1024): 133, (128, 2048): 155, (128, 4096): 173,
    (128, 8192): 182, (128, 16384): 189,
}  # fmt: skip
"""FlashAttention-2 on an A100 80GB SXM4, causal, forward + backward (Dao, "FlashAttention-2",
arXiv 2307.08691, Fig. 4; Dao-AILab/flash-attention assets/flash2_a100_fwd_bwd_benchmark.png
@ 0251105): batch x sequence = 16k tokens, hidden 2048 (16 heads of 128 or 32 of 64)."""


def public_a100() -> dict[str, Any]:
    """The A100's figures from public sources: the GEMM law's shape as the lab measured it on
    the H200 (``h200``), its tiles scaled by the SM count, its level set so that the best shape
    runs at ``A100_GEMM_BEST`` where the H200's runs at ``H100_GEMM_BEST``; the attention law
    fitted on FlashAttention-2's A100 bars; memory and link as the H200's (assumed)."""
    rows = []
    for (d, seq), tflops in FA2_A100_CAUSAL.items():
        heads = 2048 // d
        pairs = (16384 // seq) * heads * seq * seq / 2
        rows.append((pairs, float(d), tflops * 1e12 / 312e12))
    return {
        "attention": fit_attention(rows),
        "gemm_scale": A100_GEMM_BEST / H100_GEMM_BEST,
        "tiles_scale": A100_SMS / HOPPER_SMS,
        "rests_on": (
            "public figures: best-shape bf16 matmul 271.2 of 312 TFLOP/s (ml-engineering's "
            "maximum achievable matmul table), FlashAttention-2's A100 forward + backward bars "
            "(arXiv 2307.08691 Fig. 4); the GEMM law's shape, the memory and link fractions and "
            "the contention carried from the lab's H200 probes and runs (assumed)"
        ),
    }


def gemm_rows(docs: list[Any]) -> list[tuple[float, float, float, float]]:
    """(rows, inner, cols, efficiency) of every GEMM pass the v3 probes timed."""
    seen: dict[tuple[int, int, int, str], float] = {}
    for d in docs:
        cal = d.workload["calibration"]
        if cal.get("format") != "parlab-gemm-shapes/v3":
            continue
        peak = float(cal["peak_flops"])
        for m in cal["models"]:
            for g in m["gemms"]:
                if not g["flops"]:
                    continue  # a bias gradient: no matmul
                M, K, N = g["m"], g["k"], g["n"]
                shape = {"fwd": (M, K, N), "dgrad": (M, N, K), "wgrad": (N, M, K)}[g["pass"]]
                seen[(*shape, g["pass"])] = g["flops_per_s"] / peak
    return [(float(r), float(k), float(c), e) for (r, k, c, _), e in seen.items()]


def fit_gemm(rows: list[tuple[float, float, float, float]]) -> dict[str, float]:
    """The GEMM law's figures (grid over T0, K0; E and P in closed form on log efficiency)."""
    aligned = [r for r in rows if all(int(x) % 8 == 0 for x in r[:3])]
    other = [r for r in rows if r not in aligned]
    best: tuple[float, dict[str, float]] | None = None
    for t0, k0 in itertools.product(T0_GRID, K0_GRID):

        def base(r: tuple[float, float, float, float], t0: float = t0, k0: float = k0) -> float:
            t = r[0] * r[2]
            return math.log(t / (t + t0)) + math.log(r[1] / (r[1] + k0))

        le = statistics.fmean(math.log(r[3]) - base(r) for r in aligned)
        err = sum((math.log(r[3]) - base(r) - le) ** 2 for r in aligned)
        lp = statistics.fmean(math.log(r[3]) - base(r) - le for r in other) if other else 0.0
        if best is None or err < best[0]:
            best = (err, {"gemm_max": math.exp(le), "gemm_tiles": t0, "gemm_depth": k0,
                          "misaligned": math.exp(lp)})  # fmt: skip
    assert best is not None
    return {**best[1], "gemm_ceiling": max(r[3] for r in aligned)}


def _attention_rows(docs: list[Any]) -> list[tuple[float, float, float]]:
    """(score pairs per kernel, head dim, efficiency) of the v3 probes' attention entries."""
    out: dict[tuple[str, int, int], tuple[float, float, float]] = {}
    for d in docs:
        if d.workload["calibration"].get("format") != "parlab-gemm-shapes/v3":
            continue
        for key, m in d.metrics.items():
            if not key.startswith("attention_efficiency:"):
                continue
            model, shape = key.split(":", 1)[1].split("@")
            mb, seq = (int(x) for x in shape.split("x"))
            spec = get_spec("llama3.1-8b" if model == "8b" else model)
            pairs = mb * spec.heads * seq * seq / 2
            out[(model, mb, seq)] = (pairs, float(spec.d_head), float(m.value))
    return list(out.values())


def fit_attention(rows: list[tuple[float, float, float]]) -> dict[str, float]:
    """The attention law's figures (grid over W0, D0; A in closed form on log efficiency)."""
    best: tuple[float, dict[str, float]] | None = None
    for w0, d0 in itertools.product(W0_GRID, D0_GRID):

        def base(r: tuple[float, float, float], w0: float = w0, d0: float = d0) -> float:
            return math.log(r[0] / (r[0] + w0)) + math.log(r[1] / (r[1] + d0))

        la = statistics.fmean(math.log(r[2]) - base(r) for r in rows)
        err = sum((math.log(r[2]) - base(r) - la) ** 2 for r in rows)
        if best is None or err < best[0]:
            best = (err, {"attention_max": math.exp(la), "attention_work": w0,
                          "attention_head_dim": d0})  # fmt: skip
    assert best is not None
    return best[1]


def _memory(docs: list[Any]) -> float:
    """Median fraction of the catalog's HBM bandwidth over the param-work probes' passes."""
    fracs = [float(m.value) for d in docs for k, m in d.metrics.items() if k.startswith("of_hbm:")]
    return statistics.median(fracs)


def _link(docs: list[Any], link_bw: float) -> float:
    """The best all-reduce bus bandwidth of the NCCL sweeps over the catalog link bandwidth."""
    peaks = [d.metric("all_reduce.busbw_peak") or 0.0 for d in docs]
    return max(peaks) / link_bw


def _step_overhead(root: Path, gpu: str, fig: dict[str, Any]) -> float:
    """Median measured / built-in step - 1 over the GPU-bound one-GPU runs (module docstring)."""
    from parlab.plan.fit.calibrate import training_runs  # lazy: numpy

    eff = GpuEfficiency(**{k: v for k, v in fig.items() if k != "rests_on"}, rests_on="fit")
    ratios = []
    for doc in training_runs(root):
        made = run_request(doc)
        if made is None or made[0].cluster.gpu.name != gpu or made[0].cluster.count != 1:
            continue
        req, cand, sp = made
        if req.spec.num_params() < 1e9 or cand.micro_batch * req.seq < GPU_BOUND_TOKENS:
            continue
        model = BuiltinCompute(spec=req.spec, gpu=req.cluster.gpu, impl=implementation_of(doc),
                               figures=eff)  # fmt: skip
        v = evaluate(replace(req, compute=model), cand, sp=sp)
        measured = doc.metric("step_time")
        if v.estimate is not None and measured:
            ratios.append(measured / v.estimate.step_s)
    return statistics.median(ratios) - 1.0 if ratios else 0.0


def _contention(root: Path) -> float:
    """The contention the lab's roofline fit finds on the folder's runs."""
    from parlab.plan.fit.calibrate import collectives_calibration, lab_roofline  # lazy: numpy

    roof, _ = lab_roofline(root, calibration=collectives_calibration(root))
    return roof.contention


def probe_documents(entries: list[Any], project: str, prefix: str) -> list[Any]:
    return [
        e.doc
        for e in entries
        if e.doc.project == project
        and e.doc.run_id.startswith(prefix)
        and e.doc.evidence_level in ("real-training", "real-nccl")
        and e.doc.status == "ok"
    ]


def fit_all(root: Path) -> dict[str, Any]:
    """The efficiency table for every GPU the probes under ``root`` measured, and its kin."""
    entries, _ = contract.read_results(root)
    shapes = probe_documents(entries, "PAR-TRAINING-STATE", "gemm-shapes")
    work = probe_documents(entries, "PAR-TRAINING-STATE", "param-work")
    sweeps = probe_documents(entries, "PAR-COLLECTIVES", "collectives-2")
    gpus: dict[str, Any] = {}
    devices = sorted({d.workload["calibration"]["device"] for d in shapes})
    for device in devices:
        spec = lookup(device)
        assert spec is not None, device
        mine = [d for d in shapes if d.workload["calibration"]["device"] == device]
        runs = sorted(d.run_id for d in mine)
        fig = {**fit_gemm(gemm_rows(mine)), **fit_attention(_attention_rows(mine))}
        if spec.name in ("H200", "H100-SXM"):  # sustained, not the probe's short bursts
            fig["gemm_ceiling"] = min(fig["gemm_ceiling"], H100_GEMM_BEST)
        same = [d for d in work if d.workload["calibration"]["device"] == device]
        nccl = [d for d in sweeps if gpu_name(d) == device and d.layout.get("backend") == "nccl"]
        fig["memory"] = _memory(same)
        fig["link"] = _link(nccl, spec.link_bw) if nccl else 0.0
        fig["contention"] = _contention(root)
        fig["step_overhead"] = _step_overhead(root, spec.name, {**fig, "gpu": spec.name})
        runs += sorted(d.run_id for d in same) + sorted(d.run_id for d in nccl)
        v3 = [d for d in mine if d.workload["calibration"].get("format", "").endswith("v3")]
        fig["rests_on"] = (
            f"the lab's probes on {spec.name}: {len(v3)} GEMM-shape (v3), {len(same)} "
            f"param-work and {len(nccl)} NCCL sweep documents under results/ "
            f"({min(runs)[-22:-7]} to {max(runs)[-22:-7]})"
        )
        gpus[spec.name] = _rounded(fig)
        for kin in SAME_DIE.get(spec.name, ()):
            gpus[kin] = {**gpus[spec.name], "rests_on": (
                f"{spec.name}'s figures ({kin} is the same die at the same clocks and power): "
                + fig["rests_on"]
            )}  # fmt: skip
    if "H200" in gpus:
        h = gpus["H200"]
        a = public_a100()
        a100 = {
            **h,
            **_rounded(a["attention"]),
            "gemm_max": float(f"{h['gemm_max'] * a['gemm_scale']:.4g}"),
            "gemm_ceiling": float(f"{A100_GEMM_BEST:.4g}"),
            "gemm_tiles": float(f"{h['gemm_tiles'] * a['tiles_scale']:.4g}"),
            "rests_on": a["rests_on"],
        }
        gpus["A100-80GB"] = a100
        gpus["A100-40GB"] = {
            **a100,
            "rests_on": "the A100-80GB's (the same die and clocks): " + a["rests_on"],
        }
    return {"format": FORMAT, "gpus": gpus}


def _rounded(fig: dict[str, Any]) -> dict[str, Any]:
    """Four significant digits: what the fit supports, and a stable file."""
    return {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in fig.items()}


def shipped() -> dict[str, Any]:
    """The table as shipped in the package."""
    return json.loads(resources.files("parlab.plan").joinpath("efficiency.json").read_text())

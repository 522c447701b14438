"""The bandwidth of the work done once per parameter per step, on one GPU.

Why: the roofline prices a step's per-parameter work -- fused AdamW (28 B a float32 parameter
under mixed precision: the gradient read, both states and the parameter read and written) and
autocast's casts (12 B: the weight to bf16, 4 + 2, and its bf16 gradient back, 2 + 4) -- at the
catalog's HBM bandwidth times the memory efficiency fitted on activation-sized elementwise work
(``parlab.plan.roofline``: ``step_bytes``). On one H200 the 7B and 8B runs at 1,024 tokens a
step, where that work sets the step, ran 34-49 % over the roofline, and their profiles put fused
AdamW at 78 ms over 6.74 billion parameters (about 2.4 TB/s, half the catalog's 4.8 TB/s:
``results/PAR-TRAINING-STATE/profile-train-ddp-20261201T044931-29002b.json``). This probe
measures those bandwidths apart from any model, so that a term of the roofline can rest on them.

What is timed, over ``--params`` float32 parameters held as ``--shape`` tensors (default
4096 x 4096, a 7B's projection):

- ``adamw``: ``torch.optim.AdamW(fused=True)``'s step with its states made (``parlab train``'s
  optimizer on CUDA), 28 B a parameter;
- ``cast``: every weight to bf16 (``w.to(torch.bfloat16)``, what autocast does once per
  micro-batch), 6 B;
- ``grad_cast``: a bf16 gradient to float32 (``g.to(torch.float32)``), 6 B;
- ``zero_grad``: the float32 gradients zeroed in place (DDP's ``set_to_none=False``), 4 B;
- ``accumulate``: a float32 gradient added into the kept one (``grad += g``, autograd's
  AccumulateGrad when the gradient exists: DDP's bucket views), 12 B;
- ``scale``: the float32 gradients divided in place (``grad.div_(world)``, DDP's reducer on a
  bucket view before its all-reduce), 8 B.

The probe's earlier documents (``results/PAR-TRAINING-STATE/param-work-20261201T11*``) also
carry each kind's host seconds and a ``chunk_cat`` kind (FSDP2's reduce-scatter copy-in), made
for a host-time model since removed; readers skip them.

Each: ``--warmup`` untimed calls, then ``--repeats`` samples between two CUDA events
(``perf_counter`` on the CPU), the median; bandwidth = bytes / seconds, and its fraction of the
catalog's HBM bandwidth (``parlab.hardware.catalog``; unknown device, e.g. the CPU: none).

Output: a ``distributed-benchmark/v1`` document under ``RESULTS_DIR/PAR-TRAINING-STATE/``
(``param-work-<stamp>.json``, task T6, role baseline, evidence ``real-training`` on a GPU and
``cpu-mechanism`` on the CPU) with ``workload.calibration`` and one metric per kind; it records
no ``step_time``, so it is never taken for a training run.

    python3 benchmarks/param_work_probe.py RESULTS_DIR [--params 1e9]
    scripts/gpu/param_work.sh OUT_DIR      # the GPU run
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch
from gemm_shapes_probe import time_gemm

from parlab.plan.elementwise import DDP_BUCKET_PASSES

FORMAT = "parlab-param-work/v1"
KIND = "param-work-calibration"
BYTES_PER_PARAM = {"adamw": 28, "cast": 6, "grad_cast": 6, **DDP_BUCKET_PASSES}
"""What each kind moves per float32 parameter: the roofline's counts (fused AdamW's 28 B,
``CAST_BYTES_PER_PARAM`` split between the two casts, ``DDP_BUCKET_PASSES``)."""


def probe(
    params: int,
    shape: tuple[int, int],
    dev: torch.device,
    *,
    warmup: int,
    repeats: int,
) -> dict[str, Any]:
    """Seconds (median) and bytes of each kind over ``params`` parameters (rounded down to
    whole ``shape`` tensors, at least one)."""
    per = shape[0] * shape[1]
    n = max(1, params // per)
    ws = [torch.nn.Parameter(torch.randn(shape, device=dev)) for _ in range(n)]
    for w in ws:
        w.grad = torch.randn_like(w)
    fused = dev.type == "cuda"
    opt = torch.optim.AdamW(ws, lr=1e-4, fused=fused, foreach=None if fused else False)
    opt.step()  # the states exist from here on
    g16 = torch.randn(shape, device=dev, dtype=torch.bfloat16)
    g32 = torch.randn(shape, device=dev)
    kinds: dict[str, Any] = {
        "adamw": opt.step,
        "cast": lambda: [w.detach().to(torch.bfloat16) for w in ws],
        "grad_cast": lambda: [g16.to(torch.float32) for _ in ws],
        "zero_grad": lambda: opt.zero_grad(set_to_none=False),
        "accumulate": lambda: [w.grad.add_(g32) for w in ws],
        "scale": lambda: [w.grad.div_(1.0) for w in ws],
    }
    out = {}
    with torch.no_grad():
        for kind, fn in kinds.items():
            t = statistics.median(time_gemm(fn, dev, warmup=warmup, repeats=repeats, inner=1))
            out[kind] = {"seconds": t, "bytes": float(BYTES_PER_PARAM[kind] * n * per)}
    return {"params": n * per, "tensors": n, "kinds": out}


def calibration(
    measured: dict[str, Any], *, device: str, backend: str, hbm_bw: float | None, **how: Any
) -> dict[str, Any]:
    """The ``workload.calibration`` body: each kind's bandwidth and its fraction of ``hbm_bw``."""
    kinds = {}
    for kind, m in measured["kinds"].items():
        bw = m["bytes"] / m["seconds"]
        kinds[kind] = {**m, "bytes_per_s": bw, "of_hbm": bw / hbm_bw if hbm_bw else None}
    return {"format": FORMAT, "device": device, "backend": backend, "hbm_bw": hbm_bw,
            "params": measured["params"], "tensors": measured["tensors"], "kinds": kinds,
            **how}  # fmt: skip


def document(body: dict[str, Any], *, command: str, environment: dict[str, Any]) -> Any:
    """The contract document holding ``body`` (see the module docstring)."""
    from parlab.contract import Metric
    from parlab.plan.fit.probes import probe_document

    metrics = {}
    for kind, k in body["kinds"].items():
        metrics[f"bytes_per_s:{kind}"] = Metric(value=k["bytes_per_s"], unit="B/s")
        if k["of_hbm"] is not None:
            metrics[f"of_hbm:{kind}"] = Metric(value=k["of_hbm"], unit="fraction")
    return probe_document(
        prefix="param-work",
        project="PAR-TRAINING-STATE",
        kind=KIND,
        body=body,
        gpu=body["backend"] == "cuda",
        command=command,
        environment=environment,
        layout={"world_size": 1, "mesh": {}, "strategy": "param-work-probe"},
        metrics=metrics,
        notes=[
            f"{body['params']:,} float32 parameters as {body['tensors']} tensors of "
            f"{' x '.join(map(str, body['shape']))}; bytes per parameter: "
            + ", ".join(f"{k} {v}" for k, v in BYTES_PER_PARAM.items())
            + "; median of the timed repeats"
        ],
    )


def summary(body: dict[str, Any]) -> list[str]:
    lines = [f"{body['params']:,} parameters on {body['device']}"]
    for kind, k in body["kinds"].items():
        of = "" if k["of_hbm"] is None else f" = {k['of_hbm']:.2f} of the catalog's HBM"
        lines.append(
            f"  {kind:<10} {k['seconds'] * 1e3:8.2f} ms  {k['bytes_per_s'] / 1e12:6.2f} TB/s{of}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder (the document goes to PAR-TRAINING-STATE/)")
    ap.add_argument("--params", type=float, default=1e9, help="float32 parameters (default 1e9)")
    ap.add_argument("--shape", default="4096x4096", help="each tensor's shape, ROWSxCOLS")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=10)
    a = ap.parse_args()
    try:
        rows, cols = (int(x) for x in a.shape.lower().split("x"))
    except ValueError:
        ap.error(f"--shape {a.shape!r}: give ROWSxCOLS, e.g. 4096x4096")
    if a.params < 1:
        ap.error(f"--params {a.params}: give at least one parameter")
    from parlab.contract import write_result
    from parlab.hardware.catalog import lookup
    from parlab.hardware.env import snapshot
    from parlab.runtime import meters

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    env = snapshot(probe_links=False)
    name = meters.device_name(dev)
    gpu = lookup(name) if cuda else None
    how = {"shape": [rows, cols], "warmup": a.warmup, "repeats": a.repeats}
    measured = probe(int(a.params), (rows, cols), dev, warmup=a.warmup, repeats=a.repeats)
    hbm = float(gpu.memory_bw) if gpu is not None else None
    body = calibration(measured, device=name, backend=dev.type, hbm_bw=hbm, **how)
    print("\n".join(summary(body)))
    doc = document(body, command=" ".join(["python3", *sys.argv]), environment=env)
    print(f"written {write_result(doc, a.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

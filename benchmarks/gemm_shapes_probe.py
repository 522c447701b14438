"""The achieved efficiency of each model's GEMM shapes on one GPU: the planner's shape factor.

Why: the roofline carries its GEMM efficiency, measured at the 1.3B's width, to other models by
a width law fitted on Llama-style runs (hidden 2048 and 4096). GPT-2 1.5B's GEMMs (hidden 1600,
FFN 6400, vocabulary 50257: none a multiple of 128) took 147-162 ms of kernel time a step in
its profiled runs against ~100 ms for the 1.3B at similar FLOPs: its shapes run below the law.
This probe measures each model's shapes directly (``parlab.plan.shapes`` reads the result).

What is timed, per model and tokens per micro-batch ``T`` (tp 1): every ``nn.Linear`` of one
transformer layer of the reference model (``parlab.models.reference``: wq, wk, wv, wo; w1, w3
for SwiGLU, w2) and the output layer (hidden -> vocabulary), each as three GEMMs, as autograd
runs them on the flattened ``[T, K]`` input of a ``[N, K]`` weight:

- ``fwd``:   ``F.linear(x_TK, w_NK, b_N)`` -> ``[T, N]`` (bias where the model has one);
- ``dgrad``: ``dy_TN @ w_NK`` -> ``[T, K]`` (the input's gradient);
- ``wgrad``: ``dy_TN.t() @ x_TK`` -> ``[N, K]`` (the weight's gradient),

each ``2 T N K`` FLOPs, bf16. Timing: ``--warmup`` untimed calls, then ``--repeats`` samples of
``--inner`` back-to-back calls between two CUDA events (``perf_counter`` on the CPU); a GEMM's
time is the median sample / ``inner``. Identical shapes (wq/wk/wv of MHA, w1/w3) are timed once.
A model's efficiency is FLOP-weighted: (layers x the layer's FLOPs + the output's) / (layers x
the layer's seconds + the output's) / the catalog's dense bf16 peak of the device
(``parlab.hardware.catalog``; unknown device, e.g. the CPU: no efficiency, FLOP/s only). The
attention core (flash SDPA) and the elementwise ops are not GEMMs here: the roofline prices them
apart. Nothing crosses a wire.

Output: a ``distributed-benchmark/v1`` document under ``RESULTS_DIR/PAR-TRAINING-STATE/``
(``gemm-shapes-<stamp>.json``, task T6, role baseline, evidence ``real-training`` on a GPU and
``cpu-mechanism`` on the CPU) whose ``workload.calibration`` lists every GEMM's shape, FLOPs and
seconds and each model's efficiency; it records no ``step_time`` metric, so it is never taken
for a training run. The environment line (torch, CUDA, device) is printed first.

    python3 benchmarks/gemm_shapes_probe.py RESULTS_DIR --model gpt2-1.5b:8192 --model 1.3b:4096,8192
    scripts/gpu/gemm_shapes.sh OUT_DIR      # the GPU run

``--model NAME[:T[,T...]]`` (T: tokens per micro-batch = micro-batch x sequence; default
``--tokens``). ``--shrink N`` divides every GEMM dimension by N (a CPU dry run; the planner
ignores such a document). Ctrl-C prints what was measured and writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
import torch.nn.functional as F

FORMAT = "parlab-gemm-shapes/v1"
KIND = "gemm-shape-calibration"
PASSES = ("fwd", "dgrad", "wgrad")


def layer_linears(spec: Any) -> list[tuple[str, int, int, bool]]:
    """(name, in K, out N, bias) of every linear of one layer of ``spec``'s reference model."""
    if spec.mla is not None or spec.moe is not None:
        raise ValueError(f"{spec.name}: MLA and MoE layers are not probed (dense MHA/GQA only)")
    h, f = spec.hidden, spec.ffn_hidden
    qkv_b, b = bool(spec.qkv_bias or spec.linear_bias), bool(spec.linear_bias)
    out = [
        ("wq", h, spec.q_dim, qkv_b),
        ("wk", h, spec.kv_dim, qkv_b),
        ("wv", h, spec.kv_dim, qkv_b),
        ("wo", spec.q_dim, h, b),
        ("w1", h, f, b),
    ]
    if spec.activation == "swiglu":
        out.append(("w3", h, f, b))
    out.append(("w2", f, h, b))
    return out


def gemm_list(spec: Any, tokens: int, shrink: int = 1) -> list[dict[str, Any]]:
    """Every GEMM of one layer (``count`` = layers) and of the output layer (``count`` 1), each
    pass, dimensions divided by ``shrink`` (rounded up)."""

    def cut(x: int) -> int:
        return max(1, -(-x // shrink))

    linears = [(n, k, o, b, spec.layers) for n, k, o, b in layer_linears(spec)]
    linears.append(("output", spec.hidden, spec.vocab_size, False, 1))
    out = []
    for name, k, n, bias, count in linears:
        for p in PASSES:
            m, kk, nn = cut(tokens), cut(k), cut(n)
            out.append({
                "name": name, "pass": p, "m": m, "k": kk, "n": nn, "count": count,
                "bias": bias and p == "fwd", "flops": 2.0 * m * kk * nn,
            })  # fmt: skip
    return out


def _operands(g: dict[str, Any], dev: torch.device, dtype: torch.dtype) -> Any:
    """A callable running ``g``'s GEMM on fresh random operands."""
    m, k, n = g["m"], g["k"], g["n"]
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype, generator=gen)

    if g["pass"] == "fwd":
        x, w = rnd(m, k), rnd(n, k)
        b = rnd(n) if g["bias"] else None
        return lambda: F.linear(x, w, b)
    if g["pass"] == "dgrad":
        dy, w = rnd(m, n), rnd(n, k)
        return lambda: torch.matmul(dy, w)
    dy, x = rnd(m, n), rnd(m, k)
    return lambda: torch.matmul(dy.t(), x)


def time_gemm(fn: Any, dev: torch.device, *, warmup: int, repeats: int, inner: int) -> list[float]:
    """Seconds per call, one sample per repeat (``inner`` calls between two CUDA events)."""
    for _ in range(warmup):
        fn()
    samples = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(repeats)
        ]
        for start, end in events:
            start.record()
            for _ in range(inner):
                fn()
            end.record()
        torch.cuda.synchronize(dev)
        samples = [s.elapsed_time(e) / 1e3 / inner for s, e in events]
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return samples


def probe(
    models: list[tuple[str, list[int]]],
    dev: torch.device,
    *,
    shrink: int = 1,
    warmup: int = 5,
    repeats: int = 10,
    inner: int = 3,
    interrupted: list[dict[str, Any]] | None = None,
) -> list[dict[str, Any]]:
    """One entry per (model, tokens): its GEMMs with their median seconds per call. Appends each
    finished entry to ``interrupted`` as it goes (what Ctrl-C prints)."""
    from parlab.models import get_spec

    dtype = torch.bfloat16
    cache: dict[tuple[Any, ...], tuple[float, list[float]]] = {}
    done = interrupted if interrupted is not None else []
    for name, token_counts in models:
        spec = get_spec(name)
        for tokens in token_counts:
            gemms = gemm_list(spec, tokens, shrink)
            for g in gemms:
                key = (g["pass"], g["m"], g["k"], g["n"], g["bias"])
                if key not in cache:
                    fn = _operands(g, dev, dtype)
                    s = time_gemm(fn, dev, warmup=warmup, repeats=repeats, inner=inner)
                    cache[key] = (statistics.median(s), s)
                    del fn
                g["time_s"], g["samples_s"] = cache[key]
                g["flops_per_s"] = g["flops"] / g["time_s"]
            done.append({
                "model": name, "hidden": spec.hidden, "ffn_hidden": spec.ffn_hidden,
                "vocab_size": spec.vocab_size, "layers": spec.layers, "tp": 1, "tokens": tokens,
                "gemms": gemms,
            })  # fmt: skip
    return done


def calibration(
    entries: list[dict[str, Any]],
    *,
    device: str,
    backend: str,
    peak_flops: float | None,
    shrink: int,
    warmup: int,
    repeats: int,
    inner: int,
) -> dict[str, Any]:
    """The ``workload.calibration`` body: each entry with its FLOP-weighted totals (one
    micro-batch: ``count`` x each GEMM) and efficiency against ``peak_flops`` (None: unknown)."""
    models = []
    for e in entries:
        flops = sum(g["count"] * g["flops"] for g in e["gemms"])
        secs = sum(g["count"] * g["time_s"] for g in e["gemms"])
        per_name: dict[str, dict[str, float]] = {}
        for g in e["gemms"]:
            d = per_name.setdefault(g["name"], {"flops": 0.0, "time_s": 0.0})
            d["flops"] += g["flops"]
            d["time_s"] += g["time_s"]
        models.append({
            **e,
            "flops": flops,
            "time_s": secs,
            "flops_per_s": flops / secs,
            "efficiency": None if not peak_flops else flops / secs / peak_flops,
            "by_linear": {
                n: {**d, "efficiency": None if not peak_flops else d["flops"] / d["time_s"] / peak_flops}
                for n, d in per_name.items()
            },
        })  # fmt: skip
    return {
        "format": FORMAT,
        "device": device,
        "backend": backend,
        "dtype": "bf16",
        "peak_flops": peak_flops,
        "shrink": shrink,
        "timing": {"warmup": warmup, "repeats": repeats, "inner": inner,
                   "clock": "cuda-events" if backend == "cuda" else "perf_counter",
                   "statistic": "median"},
        "models": models,
    }  # fmt: skip


def document(body: dict[str, Any], *, command: str, environment: dict[str, Any]) -> Any:
    """The contract document holding ``body`` (see the module docstring)."""
    from parlab.contract import Document, Metric, new_run_id, now_iso

    gpu = body["backend"] == "cuda"
    metrics = {}
    for m in body["models"]:
        key = f"{m['model']}@{m['tokens']}"
        metrics[f"gemm_time_per_microbatch:{key}"] = Metric(value=m["time_s"], unit="s")
        if m["efficiency"] is not None:
            metrics[f"gemm_efficiency:{key}"] = Metric(value=m["efficiency"], unit="fraction")
    return Document(
        run_id=new_run_id("gemm-shapes"),
        created=now_iso(),
        project="PAR-TRAINING-STATE",
        task="T6",
        role="baseline",
        evidence_level="real-training" if gpu else "cpu-mechanism",
        command=command,
        environment=environment,
        workload={"kind": KIND, "calibration": body},
        layout={"world_size": 1, "mesh": {}, "strategy": "gemm-shape-probe", "tp": 1},
        metrics=metrics,
        notes=[
            "each model's layer linears and output layer at tp 1, forward + dgrad + wgrad, bf16, "
            "timed in isolation (median of repeats); efficiency: FLOP-weighted over one "
            "micro-batch's GEMMs (layers x layer + output) against the catalog's bf16 peak"
            + ("" if body["shrink"] == 1 else f"; shapes shrunk {body['shrink']}x (dry run)"),
        ],
    )


def summary(body: dict[str, Any]) -> list[str]:
    lines = []
    for m in body["models"]:
        eff = m["efficiency"]
        lines.append(
            f"{m['model']} @ {m['tokens']} tokens: {m['flops'] / 1e12:.2f} TFLOP in "
            f"{m['time_s'] * 1e3:.2f} ms a micro-batch = {m['flops_per_s'] / 1e12:.1f} TFLOP/s"
            + ("" if eff is None else f" = {eff:.3f} of peak")
        )
        for n, d in m["by_linear"].items():
            e = d["efficiency"]
            lines.append(
                f"    {n:<7} {d['flops'] / d['time_s'] / 1e12:7.1f} TFLOP/s"
                + ("" if e is None else f"  {e:.3f}")
            )
    return lines


def parse_models(values: list[str], tokens: int) -> list[tuple[str, list[int]]]:
    """``NAME[:T[,T...]]`` -> (name, token counts)."""
    out = []
    for v in values:
        name, _, ts = v.partition(":")
        out.append((name, [int(t) for t in ts.split(",")] if ts else [tokens]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder (the document goes to PAR-TRAINING-STATE/)")
    ap.add_argument(
        "--model",
        action="append",
        required=True,
        help="NAME[:TOKENS[,TOKENS]] (tokens per micro-batch); repeat per model",
    )
    ap.add_argument("--tokens", type=int, default=8192, help="default tokens per micro-batch")
    ap.add_argument("--shrink", type=int, default=1, help="divide every dimension (CPU dry run)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--inner", type=int, default=3)
    a = ap.parse_args()  # fmt: skip
    from parlab.hardware.catalog import peak_flops
    from parlab.hardware.env import snapshot
    from parlab.runtime import meters

    cuda = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if cuda else torch.device("cpu")
    if not cuda:
        torch.set_num_threads(min(4, torch.get_num_threads()))
    env = snapshot(probe_links=False)
    sw = env.get("software") or {}
    name = meters.device_name(dev)
    print(f"torch {sw.get('torch')}, CUDA {sw.get('cuda')}; device {name}", flush=True)
    models = parse_models(a.model, a.tokens)
    done: list[dict[str, Any]] = []
    kw = dict(warmup=a.warmup, repeats=a.repeats, inner=a.inner)
    peak = peak_flops(name, "bf16") if cuda else None
    try:
        probe(models, dev, shrink=a.shrink, interrupted=done, **kw)
    except KeyboardInterrupt:
        body = calibration(done, device=name, backend=dev.type, peak_flops=peak,
                           shrink=a.shrink, **kw)  # fmt: skip
        print("\n".join(summary(body)))
        print("interrupted: nothing written")
        return 130
    from parlab.contract import write_result

    body = calibration(done, device=name, backend=dev.type, peak_flops=peak, shrink=a.shrink, **kw)
    print("\n".join(summary(body)))
    if cuda and peak is None:
        print(f"warning: {name} is not in the catalog: efficiency unknown (FLOP/s only)")
    doc = document(body, command=" ".join(["python3", *sys.argv]), environment=env)
    print(f"written {write_result(doc, a.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

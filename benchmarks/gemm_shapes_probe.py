"""The achieved efficiency of each model's GEMM shapes, bias gradients and attention core on one
GPU: the planner's shape factors (``parlab.plan.fit.shapes`` reads the result).

Why: the roofline carries its GEMM efficiency, measured at the 1.3B's width, to other models by
a width law fitted on Llama-style runs (hidden 2048 and 4096), and prices the attention core at
one efficiency fitted on the 1.3B (head dim 128). GPT-2 1.5B's GEMMs (hidden 1600, FFN 6400,
vocabulary 50257: none a multiple of 128) took 147-162 ms of kernel time a step in its profiled
runs against ~100 ms for the 1.3B at similar FLOPs: its shapes run below the law. Its profile on
one H200 (FSDP, 8 x 1024:
``results/PAR-TRAINING-STATE/profile-train-fsdp-20261201T042202-8b95ce.json``) also put 12.1 ms
a step in reduction kernels -- its linears' bias gradients, summed over the tokens (the 1.3B, no
biases: 1.9 ms) -- which no roofline term prices, and 17.5 ms in the attention core at head dim
64 where the roofline's attention term says 7.4 ms. This probe measures each model's shapes
directly.

What is timed, per model (tp 1):

- at each tokens per micro-batch ``T``: every ``nn.Linear`` of one transformer layer of the
  reference model (``parlab.models.reference``: wq, wk, wv, wo; w1, w3 for SwiGLU, w2) and the
  output layer (hidden -> vocabulary), as autograd runs them on the flattened ``[T, K]`` input
  of a ``[N, K]`` weight:

  - ``fwd``:   ``F.linear(x_TK, w_NK, b_N)`` -> ``[T, N]`` (bias where the model has one);
  - ``dgrad``: ``dy_TN @ w_NK`` -> ``[T, K]`` (the input's gradient);
  - ``wgrad``: ``dy_TN.t() @ x_TK`` -> ``[N, K]`` (the weight's gradient);
  - ``bgrad``: ``dy_TN.sum(0, keepdim=True)`` -> ``[1, N]``, only for a linear with a bias
    (``linear_bias``; wq/wk/wv also with ``qkv_bias``): the bias's gradient as autograd makes
    it (``AddmmBackward0`` hands back ``dy`` and the engine reduces it to the bias's shape with
    ``aten::sum(dy, [0], keepdim=True)`` in bf16, as ``torch.profiler`` shows for ``F.linear``
    on a 3-D input, whose flattened form is one ``addmm``);

  the first three ``2 T N K`` FLOPs each, ``bgrad`` 0: its seconds join the model's GEMM
  seconds, so a biased model's efficiency carries its bias reductions (the roofline's GEMM term
  then prices them) and an unbiased model's is as in v1;
- at each micro-batch ``B`` x sequence ``S``: one layer's attention core as the reference
  model's ``Attention`` runs it -- q ``[B, S, H, D]``, k and v ``[B, S, KV, D]``, seen as
  ``[B, heads, S, D]`` by ``transpose(1, 2)``, k and v ``repeat_interleave``-d to ``H`` heads
  where ``KV < H`` (GQA/MQA: the reference repeats them rather than passing ``enable_gqa``),
  ``F.scaled_dot_product_attention(is_causal=True)``, then its backward on an output gradient
  in the ``[B, S, H, D]`` layout the model's ``wo`` hands back; one call is forward + backward,
  bf16. Its FLOPs are the roofline's: ``causal_attention_flops_per_token(spec, S) / layers`` x
  ``B S`` tokens = ``6 H D S x B S``.

Timing: ``--warmup`` untimed calls, then ``--repeats`` samples of ``--inner`` back-to-back calls
between two CUDA events (``perf_counter`` on the CPU); a call's time is the median sample /
``inner``. On a GPU the timed launches are queued behind a ``torch.cuda._sleep`` (``QUEUE_S``)
before the GPU reaches them (format v3), so the events time the kernels back to back and not the
host's launches: a 20 us GEMM launched from Python otherwise waits on the host (GPT-2 124M's
GEMMs at 8,192 tokens timed at 0.198 of peak that way, against about 0.27 in earlier probes). Identical shapes (wq/wk/wv of MHA, w1/w3, one model's batches of equal tokens, models
of equal dimensions) are timed once. A model's GEMM efficiency is FLOP-weighted: (layers x the
layer's FLOPs + the output's) / (layers x the layer's seconds + the output's) / the catalog's
dense bf16 peak of the device (``parlab.hardware.catalog``; unknown device, e.g. the CPU: no
efficiency, FLOP/s only); the attention core's: its FLOPs / its seconds / the same peak. The
elementwise ops are not timed: the roofline prices them apart. Nothing crosses a wire.

Output: a ``distributed-benchmark/v1`` document under ``RESULTS_DIR/PAR-TRAINING-STATE/``
(``gemm-shapes-<stamp>.json``, task T6, role baseline, evidence ``real-training`` on a GPU and
``cpu-mechanism`` on the CPU) whose ``workload.calibration`` (format ``parlab-gemm-shapes/v3``)
lists every GEMM's shape, FLOPs and seconds, each model's efficiency, and the ``attention``
entries; it records no ``step_time`` metric, so it is never taken for a training run. The
environment line (torch, CUDA, device) is printed first.

    python3 benchmarks/gemm_shapes_probe.py RESULTS_DIR --model gpt2-1.5b:8x1024 --model 1.3b:8x1024,2x4096
    scripts/gpu/gemm_shapes.sh OUT_DIR      # the GPU run

``--model NAME[:ITEM[,ITEM...]]``, ITEM ``MBxSEQ`` (micro-batch x sequence: GEMMs at ``MB x SEQ``
tokens, attention at that batch) or ``T`` (tokens per micro-batch, as in v1: GEMMs at ``T``
tokens, attention at 1 x ``T``); no ITEM: ``--tokens``. ``--shrink N`` divides every GEMM
dimension, and the attention's heads, head dim and sequence, by N (a CPU dry run; the planner
ignores such a document). Ctrl-C prints what was measured and writes nothing.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
import torch.nn.functional as F

FORMAT = "parlab-gemm-shapes/v3"
QUEUE_S = 0.02
"""Seconds of GPU sleep queued ahead of each timed sample: longer than the host takes to launch
a sample's calls (``--inner`` calls of up to a few dozen kernels each)."""
"""v2: a model's GEMM seconds include its linears' bias gradients (``bgrad`` rows), and
``attention`` entries time the attention core. v1: forward, dgrad and wgrad only."""
KIND = "gemm-shape-calibration"
PASSES = ("fwd", "dgrad", "wgrad", "bgrad")
"""The passes of a linear; ``bgrad`` only where it has a bias."""

Batch = tuple[int, int]
"""(micro-batch, sequence) of one rank's micro-batch."""


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


def _cut(x: int, shrink: int) -> int:
    return max(1, -(-x // shrink))


def gemm_list(spec: Any, tokens: int, shrink: int = 1) -> list[dict[str, Any]]:
    """Every GEMM of one layer (``count`` = layers) and of the output layer (``count`` 1), each
    pass, dimensions divided by ``shrink`` (rounded up); a biased linear's ``bgrad`` row is its
    bias gradient (0 FLOPs)."""
    linears = [(n, k, o, b, spec.layers) for n, k, o, b in layer_linears(spec)]
    linears.append(("output", spec.hidden, spec.vocab_size, False, 1))
    out = []
    for name, k, n, bias, count in linears:
        m, kk, nn = _cut(tokens, shrink), _cut(k, shrink), _cut(n, shrink)
        for p in PASSES:
            if p == "bgrad" and not bias:
                continue
            out.append({
                "name": name, "pass": p, "m": m, "k": kk, "n": nn, "count": count,
                "bias": bias and p in ("fwd", "bgrad"),
                "flops": 0.0 if p == "bgrad" else 2.0 * m * kk * nn,
            })  # fmt: skip
    return out


def attention_flops(heads: int, head_dim: int, micro_batch: int, seq: int) -> float:
    """Training FLOPs of one layer's causal attention core over one micro-batch: the roofline's
    ``causal_attention_flops_per_token(spec, seq) / layers`` (``6 H D S``) x its ``B S`` tokens."""
    return 6.0 * heads * head_dim * seq * micro_batch * seq


def attention_shape(spec: Any, batch: Batch, shrink: int = 1) -> dict[str, Any]:
    """The attention core of one layer at ``batch`` as timed: heads, KV heads, head dim and
    sequence divided by ``shrink`` (rounded up; the heads stay a multiple of the KV heads), the
    micro-batch kept."""
    if spec.mla is not None:
        raise ValueError(f"{spec.name}: MLA attention is not probed (dense MHA/GQA only)")
    mb, seq = batch
    rep = spec.heads // spec.n_kv_heads
    kv = _cut(spec.n_kv_heads, shrink)
    b, h, s, d = mb, kv * rep, _cut(seq, shrink), _cut(spec.d_head, shrink)
    return {"batch": b, "heads": h, "kv_heads": kv, "seq": s, "head_dim": d,
            "flops": attention_flops(h, d, b, s)}  # fmt: skip


def _operands(g: dict[str, Any], dev: torch.device, dtype: torch.dtype) -> Any:
    """A callable running ``g``'s GEMM (or bias gradient) on fresh random operands."""
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
    if g["pass"] == "bgrad":  # AddmmBackward0's bias: aten::sum(dy, [0], keepdim=True)
        dy = rnd(m, n)
        return lambda: dy.sum(0, keepdim=True)
    dy, x = rnd(m, n), rnd(m, k)
    return lambda: torch.matmul(dy.t(), x)


def _attention_op(a: dict[str, Any], dev: torch.device, dtype: torch.dtype) -> Any:
    """A callable running one layer's attention core forward and backward as the reference
    model's ``Attention`` does: q, k, v in ``[B, S, heads, D]`` seen as ``[B, heads, S, D]``,
    k and v repeated to every query head (GQA/MQA), causal SDPA, the gradient of the output
    in its ``[B, S, heads, D]`` layout."""
    b, h, kv, s, d = a["batch"], a["heads"], a["kv_heads"], a["seq"], a["head_dim"]
    gen = torch.Generator(device=dev).manual_seed(0)

    def rnd(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=dev, dtype=dtype, generator=gen)

    q, k, v = rnd(b, s, h, d), rnd(b, s, kv, d), rnd(b, s, kv, d)
    for t in (q, k, v):
        t.requires_grad_(True)
    do = rnd(b, s, h, d).transpose(1, 2)
    rep = h // kv

    def step() -> tuple[torch.Tensor, ...]:
        qq, kk, vv = (t.transpose(1, 2) for t in (q, k, v))
        if rep > 1:
            kk = kk.repeat_interleave(rep, dim=1)
            vv = vv.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(qq, kk, vv, is_causal=True)
        return torch.autograd.grad(o, (q, k, v), do)

    return step


def _sleep_cycles(dev: torch.device, seconds: float) -> int:
    """GPU clock cycles in ``seconds`` at the device's clock rate (kHz, as torch reports it)."""
    rate_khz = getattr(torch.cuda.get_device_properties(dev), "clock_rate", 0) or 2_000_000
    return int(seconds * rate_khz * 1e3)


def time_gemm(
    fn: Any, dev: torch.device, *, warmup: int, repeats: int, inner: int, queue: bool = True
) -> list[float]:
    """Seconds per call, one sample per repeat (``inner`` calls between two CUDA events). On a
    GPU with ``queue``, each sample's launches wait behind a ``QUEUE_S`` GPU sleep, so the
    kernels run back to back whatever the host's launch time."""
    for _ in range(warmup):
        fn()
    samples = []
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
        cycles = _sleep_cycles(dev, QUEUE_S)
        for _ in range(repeats):
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            if queue:
                torch.cuda._sleep(cycles)  # the GPU busy while the host queues the sample
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            torch.cuda.synchronize(dev)
            samples.append(start.elapsed_time(end) / 1e3 / inner)
    else:
        for _ in range(repeats):
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            samples.append((time.perf_counter() - t0) / inner)
    return samples


@dataclass
class Measured:
    """What a probe has timed so far (what Ctrl-C prints)."""

    gemms: list[dict[str, Any]] = field(default_factory=list)
    """One entry per (model, tokens per micro-batch): its GEMMs with their median seconds."""
    attention: list[dict[str, Any]] = field(default_factory=list)
    """One entry per (model, micro-batch, sequence): its attention core's median seconds."""


def _batch(item: Batch | int) -> Batch:
    """A token count ``T`` reads as micro-batch 1 x sequence ``T``."""
    return (1, int(item)) if isinstance(item, int) else (int(item[0]), int(item[1]))


def probe(
    models: list[tuple[str, list[Any]]],
    dev: torch.device,
    *,
    shrink: int = 1,
    warmup: int = 5,
    repeats: int = 10,
    inner: int = 3,
    done: Measured | None = None,
) -> Measured:
    """Each model at each of its batches (``(micro_batch, seq)``, or a token count ``T`` = 1 x
    ``T``): its GEMMs once per tokens per micro-batch (batches of equal tokens flatten to the
    same GEMMs), its attention core once per batch. Fills ``done`` as it goes."""
    from parlab.models import get_spec

    dtype = torch.bfloat16
    cache: dict[tuple[Any, ...], tuple[float, list[float]]] = {}
    out = done if done is not None else Measured()
    kw = dict(warmup=warmup, repeats=repeats, inner=inner)

    def timed(key: tuple[Any, ...], make: Any) -> tuple[float, list[float]]:
        if key not in cache:
            fn = make()
            s = time_gemm(fn, dev, **kw)
            cache[key] = (statistics.median(s), s)
            del fn
        return cache[key]

    for name, items in models:
        spec = get_spec(name)
        for mb, seq in (_batch(i) for i in items):
            tokens = mb * seq
            if not any(e["model"] == name and e["tokens"] == tokens for e in out.gemms):
                gemms = gemm_list(spec, tokens, shrink)
                for g in gemms:
                    key = (g["pass"], g["m"], g["n"]) if g["pass"] == "bgrad" else (
                        g["pass"], g["m"], g["k"], g["n"], g["bias"])  # fmt: skip
                    g["time_s"], g["samples_s"] = timed(key, lambda g=g: _operands(g, dev, dtype))
                    g["flops_per_s"] = g["flops"] / g["time_s"]
                out.gemms.append({
                    "model": name, "hidden": spec.hidden, "ffn_hidden": spec.ffn_hidden,
                    "vocab_size": spec.vocab_size, "layers": spec.layers, "tp": 1,
                    "tokens": tokens, "gemms": gemms,
                })  # fmt: skip
            if any(
                a["model"] == name and (a["micro_batch"], a["seq"]) == (mb, seq)
                for a in out.attention
            ):
                continue
            a = attention_shape(spec, (mb, seq), shrink)
            key = ("attention", a["batch"], a["heads"], a["kv_heads"], a["seq"], a["head_dim"])
            t, samples = timed(key, lambda a=a: _attention_op(a, dev, dtype))
            out.attention.append({
                "model": name, "hidden": spec.hidden, "layers": spec.layers, "tp": 1, "cp": 1,
                "micro_batch": mb, "seq": seq, "tokens": tokens, "timed": a,
                "flops": a["flops"], "time_s": t, "samples_s": samples,
                "flops_per_s": a["flops"] / t,
            })  # fmt: skip
    return out


def calibration(
    measured: Measured,
    *,
    device: str,
    backend: str,
    peak_flops: float | None,
    shrink: int,
    warmup: int,
    repeats: int,
    inner: int,
) -> dict[str, Any]:
    """The ``workload.calibration`` body: each GEMM entry with its FLOP-weighted totals (one
    micro-batch: ``count`` x each GEMM, bias gradients' seconds included) and efficiency
    against ``peak_flops`` (None: unknown); each attention entry with its efficiency."""

    def eff(flops: float, secs: float) -> float | None:
        return None if not peak_flops else flops / secs / peak_flops

    models = []
    for e in measured.gemms:
        flops = sum(g["count"] * g["flops"] for g in e["gemms"])
        secs = sum(g["count"] * g["time_s"] for g in e["gemms"])
        bgrad = sum(g["count"] * g["time_s"] for g in e["gemms"] if g["pass"] == "bgrad")
        per_name: dict[str, dict[str, float]] = {}
        for g in e["gemms"]:
            d = per_name.setdefault(g["name"], {"flops": 0.0, "time_s": 0.0})
            d["flops"] += g["flops"]
            d["time_s"] += g["time_s"]
        models.append({
            **e,
            "flops": flops,
            "time_s": secs,
            "bgrad_time_s": bgrad,
            "flops_per_s": flops / secs,
            "efficiency": eff(flops, secs),
            "by_linear": {
                n: {**d, "efficiency": eff(d["flops"], d["time_s"])} for n, d in per_name.items()
            },
        })  # fmt: skip
    attention = [{**a, "efficiency": eff(a["flops"], a["time_s"])} for a in measured.attention]
    return {
        "format": FORMAT,
        "device": device,
        "backend": backend,
        "dtype": "bf16",
        "peak_flops": peak_flops,
        "shrink": shrink,
        "passes": list(PASSES),
        "timing": {"warmup": warmup, "repeats": repeats, "inner": inner,
                   "clock": "cuda-events" if backend == "cuda" else "perf_counter",
                   "queued_s": QUEUE_S if backend == "cuda" else 0.0,
                   "statistic": "median"},
        "models": models,
        "attention": attention,
    }  # fmt: skip


def document(body: dict[str, Any], *, command: str, environment: dict[str, Any]) -> Any:
    """The contract document holding ``body`` (see the module docstring)."""
    from parlab.contract import Metric
    from parlab.plan.fit.probes import probe_document

    metrics = {}
    for m in body["models"]:
        key = f"{m['model']}@{m['tokens']}"
        metrics[f"gemm_time_per_microbatch:{key}"] = Metric(value=m["time_s"], unit="s")
        if m["efficiency"] is not None:
            metrics[f"gemm_efficiency:{key}"] = Metric(value=m["efficiency"], unit="fraction")
    for a in body.get("attention", []):
        key = f"{a['model']}@{a['micro_batch']}x{a['seq']}"
        metrics[f"attention_time_per_layer:{key}"] = Metric(value=a["time_s"], unit="s")
        if a["efficiency"] is not None:
            metrics[f"attention_efficiency:{key}"] = Metric(value=a["efficiency"], unit="fraction")
    return probe_document(
        prefix="gemm-shapes",
        project="PAR-TRAINING-STATE",
        kind=KIND,
        body=body,
        gpu=body["backend"] == "cuda",
        command=command,
        environment=environment,
        layout={"world_size": 1, "mesh": {}, "strategy": "gemm-shape-probe", "tp": 1},
        metrics=metrics,
        notes=[
            "each model's layer linears and output layer at tp 1, forward + dgrad + wgrad + the "
            "bias gradient where a linear has a bias, bf16, timed in isolation (median of "
            "repeats); efficiency: FLOP-weighted over one micro-batch's GEMMs (layers x layer + "
            "output; the bias gradients' seconds count, their FLOPs do not) against the "
            "catalog's bf16 peak; attention: one layer's causal SDPA forward + backward per "
            "micro-batch x sequence, on the roofline's causal FLOPs (6 H D S per token)"
            + ("" if body["shrink"] == 1 else f"; shapes shrunk {body['shrink']}x (dry run)"),
        ],
    )


def summary(body: dict[str, Any]) -> list[str]:
    lines = []
    for m in body["models"]:
        eff = m["efficiency"]
        bgrad = m.get("bgrad_time_s", 0.0)
        lines.append(
            f"{m['model']} @ {m['tokens']} tokens: {m['flops'] / 1e12:.2f} TFLOP in "
            f"{m['time_s'] * 1e3:.2f} ms a micro-batch"
            + (f" (bias gradients {bgrad * 1e3:.2f} ms of it)" if bgrad else "")
            + f" = {m['flops_per_s'] / 1e12:.1f} TFLOP/s"
            + ("" if eff is None else f" = {eff:.3f} of peak")
        )
        for n, d in m["by_linear"].items():
            e = d["efficiency"]
            lines.append(
                f"    {n:<7} {d['flops'] / d['time_s'] / 1e12:7.1f} TFLOP/s"
                + ("" if e is None else f"  {e:.3f}")
            )
    for a in body.get("attention", []):
        t, eff = a["timed"], a["efficiency"]
        lines.append(
            f"{a['model']} attention @ {a['micro_batch']} x {a['seq']}: {t['heads']} heads "
            f"(kv {t['kv_heads']}) x {t['head_dim']}: {a['flops'] / 1e12:.3f} TFLOP a layer in "
            f"{a['time_s'] * 1e3:.3f} ms (x {a['layers']} layers: {a['time_s'] * a['layers'] * 1e3:.2f}"
            f" ms) = {a['flops_per_s'] / 1e12:.1f} TFLOP/s"
            + ("" if eff is None else f" = {eff:.3f} of peak")
        )
    return lines


def parse_batch(item: str) -> Batch:
    """``T`` (tokens: micro-batch 1 x sequence ``T``) or ``MBxSEQ`` -> (micro-batch, sequence);
    ``ValueError`` otherwise."""
    mb, sep, seq = item.strip().lower().partition("x")
    try:
        got = (int(mb), int(seq)) if sep else (1, int(item))
    except ValueError:
        raise ValueError(f"{item!r}: give tokens T or micro-batch x sequence MBxSEQ") from None
    if min(got) < 1:
        raise ValueError(f"{item!r}: micro-batch and sequence must be at least 1")
    return got


def parse_models(values: list[str], tokens: int) -> list[tuple[str, list[Batch]]]:
    """``NAME[:ITEM[,ITEM...]]`` (ITEM: ``T`` or ``MBxSEQ``) -> (name, batches); no item: 1 x
    ``tokens``."""
    out = []
    for v in values:
        name, _, items = v.partition(":")
        out.append((name, [parse_batch(i) for i in items.split(",")] if items else [(1, tokens)]))
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder (the document goes to PAR-TRAINING-STATE/)")
    ap.add_argument(
        "--model",
        action="append",
        required=True,
        help="NAME[:ITEM[,ITEM]], ITEM tokens per micro-batch T (attention at 1 x T) or "
        "micro-batch x sequence MBxSEQ; repeat per model",
    )
    ap.add_argument("--tokens", type=int, default=8192, help="default tokens per micro-batch")
    ap.add_argument("--shrink", type=int, default=1, help="divide every dimension (CPU dry run)")
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--repeats", type=int, default=10)
    ap.add_argument("--inner", type=int, default=3)
    a = ap.parse_args()  # fmt: skip
    try:
        models = parse_models(a.model, a.tokens)
    except ValueError as e:
        ap.error(str(e))
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
    done = Measured()
    kw = dict(warmup=a.warmup, repeats=a.repeats, inner=a.inner)
    peak = peak_flops(name, "bf16") if cuda else None
    t0 = time.perf_counter()
    try:
        probe(models, dev, shrink=a.shrink, done=done, **kw)
    except KeyboardInterrupt:
        body = calibration(done, device=name, backend=dev.type, peak_flops=peak,
                           shrink=a.shrink, **kw)  # fmt: skip
        print("\n".join(summary(body)))
        print("interrupted: nothing written")
        return 130
    from parlab.contract import write_result

    body = calibration(done, device=name, backend=dev.type, peak_flops=peak, shrink=a.shrink, **kw)
    print("\n".join(summary(body)))
    print(f"timed in {time.perf_counter() - t0:.1f} s")
    if cuda and peak is None:
        print(f"warning: {name} is not in the catalog: efficiency unknown (FLOP/s only)")
    doc = document(body, command=" ".join(["python3", *sys.argv]), environment=env)
    print(f"written {write_result(doc, a.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The reference engine's decode step against ``transformers`` ``generate`` (static cache) and
the memory roofline, and its offline throughput.

What it measures, for one model preset (random weights, seeded) on one device:

- **copy bandwidth**: a device-to-device copy of a 2 GiB tensor (1 MiB on the CPU), bytes
  read plus bytes written over the median of 10 copies timed with events (the ceiling the
  roofline divides by);
- **engine decode step** at each ``--batch`` B: B requests of ``--prompt-len`` random tokens
  are prefilled, then every step that decodes all B and holds no prompt chunk is timed by
  the engine itself (``Engine.log``: from planning the step to its tokens on the host -- the
  graph replay, the copies both ways, the scheduling); the median of ``--steps`` such steps
  (after two more); on a GPU also the graph alone (``GPU ms``: 20 replays right after the
  last such step, on its inputs) and one layer's decode attention kernels alone (``attn``:
  a graph of one launch over B x context tokens of the engine's cache);
- **roofline** at each B: the bytes one decode step must move -- every weight but the
  embedding table once, the B embedding rows, each sequence's K/V for every cached token
  read and its new token's written, the float32 logits written -- over the copy bandwidth;
- **transformers** at each B (``--hf``, a child process per batch so that each compiles on
  its own; their timed sections take turns under a file lock): the same weights
  (``hf_export.export_llama``) in ``LlamaForCausalLM``, ``generate(cache_implementation=
  "static", do_sample=False)`` -- which compiles its decode step on CUDA -- timed for 1 and
  for ``steps + 1`` new tokens after two warm-ups; the step is their difference over
  ``steps``;
- **offline load** (``--offline N,P,O``): N requests of P prompt tokens and O output tokens
  submitted at once, ``Engine.generate`` to the end; output tokens over wall time, and that
  time split between the steps that held prompt chunks and the decode-only steps;
- **profile** (``--profile-prefill``, with ``--offline``): the same load again, halfway
  through its prefill one step (decode rows and prompt chunks) under ``torch.profiler``:
  its kernels by device time, their sum by kind, and each matrix product's shape and rate.

Evidence: ``serving-benchmark`` on a GPU (the engine and transformers on the same device and
weights); on the CPU (``--model tiny``) a dry run of the same code, ``cpu-mechanism``.
A contract document goes to ``--results``; the table is printed last.

    PYTHONPATH=src python3 benchmarks/serve_engine_step.py                      # tiny, CPU
    PYTHONPATH=src python3 benchmarks/serve_engine_step.py --model 1.3b --dtype bfloat16 \\
        --batch 1,32,128 --prompt-len 1024 --hf --offline 128,1024,128 --results OUT
"""

from __future__ import annotations

import argparse
import fcntl
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from serve_common import SRC, header

from parlab.contract import Document, Metric, Prediction, new_run_id, now_iso, write_result
from parlab.hardware.env import snapshot
from parlab.models.reference import build_model
from parlab.serve.engine import Engine, EngineConfig, Sequence
from parlab.serve.replica import serving_spec

PROJECT = "PAR-DISTRIBUTED-INFERENCE"


def sync(dev: torch.device) -> None:
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def copy_bandwidth(dev: torch.device) -> float:
    """Bytes read + written per second of a large device-to-device copy (median of 10)."""
    n = (2 << 30) if dev.type == "cuda" else (1 << 20)
    src = torch.randn(n // 4, device=dev)
    dst = torch.empty_like(src)
    times = []
    for i in range(13):
        sync(dev)
        t0 = time.perf_counter()
        dst.copy_(src)
        sync(dev)
        if i >= 3:
            times.append(time.perf_counter() - t0)
    return 2 * n / statistics.median(times)


def roofline_s(model, batch: int, context: float, bw: float) -> float:
    """Seconds a decode step of ``batch`` sequences of ``context`` cached tokens takes at
    ``bw`` bytes/s moving only what it must (the module docstring)."""
    spec, el = model.spec, next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) - model.tok_embeddings.weight.numel()
    kv_token = spec.layers * 2 * spec.n_kv_heads * spec.d_head * el
    moved = weights * el + batch * spec.hidden * el
    moved += batch * context * kv_token + batch * kv_token + batch * spec.vocab_size * 4
    return moved / bw


def prompts(n: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(5, vocab, (n, length), generator=g).tolist()


def replay_s(graph: torch.cuda.CUDAGraph, n: int = 20) -> float:
    """Median seconds of ``n`` replays of ``graph``, each timed with events."""
    times = []
    for _ in range(n):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    return statistics.median(times)


def engine_steps(eng: Engine, batch: int, plen: int, steps: int) -> dict[str, float]:
    """``batch`` requests stepped until ``steps + 2`` steps have decoded all of them with no
    prompt chunk: the median seconds of the last ``steps`` (``step``), their mean context
    per row, the graph bucket they replayed and -- on a GPU -- the median of 20 replays of
    that graph alone right after the last, its buffers holding that full step's inputs
    (``gpu``: the device's part of a step; the rest is the host's). Then the requests are
    cancelled."""
    eng.log.clear()
    vocab = eng.tokenizer.vocab_size
    prefill_steps = -(-batch * plen // eng.config.max_step_tokens) + 1
    seqs = [
        Sequence(prompt=p, max_tokens=steps + 4 + prefill_steps, ignore_eos=True)
        for p in prompts(batch, plen, vocab, batch)
    ]
    for s in seqs:
        eng.add(s)
    full: list[dict] = []
    gpu = None
    while eng.has_work() and len(full) < steps + 2:
        n = len(eng.log)
        eng.step()
        e = eng.log[-1] if len(eng.log) > n else None
        if e is not None and e["decode"] == batch and not e["prefill"]:
            full.append(e)
    st = eng.runner.static.get(int(full[-1]["graph"]))
    if st is not None and st.graph is not None:
        gpu = replay_s(st.graph)
    for s in seqs:
        eng.cancel(s)
    while eng.has_work():
        eng.step()
    full = full[2:]
    return {
        "step": statistics.median(e["s"] for e in full),
        "context": statistics.mean(e["context"] / batch for e in full),
        "graph": int(full[-1]["graph"]),
        "gpu": gpu,
    }


def offline_split(log: list[dict], wall: float) -> dict[str, float]:
    """Where an offline run's wall time went, from ``Engine.log``: the steps that held prompt
    chunks (mixed with decode), the decode-only steps, and the rest (between steps)."""
    pre = [e["s"] for e in log if e["kind"] == 0]
    dec = [e["s"] for e in log if e["kind"] == 1]
    return {
        "prefill_steps": len(pre), "prefill_s": sum(pre), "decode_steps": len(dec),
        "decode_s": sum(dec), "other_s": wall - sum(pre) - sum(dec),
    }  # fmt: skip


def attention_kernel(eng: Engine, batch: int, context: int) -> tuple[float, float] | None:
    """Seconds of one layer's decode attention (the Triton kernels, in a CUDA graph of one
    launch: as the step runs them) over ``batch`` sequences of ``context`` tokens in the
    engine's pages, and the K/V bytes it read per second; None without Triton."""
    if eng.runner.backend != "triton":
        return None
    from parlab.serve.engine.kernels import decode_config, paged_decode

    r = eng.runner
    kc, vc = r.k_cache[0], r.v_cache[0]
    pages = -(-context // eng.config.block)
    table = torch.arange(1, 1 + batch * pages, device=kc.device).view(batch, pages)
    table = table % (kc.shape[0] - 1) + 1
    lens = torch.full((batch,), context, device=kc.device)
    q = torch.randn(batch, r.N, r.D, device=kc.device, dtype=kc.dtype)
    out = torch.empty_like(q)
    cfg = decode_config(batch, r.K, r.sms)
    paged_decode(q, kc, vc, table, lens, out, r.D**-0.5, cfg)  # compiled outside the graph
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        paged_decode(q, kc, vc, table, lens, out, r.D**-0.5, cfg)
    t = replay_s(g)
    return t, 2 * batch * context * r.K * r.D * kc.element_size() / t


def profile_prefill(eng: Engine, n: int, p: int, o: int, rows: int = 20) -> None:
    """Print one mixed step of the offline load under ``torch.profiler`` (the docstring)."""
    from torch.profiler import ProfilerActivity, profile

    seqs = [
        Sequence(prompt=q, max_tokens=o, ignore_eos=True)
        for q in prompts(n, p, eng.tokenizer.vocab_size, 5)
    ]
    for s in seqs:
        eng.add(s)
    for _ in range(max(1, n * p // eng.config.max_step_tokens // 2)):
        eng.step()
    cuda = eng.device.type == "cuda"
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    sync(eng.device)
    with profile(activities=acts, record_shapes=True) as prof:
        eng.step()
        sync(eng.device)
    e = eng.log[-1]
    for s in seqs:
        eng.cancel(s)
    while eng.has_work():
        eng.step()
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    print(f"# profile: one step of {e['decode']} decode rows and {e['prefill']} prompt tokens, "
          f"{e['s'] * 1e3:.2f} ms")  # fmt: skip
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=70))
    kinds = {  # the first match names a kernel: SDPA's kernels are CUTLASS templates too
        "sdpa": ("flash", "fmha", "attention"),
        "matmul": ("gemm", "nvjet", "cutlass", "xmma"),
        "engine triton": ("_rope_store", "_paged_decode", "_combine", "_add_rms", "_silu"),
    }
    total, by = 0.0, dict.fromkeys([*kinds, "other"], 0.0)
    for a in prof.key_averages():
        if cuda and a.device_type.name != "CUDA":
            continue
        t = getattr(a, key) / 1e3
        total += t
        kind = next((k for k, m in kinds.items() if any(x in a.key.lower() for x in m)), "other")
        by[kind] += t
    print(f"# kernels {total:.2f} ms: " + ", ".join(f"{k} {v:.2f}" for k, v in by.items()))
    for a in prof.key_averages(group_by_input_shape=True):
        if a.key in ("aten::mm", "aten::addmm") and a.input_shapes:
            (M, K), (_, N) = a.input_shapes[-2:]
            t = (a.device_time_total if cuda else a.cpu_time_total) / 1e6
            print(f"#   {a.key} {M}x{K}x{N} x{a.count}: {t * 1e3:.2f} ms, "
                  f"{2 * M * K * N * a.count / max(t, 1e-12) / 1e12:.0f} TFLOP/s")  # fmt: skip


def hf_child(args: argparse.Namespace) -> None:
    """One batch through transformers' static-cache generate (run as a child process)."""
    from transformers import AutoModelForCausalLM

    dev = torch.device(args.device)
    model = AutoModelForCausalLM.from_pretrained(args.hf_dir, dtype=getattr(torch, args.dtype))
    model = model.to(dev).eval()
    vocab = json.loads((Path(args.hf_dir) / "config.json").read_text())["vocab_size"]
    ids = torch.tensor(prompts(args.hf_batch, args.prompt_len, min(vocab, 1024), 7), device=dev)
    kw = {"do_sample": False, "cache_implementation": "static", "pad_token_id": 0}

    def gen(n: int) -> float:
        sync(dev)
        t0 = time.perf_counter()
        model.generate(ids, max_new_tokens=n, min_new_tokens=n, **kw)
        sync(dev)
        return time.perf_counter() - t0

    t_compile = time.perf_counter()
    gen(1)  # each max_new_tokens sizes its own static cache: warm both timed lengths
    gen(args.steps + 1)  # compiles the decode step (CUDA), warms it
    t_compile = time.perf_counter() - t_compile
    with open(args.hf_lock, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # the timed part alone on the device
        one = min(gen(1) for _ in range(2))
        many = min(gen(args.steps + 1) for _ in range(2))
    # a difference that is not positive is a failed measurement (a recompile in the shorter
    # call): unknown, not a negative step
    step = (many - one) / args.steps if many > one else None
    out = {"batch": args.hf_batch, "step_s": step, "warmup_s": t_compile}
    print("HF " + json.dumps(out), flush=True)


def hf_steps(args: argparse.Namespace, model) -> dict[int, dict]:
    """transformers' decode step per batch, from one child per batch run side by side."""
    from parlab.serve.hf_export import export_llama

    tmp = Path(tempfile.mkdtemp(prefix="parlab-hf-"))
    export_llama(model, tmp / "model")
    base = [sys.executable, __file__, "--model", args.model, "--dtype", args.dtype,
            "--device", args.device, "--prompt-len", str(args.prompt_len),
            "--steps", str(args.steps), "--hf-dir", str(tmp / "model"),
            "--hf-lock", str(tmp / "lock")]  # fmt: skip
    children = [
        subprocess.Popen([*base, "--hf-batch", str(b)], stdout=subprocess.PIPE, text=True)
        for b in args.batches
    ]
    out: dict[int, dict] = {}
    deadline = time.monotonic() + args.hf_timeout
    for c in children:
        try:
            text, _ = c.communicate(timeout=max(1.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            c.kill()
            text, _ = c.communicate()
        for line in text.splitlines():
            if line.startswith("HF "):
                r = json.loads(line[3:])
                out[r["batch"]] = r
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", default="1,4")
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--max-step-tokens", type=int, default=8192)
    ap.add_argument("--block", type=int, default=EngineConfig.block, help="KV page, tokens.")
    ap.add_argument("--hf", action="store_true", help="Also time transformers' generate.")
    ap.add_argument("--hf-timeout", type=float, default=300.0)
    ap.add_argument("--offline", default="", help="N,PROMPT,OUTPUT: an offline load.")
    ap.add_argument("--profile-prefill", action="store_true", help="Profile a mixed step.")
    ap.add_argument("--results", default="")
    ap.add_argument("--hf-dir", help=argparse.SUPPRESS)
    ap.add_argument("--hf-lock", help=argparse.SUPPRESS)
    ap.add_argument("--hf-batch", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.batches = [int(b) for b in args.batch.split(",")]
    if args.hf_batch:
        return hf_child(args)
    header("engine decode step vs transformers static-cache generate vs the memory roofline")
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = build_model(serving_spec(args.model), device=dev, dtype=getattr(torch, args.dtype))
    bw = copy_bandwidth(dev)
    hf = hf_steps(args, model) if args.hf else {}
    off = [int(x) for x in args.offline.split(",")] if args.offline else []
    max_len = max(args.prompt_len + args.steps + 8, off[1] + off[2] if off else 0)
    cfg = EngineConfig(
        max_batch=max([*args.batches, off[0] if off else 1]), max_len=max_len,
        max_step_tokens=args.max_step_tokens, cache_blocks=0, prefix_cache=False,
        block=args.block,
    )  # fmt: skip
    t0 = time.perf_counter()
    eng = Engine(model, cfg)
    setup = time.perf_counter() - t0
    rows, metrics, preds = [], {}, {}
    for b in args.batches:
        r = engine_steps(eng, b, args.prompt_len, args.steps)
        roof = roofline_s(model, b, r["context"], bw)
        h = hf.get(b, {}).get("step_s")
        attn = attention_kernel(eng, b, int(r["context"]))
        rows.append((b, r, h, roof, attn))
        metrics[f"decode_step_b{b}"] = Metric(value=r["step"] * 1e3, unit="ms")
        gpu = None if r["gpu"] is None else r["gpu"] * 1e3
        metrics[f"decode_step_gpu_b{b}"] = Metric(value=gpu, unit="ms")
        metrics[f"hf_static_step_b{b}"] = Metric(value=None if h is None else h * 1e3, unit="ms")
        if attn is not None:
            metrics[f"attention_layer_b{b}"] = Metric(value=attn[0] * 1e3, unit="ms")
            metrics[f"attention_bandwidth_b{b}"] = Metric(value=attn[1] / 1e9, unit="GB/s")
        preds[f"decode_step_b{b}"] = Prediction(
            value=roof * 1e3, unit="ms", model="memory-roofline"
        )
    offline = split = None
    if off:
        n, p, o = off
        eng.log.clear()
        t0 = time.perf_counter()
        eng.generate(prompts(n, p, eng.tokenizer.vocab_size, 99), o, ignore_eos=True)
        wall = time.perf_counter() - t0
        offline = n * o / wall
        metrics["offline_output_throughput"] = Metric(value=offline, unit="tokens/s")
        split = offline_split(eng.log, wall)
        for k, v in split.items():
            metrics[f"offline_{k}"] = Metric(value=v, unit="s" if k.endswith("_s") else "steps")
    metrics["copy_bandwidth"] = Metric(value=bw / 1e9, unit="GB/s")
    metrics["engine_setup"] = Metric(value=setup, unit="s")
    level = "serving-benchmark" if dev.type == "cuda" else "cpu-mechanism"
    doc = Document(
        run_id=new_run_id("serve-engine-step"), created=now_iso(), project=PROJECT, task="T4",
        role="baseline", evidence_level=level, command=" ".join(["python3", *sys.argv]),
        environment=snapshot(probe_links=False),
        workload={"model": args.model, "dtype": args.dtype, "prompt_len": args.prompt_len,
                  "steps": args.steps, "batches": args.batches, "offline": off,
                  "hf": {str(k): v for k, v in hf.items()}},
        layout={"world_size": 1, "strategy": "engine-decode-step",
                "attention": eng.runner.backend, "cuda_graphs": eng.runner.use_graphs,
                "max_step_tokens": args.max_step_tokens, "block": args.block},
        metrics=metrics, predictions=preds, status="ok",
        notes=["decode step: the engine's own time per step (Engine.log) at full batch, no "
               "prompt chunk, median; transformers: (generate(steps+1) - generate(1)) / steps, "
               "static cache, after two warm-ups; roofline: bytes a step must move over the "
               "measured copy bandwidth (read + written)"],
    )  # fmt: skip
    print(f"# {args.model} {args.dtype} on {dev}; attention {eng.runner.backend}, graphs "
          f"{eng.runner.use_graphs}; page {args.block}; copy bandwidth {bw / 1e9:.0f} GB/s; engine set-up "
          f"{setup:.1f} s ({eng.capture_s:.1f} s capturing graphs); evidence {level}")  # fmt: skip
    if args.results:
        print(f"# document: {write_result(doc, args.results)}")
    print(f"{'batch':>6} {'engine ms':>10} {'GPU ms':>8} {'HF static ms':>13} {'roofline ms':>12} "
          f"{'eng/roof':>9} {'HF/eng':>7} {'attn ms':>8} {'attn GB/s':>10} {'graph':>6}")  # fmt: skip
    for b, r, h, roof, attn in rows:
        hs = "-" if h is None else f"{h * 1e3:.3f}"
        ratio = "-" if h is None else f"{h / r['step']:.2f}"
        gpu = "-" if r["gpu"] is None else f"{r['gpu'] * 1e3:.3f}"
        am, ag = ("-", "-") if attn is None else (f"{attn[0] * 1e3:.3f}", f"{attn[1] / 1e9:.0f}")
        print(f"{b:>6} {r['step'] * 1e3:>10.3f} {gpu:>8} {hs:>13} {roof * 1e3:>12.3f} "
              f"{r['step'] / roof:>9.2f} {ratio:>7} {am:>8} {ag:>10} {r['graph']:>6}")  # fmt: skip
    if offline is not None:
        print(f"offline {off[0]} x {off[1]} + {off[2]} tokens: {offline:.0f} output tokens/s")
        print(f"  {split['prefill_steps']:.0f} steps with prompt chunks {split['prefill_s']:.3f} s, "
              f"{split['decode_steps']:.0f} decode-only steps {split['decode_s']:.3f} s, "
              f"outside steps {split['other_s']:.3f} s")  # fmt: skip
    if off and args.profile_prefill:
        profile_prefill(eng, *off)


if __name__ == "__main__":
    sys.path.insert(0, SRC)
    main()

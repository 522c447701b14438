"""Prefill and decode-step time of the reference replica's engine (``parlab.serve.engine``).

What it measures. For a model preset (random weights) the engine is built with
``max_batch`` = the largest batch asked for and room for ``--prompt-len`` prompt tokens
plus the decode steps. Prefill: one request of ``--prompt-len`` tokens on an idle engine
(prefix cache off, so every token is computed), one ``Engine.step`` each, median of
``--reps`` after one warm-up. Decode: for each batch size B, B requests of ``--prompt-len``
tokens (each a little shorter than the last, so the rows sit at different lengths, as in
serving) are admitted and prefilled, then ``--warmup`` decode steps run untimed and
``--steps`` decode steps are timed one by one (``Engine.step``: the batched forward, the
sampling and the bookkeeping; ``torch.cuda.synchronize`` before and after each on a GPU,
the wall clock around it); the median is printed.

Evidence: on the CPU (``--model tiny``) the line says ``cpu-mechanism``: the numbers show
the engine's per-row and per-layer overheads on this machine, nothing about GPU speed. On
a GPU (``--model 1.3b --dtype bfloat16``) it says ``real-gpu``.

    PYTHONPATH=src python3 benchmarks/serve_engine_step.py                       # tiny, CPU
    PYTHONPATH=src python3 benchmarks/serve_engine_step.py --model 1.3b --dtype bfloat16 \
        --batch 1,8,32 --prompt-len 1024                                         # GPU
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from pathlib import Path

SRC = str(Path(__file__).resolve().parents[1] / "src")
if SRC not in sys.path:
    sys.path.insert(0, SRC)

import torch  # noqa: E402

from parlab.models import get_spec  # noqa: E402
from parlab.models.reference import build_model  # noqa: E402
from parlab.serve.engine import Engine, EngineConfig, Sequence  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed_step(eng: Engine) -> float:
    _sync(eng.device)
    t0 = time.perf_counter()
    eng.step()
    _sync(eng.device)
    return time.perf_counter() - t0


def _prompt(n: int, salt: int) -> list[int]:
    """``n`` printable byte tokens, different for each ``salt``."""
    return [32 + (i * 7 + salt * 13) % 95 for i in range(n)]


def prefill_ms(eng: Engine, prompt_len: int, reps: int) -> float:
    """Median wall time of one request's prefill iteration (after one warm-up)."""
    times = []
    for r in range(reps + 1):
        eng.add(Sequence(prompt=_prompt(prompt_len, 1000 + r), max_tokens=1))
        t = _timed_step(eng)
        assert not eng.has_work()
        if r:
            times.append(t)
    return 1e3 * statistics.median(times)


def decode_ms(eng: Engine, batch: int, prompt_len: int, warmup: int, steps: int) -> float:
    """Median wall time of one decode iteration with ``batch`` running requests."""
    seqs = [
        Sequence(prompt=_prompt(prompt_len - i % 64, i), max_tokens=warmup + steps + 2)
        for i in range(batch)
    ]
    for s in seqs:
        eng.add(s)
    while eng.waiting or eng._inbox:  # prefill iterations until every request runs
        eng.step()
    assert len(eng.running) == batch
    for _ in range(warmup):
        eng.step()
    times = [_timed_step(eng) for _ in range(steps)]
    assert eng.log[-1]["kind"] == 1 and eng.log[-1]["batch"] == batch
    while eng.has_work():
        eng.step()
    return 1e3 * statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--dtype", default="float32", choices=sorted(DTYPES))
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--batch", default="1,8,32", help="decode batch sizes, comma-separated")
    ap.add_argument("--prompt-len", type=int, default=1024)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--reps", type=int, default=3, help="timed prefills")
    ap.add_argument(
        "--cudnn-attention",
        action="store_true",
        help="let SDPA use cuDNN attention (the engine excludes it by default on CUDA)",
    )
    ap.add_argument(
        "--cuda-graphs",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="decode as CUDA graphs (default: the engine's, on for CUDA)",
    )
    ap.add_argument(
        "--prefill-graphs",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="with CUDA graphs, prefill as CUDA graphs too (the engine's default)",
    )
    args = ap.parse_args()

    device = torch.device(args.device)
    batches = [int(b) for b in args.batch.split(",")]
    spec = get_spec(args.model)
    model = build_model(spec, device=device, dtype=DTYPES[args.dtype], seed=0)
    cfg = EngineConfig(
        max_batch=max(batches),
        max_len=args.prompt_len + args.warmup + args.steps + 8,
        prefix_cache=False,
        cudnn_attention=args.cudnn_attention,
        cuda_graphs=args.cuda_graphs,
        prefill_graphs=args.prefill_graphs,
    )
    eng = Engine(model, cfg)

    gpu = device.type == "cuda"
    name = torch.cuda.get_device_name(device) if gpu else platform.processor() or "cpu"
    print(f"# serve engine step: {spec.name} {args.dtype} on {device.type} ({name})")
    print(
        f"# python {platform.python_version()}, torch {torch.__version__}"
        + (f", CUDA {torch.version.cuda}" if gpu else "")
        + f", CPU cores {os.cpu_count()}, threads {torch.get_num_threads()}, "
        f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}"
    )
    print(
        "# evidence: "
        + (
            f"measured on {name} (the engine alone: no HTTP, no communication); "
            f"cuDNN attention {'allowed' if args.cudnn_attention else 'excluded'}; "
            f"decode {'as CUDA graphs' if eng.cuda_graphs else 'eager'}, prefill "
            f"{'as CUDA graphs' if eng._static_prefill else 'eager'} (capture "
            f"{eng.graph_capture_s:.1f} s)"
            if gpu
            else "cpu-mechanism (CPU timings show per-row/per-layer overheads, not GPU speed)"
        )
    )
    print(
        f"# prompt {args.prompt_len} tokens; decode rows at lengths {args.prompt_len}-"
        f"{max(args.prompt_len - 63, 1)}; median of {args.steps} steps after {args.warmup} "
        f"warm-up; prefill median of {args.reps}"
    )
    pre = prefill_ms(eng, args.prompt_len, args.reps)
    print(f"prefill {args.prompt_len} tokens: {pre:9.2f} ms")
    print(f"{'batch':>6} {'decode ms/step':>15} {'ms/seq':>8}")
    for b in batches:
        ms = decode_ms(eng, b, args.prompt_len, args.warmup, args.steps)
        print(f"{b:>6} {ms:>15.2f} {ms / b:>8.3f}", flush=True)


if __name__ == "__main__":
    main()

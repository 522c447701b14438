"""Serving commands: ``parlab bench serve``, ``parlab serve replica|router|sim|kv-transfer``,
``parlab project serving``."""

from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import typer

from parlab.cli import app
from parlab.cli.common import (
    PORT,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    console,
    err_console,
    print_json,
    reproduce_command,
    results_dir,
    tensor_dtype_choice,
    write,
)
from parlab.dtypes import SERVING_DTYPES, TORCH_NAMES
from parlab.errors import UsageError

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks against running servers.")
serve_app = typer.Typer(
    no_args_is_help=True, help="Serving: reference replica, router, simulator, KV transfer."
)
app.add_typer(bench_app, name="bench")
app.add_typer(serve_app, name="serve")


def _dataset(
    kind: str,
    path: Path | None,
    num_prompts: int,
    input_len: int,
    output_len: int,
    num_groups: int,
    prefix_len: int,
    question_len: int,
    seed: int,
    range_ratio: float = 0.0,
):
    from parlab.serve import datasets

    if kind == "random":
        return datasets.synthetic(
            num_prompts=num_prompts,
            input_len=input_len,
            output_len=output_len,
            seed=seed,
            range_ratio=range_ratio,
        )
    if kind == "shared-prefix":
        if num_prompts < num_groups:
            raise UsageError(f"--num-prompts {num_prompts} is below --num-groups {num_groups}")
        return datasets.shared_prefix(
            num_groups=num_groups,
            prompts_per_group=num_prompts // num_groups,
            prefix_len=prefix_len,
            question_len=question_len,
            output_len=output_len,
            seed=seed,
        )
    if kind == "jsonl":
        if path is None:
            raise UsageError("--dataset-name jsonl needs --dataset-path FILE")
        return datasets.jsonl(path, num_prompts=num_prompts)
    raise UsageError(f"--dataset-name {kind!r} is not one of random, shared-prefix, jsonl")


def _slo(items: list[str] | None):  # type: ignore[no-untyped-def]
    from parlab.serve.metrics import Slo

    try:
        return Slo.parse(items or [])
    except ValueError as exc:
        raise UsageError(f"--goodput: {exc}") from None


@bench_app.command(
    "serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}
)
def bench_serve_cmd(
    ctx: typer.Context,
    base_url: str = typer.Option("http://127.0.0.1:8000", help="Server or router URL."),
    api: str = typer.Option("completions", help="completions or chat."),
    model: str | None = typer.Option(None, help="Model name (default: the server's first)."),
    dataset: str = typer.Option(
        "random", "--dataset-name", help="random (vLLM's), shared-prefix or jsonl."
    ),
    dataset_path: Path | None = typer.Option(None, help="JSONL trace (--dataset-name jsonl)."),
    num_prompts: int = typer.Option(100, help="Requests to send (at most, for jsonl)."),
    input_len: int = typer.Option(
        128, "--random-input-len", "--input-len", help="Prompt length, tokens (random)."
    ),
    output_len: int = typer.Option(
        32, "--random-output-len", "--output-len", help="Tokens to generate per request."
    ),
    range_ratio: float = typer.Option(
        0.0, "--random-range-ratio", help="Lengths drawn within this ratio of the given ones."
    ),
    num_groups: int = typer.Option(4, help="Shared-prefix groups."),
    prefix_len: int = typer.Option(512, help="Shared-prefix length, tokens."),
    question_len: int = typer.Option(32, help="Unique part after the shared prefix, tokens."),
    request_rate: float = typer.Option(
        math.inf, help="Requests/s (inf: all at once); vLLM's schedule: the last leaves at n/rate."
    ),
    burstiness: float = typer.Option(
        1.0, help="Gamma shape of arrival gaps (1: Poisson, inf: even spacing)."
    ),
    max_concurrency: int | None = typer.Option(None, help="Most requests in flight."),
    replay_timestamps: bool = typer.Option(False, help="Send at the trace's timestamps."),
    stream: bool = typer.Option(True, help="Stream (SSE)."),
    ignore_eos: bool = typer.Option(
        True,
        help="Send ignore_eos (every request runs to its length); off for servers "
        "that reject it (transformers serve).",
    ),
    seed: int = typer.Option(0, help="Seed of dataset and arrivals."),
    percentiles: str = typer.Option("90,99", help="Percentiles to report, comma-separated."),
    goodput: list[str] | None = typer.Option(
        None, help="SLOs KEY:MS (ttft, tpot, e2el), as vLLM: --goodput ttft:500 tpot:50."
    ),
    request_timeout: float = typer.Option(60.0, help="Per-request timeout, s."),
    max_duration: float = typer.Option(600.0, help="Whole-run time limit, s."),
    allow_remote: bool = typer.Option(False, help="Allow a non-loopback target."),
    role: str = typer.Option("baseline", help="Document role: baseline or candidate."),
    save_result: Path | None = typer.Option(
        None,
        help="Also write vLLM's result JSON here (always written beside the document as "
        "RUN_ID.vllm.jsonl, one line).",
    ),
    progress: bool = typer.Option(True, help="Progress bar on stderr."),
    client: str = typer.Option("auto", help="HTTP client: auto, fast or aiohttp."),
    layout: list[str] | None = typer.Option(
        None, help="KEY=VALUE describing the server side for the document (world_size=2, tp=2)."
    ),
    note: list[str] | None = typer.Option(None, help="A note for the document."),
    results: Path | None = ResultsOption,
    as_json: bool = typer.Option(False, "--json", help="Print the summary as JSON."),
) -> None:
    """Load generator: vLLM/SGLang-defined TTFT, TPOT, ITL, E2E, throughput, goodput."""
    from parlab.contract import atomic_write_text, new_run_id
    from parlab.serve import bench
    from parlab.serve.metrics import vllm_result_json

    if role not in ("baseline", "candidate"):
        raise UsageError(f"--role {role!r}: use baseline or candidate")
    goodput = _goodput_items(goodput, ctx.args)
    try:
        pcts = tuple(float(p) for p in percentiles.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--percentiles {percentiles!r}: write numbers like 50,90,99") from None
    if not pcts or not all(0 < p <= 100 for p in pcts):
        raise UsageError(f"--percentiles {percentiles!r}: give values in (0, 100], like 50,90,99")
    cfg = bench.BenchConfig(
        base_url=base_url,
        api=api,
        model=model,
        request_rate=request_rate,
        burstiness=burstiness,
        max_concurrency=max_concurrency,
        replay_timestamps=replay_timestamps,
        stream=stream,
        ignore_eos=ignore_eos,
        seed=seed,
        request_timeout_s=request_timeout,
        max_duration_s=max_duration,
        percentiles=pcts,
        slo=_slo(goodput),
        allow_remote=allow_remote,
        progress=progress,
        client=client,
    )
    lay: dict[str, object] = {}
    for item in layout or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--layout {item!r}: write KEY=VALUE")
        lay[k] = int(v) if v.isascii() and v.isdigit() else v
    ds = _dataset(
        dataset,
        dataset_path,
        num_prompts,
        input_len,
        output_len,
        num_groups,
        prefix_len,
        question_len,
        seed,
        range_ratio,
    )
    for line, why in ds.bad_lines[:20]:
        err_console.print(f"{dataset_path}:{line}: skipped: {why}")
    if len(ds.bad_lines) > 20:
        err_console.print(f"... {len(ds.bad_lines) - 20} more bad lines")
    res = bench.run(cfg, ds)
    root = results_dir(results)
    run_id = new_run_id("serve-bench")
    # one line of JSON: what vLLM's --save-result writes; the .jsonl name keeps it out of
    # the results listing, which reads every *.json as a document
    rel = f"{run_id}.vllm.jsonl"
    extra = {
        "backend": "openai-chat" if api == "chat" else "openai",
        "model_id": res.model,
        "num_prompts": len(ds.requests),
        "request_rate": "inf" if math.isinf(request_rate) else request_rate,
        "burstiness": burstiness,
        "max_concurrency": max_concurrency,
    }
    vjson = json.dumps(vllm_result_json(res.summary, res.outcomes, extra=extra))
    atomic_write_text(root / bench.PROJECT / rel, vjson)
    if save_result is not None:
        atomic_write_text(save_result, vjson)
    doc = bench.to_document(
        res,
        cfg,
        ds,
        command=reproduce_command(),
        role=role,
        layout=lay,
        notes=list(note or []),
        artifacts={"vllm_result": rel},
        run_id=run_id,
    )
    path = write(doc, root, quiet=as_json)
    if as_json:
        print_json(res.summary)
    else:
        print_summary(res.summary, res.errors, res.dispatch_lag_ms)
        console.print(f"document: {path}")
    if res.summary["completed"] == 0:
        raise typer.Exit(1)


def _goodput_items(given: list[str] | None, extra: list[str]) -> list[str]:
    """``--goodput ttft:500 tpot:50`` (vLLM's form, several items after one flag): the
    items typer leaves over join the ones it took; any other stray argument is an error."""
    items = list(given or [])
    for a in extra:
        if not items or ":" not in a:
            raise UsageError(f"unexpected argument {a!r}: bench serve takes options only")
        items.append(a)
    return items


def print_summary(s: dict, errors: dict[str, int], lag: dict[str, float] | None = None) -> None:
    from rich.table import Table

    console.print(
        f"completed {s['completed']}, failed {s['failed']} in {s['duration']:.2f} s: "
        f"{s['request_throughput']:.1f} req/s, {s['output_throughput']:.0f} output tok/s, "
        f"{s['total_token_throughput']:.0f} total tok/s"
        + (f", goodput {s['request_goodput']:.1f} req/s" if s.get("request_goodput") else "")
        + (f", cache hit {s['cache_hit_rate']:.1%}" if s.get("cache_hit_rate") is not None else "")
    )
    none = s["completed"] == 0
    if none:
        top = next(iter(errors), "no error recorded")
        err_console.print(
            f"every request failed ({s['failed']} of {s['failed']}): {top}",
            markup=False,
        )
    t = Table(title="latency (ms)" + (": none measured" if none else ""), title_justify="left")
    t.add_column("metric")
    cols = [k.split("_")[0] for k in s if k.endswith("_ttft_ms")]
    for c in cols:
        t.add_column(c, justify="right")
    for m in ("ttft", "tpot", "itl", "e2el"):
        t.add_row(m.upper(), *("-" if none else f"{s[f'{c}_{m}_ms']:.2f}" for c in cols))
    console.print(t)
    if lag:
        console.print(
            f"send-time accuracy: lag mean {lag['mean']:.3f} ms, p99 {lag['p99']:.3f} ms, "
            f"max {lag['max']:.3f} ms"
        )
    for e, n in list(errors.items())[:10]:
        err_console.print(f"failed x{n}: {e}", markup=False)


@serve_app.command("replica")
def replica_cmd(
    model: str = typer.Option("tiny", help="Reference model (parlab.models catalog name)."),
    engine: str = typer.Option(
        "model",
        help="model (the reference model), stub (no model, timing model) or trivial "
        "(canned answers of --stub-output-len chunks).",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, click_type=PORT, help="Port (0: a free one, printed)."),
    device: str = typer.Option("cpu", help="cpu or cuda:N."),
    dtype: str = typer.Option(
        "fp32", "--tensor-dtype", click_type=tensor_dtype_choice(SERVING_DTYPES), help="Weights."
    ),
    max_batch: int = typer.Option(16, help="KV slots (requests decoding at once)."),
    max_len: int = typer.Option(2048, help="Longest prompt + output, tokens."),
    prefix_cache: bool = typer.Option(True, help="Reuse KV of cached prompt prefixes."),
    cache_blocks: int = typer.Option(4096, help="Prefix-cache capacity, 16-token blocks."),
    seed: int = typer.Option(0, help="Weight seed."),
    threads: int = typer.Option(1, help="CPU threads for torch."),
    duration: float | None = typer.Option(None, help="Stop after this many seconds."),
    stub_token_s: float = typer.Option(0.0, help="Stub: seconds between tokens."),
    stub_prefill_per_token_s: float = typer.Option(0.0, help="Stub: prefill s per token."),
    tp: int = typer.Option(1, help="Tensor-parallel ranks (one GPU each; gloo ranks on CPU)."),
    stub_output_len: int = typer.Option(2, help="Trivial: chunks per answer."),
    cuda_graphs: bool | None = typer.Option(
        None,
        "--cuda-graphs/--no-cuda-graphs",
        help="Decode steps as captured CUDA graphs, one per batch bucket (default: on for a "
        "CUDA --device with --tp 1 and no MoE; --cuda-graphs requires them).",
    ),
    max_step_tokens: int = typer.Option(
        2048, help="Tokens one step computes: decode tokens, then prompt chunks."
    ),
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    attention: str = typer.Option("auto", help="Paged attention: auto, triton or torch."),
    request_timeout: float = typer.Option(300.0, help="Per-request deadline, s."),
) -> None:
    """The reference replica (OpenAI API, continuous batching, prefix cache) or a stub."""
    from parlab.cli.common import nodes

    dtype = TORCH_NAMES[dtype]
    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    if job.multi and tp <= 1:
        raise UsageError(
            "--nnodes and the rendezvous flags are for a tensor-parallel replica: --tp"
        )
    if tp > 1:
        if cuda_graphs:
            raise UsageError("--cuda-graphs needs --tp 1: tensor-parallel replicas decode eagerly")
        from parlab.runtime.launch import LaunchConfig, launch

        if engine != "model":
            raise UsageError("--tp needs --engine model")
        res = launch(
            "parlab.serve.tp:replica_main",
            {
                "model": model,
                "dtype": dtype,
                "seed": seed,
                "host": host,
                "port": port,
                "duration_s": duration if duration is not None else 24 * 3600.0,
                "max_batch": max_batch,
                "max_len": max_len,
                "cache_blocks": cache_blocks,
                "prefix_cache": prefix_cache,
            },
            LaunchConfig(
                nproc=tp,
                nodes=job,
                backend="auto",
                timeout_s=300,
                deadline_s=(duration or 24 * 3600.0) + 300,
            ),
        )
        if not res.ok:
            assert res.failure is not None
            err_console.print(
                f"tensor-parallel replica failed: {res.failure.message}", markup=False
            )
            raise typer.Exit(1)
        print_json(res.results[0])
        return
    if engine == "trivial":
        from parlab.serve import stub

        asyncio.run(
            stub.serve_trivial(
                host=host, port=port, output_len=stub_output_len, duration_s=duration
            )
        )
        return
    if engine == "stub":
        from parlab.serve import stub

        cfg = stub.StubConfig(
            token_s=stub_token_s,
            prefill_per_token_s=stub_prefill_per_token_s,
            prefix_cache=prefix_cache,
            cache_blocks=cache_blocks,
        )
        asyncio.run(stub.serve_forever(cfg, host=host, port=port, duration_s=duration))
        return
    if engine != "model":
        raise UsageError(f"--engine {engine!r}: use model, stub or trivial")
    import torch

    from parlab.serve.engine import EngineConfig
    from parlab.serve.replica import build_engine, serve_forever

    torch.set_num_threads(max(1, threads))
    eng = build_engine(
        model,
        device=device,
        dtype=dtype,
        seed=seed,
        config=EngineConfig(
            max_batch=max_batch,
            max_len=max_len,
            prefix_cache=prefix_cache,
            cache_blocks=cache_blocks,
            cuda_graphs=cuda_graphs,
            max_step_tokens=max_step_tokens,
            attention=attention,
        ),
    )
    asyncio.run(
        serve_forever(
            eng,
            host=host,
            port=port,
            name=f"parlab-{model}",
            duration_s=duration,
            request_timeout_s=request_timeout,
        )
    )


@serve_app.command("launch")
def launch_cmd(
    engine: str = typer.Option(..., help="vllm, sglang, transformers or parlab."),
    model: str = typer.Option(..., help="What the engine serves (a Hugging Face name or folder)."),
    tp: int = typer.Option(1, help="Tensor-parallel degree (the engine's own flag)."),
    port: int = typer.Option(8000, help="Port of the engine's server."),
    host: str = typer.Option("127.0.0.1", help="Address the engine listens on."),
    pd: str = typer.Option("none", help="Prefill/decode role: none, prefill or decode."),
    dtype: str | None = typer.Option(None, help="Weights dtype (the engine's default if unset)."),
    max_len: int | None = typer.Option(
        None, help="Context length (the engine's default if unset)."
    ),
    device: str | None = typer.Option(None, help="Device (transformers, parlab: cuda:0, cpu)."),
    executable: str | None = typer.Option(None, help="The engine's program, if not the default."),
    extra: list[str] | None = typer.Option(None, help="One more argument for the engine."),
    router: str | None = typer.Option(None, help="Register with this parlab router URL."),
    ready_timeout: float = typer.Option(900.0, help="Seconds to wait for it to serve."),
    duration: float | None = typer.Option(None, help="Stop it after this many seconds."),
    log: Path | None = typer.Option(None, help="Write the engine's output here."),
) -> None:
    """Start an engine's own OpenAI server (TP and prefill/decode flags), wait until it serves,
    register it with a router; prints its record (JSON), then serves until Ctrl-C."""
    import signal
    import time

    from parlab.serve.launch import LaunchSpec, launch

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too: the engine's server must not outlive us

    signal.signal(signal.SIGTERM, stop)

    spec = LaunchSpec(
        engine=engine, model=model, tp=tp, host=host, port=port, pd=pd, dtype=dtype,
        max_len=max_len, device=device, executable=executable, extra=tuple(extra or ()),
    )  # fmt: skip
    out = open(log, "ab") if log is not None else None  # noqa: SIM115  (held while it runs)
    try:
        started = launch(spec, ready_timeout_s=ready_timeout, router=router, log=out)
        end = None if duration is None else time.monotonic() + duration
        try:
            print(json.dumps(started.record), flush=True)
            while started.proc.poll() is None and (end is None or time.monotonic() < end):
                time.sleep(0.5)
        except KeyboardInterrupt:
            pass
        finally:
            started.stop()
        if started.proc.returncode not in (0, -15, None) and end is None:
            raise typer.Exit(1)
    except (RuntimeError, TimeoutError) as exc:
        err_console.print(f"launch failed: {exc}")
        raise typer.Exit(1) from None
    finally:
        if out is not None:
            out.close()


@serve_app.command("router")
def router_cmd(
    replica: list[str] | None = typer.Option(
        None,
        help="Replica base URL (repeat for each; more can join: parlab serve launch --router).",
    ),
    policy: str = typer.Option(
        "cache_aware",
        help="round_robin, random, least_outstanding, power_of_two or cache_aware.",
    ),
    host: str = typer.Option("127.0.0.1", help="Address to listen on (loopback by default)."),
    port: int = typer.Option(8000, click_type=PORT, help="Port (0: a free one, printed)."),
    cache_threshold: float = typer.Option(0.5, help="cache_aware: matched fraction to follow."),
    balance_abs: int = typer.Option(32, help="cache_aware: load gap counted as uneven."),
    balance_rel: float = typer.Option(1.0001, help="cache_aware: load ratio counted as uneven."),
    health_interval: float = typer.Option(0.5, help="Seconds between health checks."),
    health_failures: int = typer.Option(2, help="Missed checks in a row that take a replica out."),
    health_timeout: float = typer.Option(1.0, help="A health check slower than this is a miss."),
    request_timeout: float = typer.Option(300.0, help="Per-request deadline, s."),
    allow_remote: bool = typer.Option(False, help="Allow non-loopback replicas."),
    duration: float | None = typer.Option(None, help="Stop after this many seconds."),
    seed: int = typer.Option(0, help="Seed of random policies."),
) -> None:
    """HTTP router in front of replicas; prints its stats (JSON) when it stops."""
    from parlab.serve.policy import PolicyConfig
    from parlab.serve.router import Router, RouterConfig

    cfg = RouterConfig(
        replicas=tuple(replica or ()),
        policy=PolicyConfig(
            name=policy,
            seed=seed,
            cache_threshold=cache_threshold,
            balance_abs=balance_abs,
            balance_rel=balance_rel,
        ),
        health_interval_s=health_interval,
        health_failures=health_failures,
        health_timeout_s=health_timeout,
        request_timeout_s=request_timeout,
        allow_remote=allow_remote,
    )

    async def main() -> None:
        r = Router(cfg)
        bound = await r.start(host, port)
        print(f"parlab router listening on http://{host}:{bound}", flush=True)
        try:
            if duration is None:
                await asyncio.Event().wait()
            else:
                await asyncio.sleep(duration)
        finally:
            print_json(r.stats())
            await r.stop()

    asyncio.run(main())


@serve_app.command("kv-transfer")
def kv_transfer_cmd(
    model: str = typer.Option("tiny", help="Model whose KV layout is sent."),
    tokens: str = typer.Option("16,64,256,1024", help="Request lengths, tokens."),
    dtype: str = typer.Option(
        "bf16", "--tensor-dtype", click_type=tensor_dtype_choice(SERVING_DTYPES), help="KV dtype."
    ),
    iters: int = typer.Option(10, help="Timed transfers per size."),
    timeout: float = typer.Option(120.0, help="Process-group timeout, s."),
    results: Path | None = ResultsOption,
) -> None:
    """KV-cache transfer (NCCL send/recv on GPUs, gloo on CPU) against request length."""
    from parlab.projects.serving.rank import measure_kv
    from parlab.units import parse_count

    toks = [parse_count(t, "--tokens") for t in tokens.split(",") if t.strip()]
    if not toks or min(toks) < 1:
        raise UsageError(f"--tokens {tokens!r}: give positive lengths like 16,256,4096")
    doc = measure_kv(
        model=model,
        tokens=toks,
        dtype=TORCH_NAMES[dtype],
        iters=iters,
        timeout_s=timeout,
        command=reproduce_command(),
    )
    path = write(doc, results_dir(results))
    for r in doc.workload["rows"]:
        console.print(
            f"{r['tokens']:>7} tokens {r['bytes'] / 2**20:10.3f} MiB  {r['time_s'] * 1e3:9.3f} ms"
            f"  {r['bytes'] / r['time_s'] / 1e9:8.2f} GB/s  wrong {r['wrong']}"
        )
    console.print(f"document: {path}")
    if doc.status != "ok":
        raise typer.Exit(1)


@serve_app.command("sim")
def sim_cmd(
    replicas: int = typer.Option(8, help="Replicas (colocated)."),
    requests: int = typer.Option(100_000, help="Requests."),
    rate: float = typer.Option(400.0, help="Requests/s (Poisson)."),
    groups: int = typer.Option(64, help="Shared-prefix groups."),
    prefix_len: int = typer.Option(1024, help="Shared prefix, tokens."),
    question_len: int = typer.Option(64, help="Unique part, tokens."),
    output_len: int = typer.Option(128, help="Output tokens."),
    policy: str = typer.Option("cache_aware", help="Routing policy."),
    profile: Path | None = typer.Option(None, help="Replica profile JSON (Engine.profile)."),
    max_batch: int = typer.Option(64, help="KV slots per replica."),
    block: int = typer.Option(64, help="Prefix block, tokens."),
    cache_blocks: int = typer.Option(4096, help="Prefix cache per replica, blocks."),
    prefill_replicas: int = typer.Option(0, help="Disaggregated: prefill replicas (0: colocated)."),
    kv_bytes_per_token: int = typer.Option(196608, help="Disaggregated: KV bytes per token."),
    kv_bandwidth: float = typer.Option(3e11, help="Disaggregated: transfer bytes/s."),
    kv_base: float = typer.Option(5e-5, help="Disaggregated: transfer latency, s."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Discrete-event simulation of replicas, routing and arrivals (analytic; nothing written)."""
    import time

    from parlab.serve import sim
    from parlab.serve.policy import PolicyConfig

    if profile is not None:
        data = json.loads(Path(profile).read_text())
        prof = sim.ReplicaProfile.from_json(
            data, max_batch=max_batch, block=block, cache_blocks=cache_blocks
        )
    else:
        prof = sim.ReplicaProfile(
            prefill_base_s=2e-3,
            prefill_per_token_s=2e-5,
            decode_base_s=8e-3,
            decode_per_seq_s=2e-4,
            max_batch=max_batch,
            block=block,
            cache_blocks=cache_blocks,
        )
        err_console.print("no --profile: using illustrative iteration times (not measured)")
    w = sim.shared_prefix_arrays(
        n=requests,
        groups=groups,
        prefix_len=prefix_len,
        question_len=question_len,
        output_len=output_len,
        rate=rate,
    )
    dis = None
    if prefill_replicas:
        dis = sim.Disaggregation(
            prefill_replicas=prefill_replicas,
            decode_replicas=replicas - prefill_replicas,
            kv_bytes_per_token=kv_bytes_per_token,
            kv_bandwidth=kv_bandwidth,
            kv_base_s=kv_base,
        )
    t0 = time.perf_counter()
    res = sim.simulate(
        w, replicas=replicas, profile=prof, policy=PolicyConfig(name=policy), disagg=dis
    )
    res["wall_s"] = time.perf_counter() - t0
    res.pop("per_replica_served")
    if as_json:
        print_json(res)
        return
    for k, v in res.items():
        console.print(f"{k:>22}: {v:.4g}" if isinstance(v, float) else f"{k:>22}: {v}")


def _serving_project(
    results: Path | None,
    preset: str,
    policies: str,
    num_prompts: int | None,
    request_rate: float | None,
    kv_transfer: bool,
    replicas: str | None,
    devices: str | None = None,
) -> None:
    from dataclasses import replace

    from parlab.projects.serving import get_preset, run_project

    urls = [u.strip().rstrip("/") for u in (replicas or "").split(",") if u.strip()]
    p = get_preset(preset)
    if devices:
        try:
            p = replace(p, devices=tuple(d.strip() for d in devices.split(",") if d.strip()))
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    rc = run_project(
        results_dir(results),
        preset=p,
        policies=[p for p in policies.split(",") if p],
        num_prompts=num_prompts,
        request_rate=request_rate,
        kv_transfer=kv_transfer,
        replicas=urls,
        console=console,
        command=reproduce_command(),
    )
    if rc:
        raise typer.Exit(1)


_PRESET = typer.Option("cpu", help="cpu (tiny model) or gpu (1.3B, one replica per GPU).")
_POLICIES = typer.Option(
    "round_robin,random,least_outstanding,power_of_two,cache_aware",
    help="Policies to compare, comma-separated.",
)
_NUM = typer.Option(None, help="Override requests per policy.")
_RATE = typer.Option(None, help="Override requests/s.")
_KV = typer.Option(True, help="Also measure the KV transfer (2 ranks).")
_DEVICES = typer.Option(
    None, help="One reference replica per device, e.g. cuda:0,cuda:0 (default: the preset's)."
)
_REPLICAS = typer.Option(
    None,
    help="Running OpenAI-compatible replicas URL,URL,... (vLLM, SGLang, transformers, parlab) "
    "to compare the policies on, instead of starting parlab's.",
)


@serve_app.command("project")
def serve_project_cmd(
    results: Path | None = ResultsOption,
    preset: str = _PRESET,
    policies: str = _POLICIES,
    num_prompts: int | None = _NUM,
    request_rate: float | None = _RATE,
    kv_transfer: bool = _KV,
    replicas: str | None = _REPLICAS,
    devices: str | None = _DEVICES,
) -> None:
    """The serving project (same as ``parlab project serving``)."""
    _serving_project(
        results, preset, policies, num_prompts, request_rate, kv_transfer, replicas, devices
    )


def register_project_command() -> None:
    """Add ``serving`` to the ``parlab project`` sub-app, when that sub-app exists."""
    try:
        from parlab.cli.project import project_app  # type: ignore[attr-defined]
    except ImportError:
        return

    @project_app.command("serving")
    def serving_cmd(
        results: Path | None = ResultsOption,
        preset: str = _PRESET,
        policies: str = _POLICIES,
        num_prompts: int | None = _NUM,
        request_rate: float | None = _RATE,
        kv_transfer: bool = _KV,
        replicas: str | None = _REPLICAS,
        devices: str | None = _DEVICES,
    ) -> None:
        """Replicas + router + load per policy, simulator check, KV transfer; a report."""
        _serving_project(
            results, preset, policies, num_prompts, request_rate, kv_transfer, replicas, devices
        )


register_project_command()

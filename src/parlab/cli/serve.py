"""``parlab serve replica|launch|router``: the reference replica (or a stub), an engine's
own server, and the router in front of them."""

from __future__ import annotations

import asyncio
import json
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from parlab.cli import app
from parlab.cli.common import (
    PORT,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    err_console,
    nodes,
    print_json,
    tensor_dtype_choice,
)
from parlab.dtypes import SERVING_DTYPES, TORCH_NAMES
from parlab.errors import UsageError
from parlab.runtime.launch import LaunchConfig, Nodes, launch

if TYPE_CHECKING:
    from parlab.serve.engine import EngineConfig  # torch: only when a replica starts

serve_app = typer.Typer(
    no_args_is_help=True, help="Serving: reference replica, router, simulator, KV transfer."
)
app.add_typer(serve_app, name="serve")


Host = Annotated[str, typer.Option(help="Address to listen on (loopback by default).")]
Port = Annotated[int, typer.Option(click_type=PORT, help="Port (0: a free one, printed).")]
Duration = Annotated[float | None, typer.Option(help="Stop after this many seconds.")]
RequestTimeout = Annotated[float, typer.Option(help="Per-request deadline, s.")]
ReplicaModel = Annotated[str, typer.Option(help="Reference model (parlab.models catalog name).")]
ReplicaEngine = Annotated[
    str,
    typer.Option(
        help="model (the reference model), stub (no model, timing model) or trivial "
        "(canned answers of --stub-output-len chunks).",
    ),
]
Device = Annotated[str, typer.Option(help="cpu or cuda:N.")]
WeightsDtype = Annotated[
    str,
    typer.Option("--tensor-dtype", click_type=tensor_dtype_choice(SERVING_DTYPES), help="Weights."),
]
MaxBatch = Annotated[int, typer.Option(help="KV slots (requests decoding at once).")]
MaxLen = Annotated[int, typer.Option(help="Longest prompt + output, tokens.")]
PrefixCache = Annotated[bool, typer.Option(help="Reuse KV of cached prompt prefixes.")]
CacheBlocks = Annotated[int, typer.Option(help="Prefix-cache capacity, 16-token blocks.")]
WeightSeed = Annotated[int, typer.Option(help="Weight seed.")]
Threads = Annotated[int, typer.Option(help="CPU threads for torch.")]
StubTokenS = Annotated[float, typer.Option(help="Stub: seconds between tokens.")]
StubPrefillS = Annotated[float, typer.Option(help="Stub: prefill s per token.")]
ReplicaTp = Annotated[
    int, typer.Option(help="Tensor-parallel ranks (one GPU each; gloo ranks on CPU).")
]
StubOutputLen = Annotated[int, typer.Option(help="Trivial: chunks per answer.")]
CudaGraphs = Annotated[
    bool | None,
    typer.Option(
        "--cuda-graphs/--no-cuda-graphs",
        help="Decode steps as captured CUDA graphs, one per batch bucket (default: on for a "
        "CUDA --device with --tp 1 and no MoE; --cuda-graphs requires them).",
    ),
]
MaxStepTokens = Annotated[
    int, typer.Option(help="Tokens one step computes: decode tokens, then prompt chunks.")
]
Attention = Annotated[str, typer.Option(help="Paged attention: auto, triton or torch.")]


@serve_app.command("replica")
def replica_cmd(
    model: ReplicaModel = "tiny",
    engine: ReplicaEngine = "model",
    host: Host = "127.0.0.1",
    port: Port = 8000,
    device: Device = "cpu",
    dtype: WeightsDtype = "fp32",
    max_batch: MaxBatch = 16,
    max_len: MaxLen = 2048,
    prefix_cache: PrefixCache = True,
    cache_blocks: CacheBlocks = 4096,
    seed: WeightSeed = 0,
    threads: Threads = 1,
    duration: Duration = None,
    stub_token_s: StubTokenS = 0.0,
    stub_prefill_per_token_s: StubPrefillS = 0.0,
    tp: ReplicaTp = 1,
    stub_output_len: StubOutputLen = 2,
    cuda_graphs: CudaGraphs = None,
    max_step_tokens: MaxStepTokens = 2048,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    attention: Attention = "auto",
    request_timeout: RequestTimeout = 300.0,
) -> None:
    """The reference replica (OpenAI API, continuous batching, prefix cache) or a stub."""
    dtype = TORCH_NAMES[dtype]
    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    if job.multi and tp <= 1:
        raise UsageError(
            "--nnodes and the rendezvous flags are for a tensor-parallel replica: --tp"
        )
    if tp > 1:
        if cuda_graphs:
            raise UsageError("--cuda-graphs needs --tp 1: tensor-parallel replicas decode eagerly")
        if engine != "model":
            raise UsageError("--tp needs --engine model")
        args = {
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
        }
        _tp_replica(args, tp, job, duration)
        return
    if engine in ("trivial", "stub"):
        _stub_replica(
            engine, host=host, port=port, duration=duration, output_len=stub_output_len,
            token_s=stub_token_s, prefill_per_token_s=stub_prefill_per_token_s,
            prefix_cache=prefix_cache, cache_blocks=cache_blocks,
        )  # fmt: skip
        return
    if engine != "model":
        raise UsageError(f"--engine {engine!r}: use model, stub or trivial")
    from parlab.serve.engine import EngineConfig  # lazy: torch

    config = EngineConfig(
        max_batch=max_batch,
        max_len=max_len,
        prefix_cache=prefix_cache,
        cache_blocks=cache_blocks,
        cuda_graphs=cuda_graphs,
        max_step_tokens=max_step_tokens,
        attention=attention,
    )
    _model_replica(
        model, device=device, dtype=dtype, seed=seed, config=config, threads=threads,
        host=host, port=port, duration=duration, request_timeout=request_timeout,
    )  # fmt: skip


def _stub_replica(
    engine: str,
    *,
    host: str,
    port: int,
    duration: float | None,
    output_len: int,
    token_s: float,
    prefill_per_token_s: float,
    prefix_cache: bool,
    cache_blocks: int,
) -> None:
    """A model-free endpoint (``parlab.serve.stub``): ``trivial``'s canned answers of
    ``output_len`` chunks, or ``stub``'s timing model."""
    from parlab.serve import stub  # lazy: aiohttp

    if engine == "trivial":
        asyncio.run(
            stub.serve_trivial(host=host, port=port, output_len=output_len, duration_s=duration)
        )
        return
    cfg = stub.StubConfig(
        token_s=token_s,
        prefill_per_token_s=prefill_per_token_s,
        prefix_cache=prefix_cache,
        cache_blocks=cache_blocks,
    )
    asyncio.run(stub.serve_forever(cfg, host=host, port=port, duration_s=duration))


def _tp_replica(args: dict[str, object], tp: int, job: Nodes, duration: float | None) -> None:
    """A tensor-parallel replica: ``tp`` ranks of ``parlab.serve.tp``; prints rank 0's result."""
    res = launch(
        "parlab.serve.tp:replica_main",
        args,
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
        err_console.print(f"tensor-parallel replica failed: {res.failure.message}", markup=False)
        raise typer.Exit(1)
    print_json(res.results[0])


def _model_replica(
    model: str,
    *,
    device: str,
    dtype: str,
    seed: int,
    config: EngineConfig,
    threads: int,
    host: str,
    port: int,
    duration: float | None,
    request_timeout: float,
) -> None:
    """The reference replica over ``model``'s engine, served until Ctrl-C or ``duration``."""
    import torch  # lazy: torch

    from parlab.serve.replica import build_engine, serve_forever  # lazy: torch

    torch.set_num_threads(max(1, threads))
    eng = build_engine(model, device=device, dtype=dtype, seed=seed, config=config)
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
    from parlab.serve.launch import LaunchSpec  # lazy: aiohttp
    from parlab.serve.launch import launch as launch_engine  # lazy: aiohttp

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt  # SIGTERM too: the engine's server must not outlive us

    signal.signal(signal.SIGTERM, stop)

    spec = LaunchSpec(
        engine=engine, model=model, tp=tp, host=host, port=port, pd=pd, dtype=dtype,
        max_len=max_len, device=device, executable=executable, extra=tuple(extra or ()),
    )  # fmt: skip
    out = open(log, "ab") if log is not None else None  # noqa: SIM115  (held while it runs)
    try:
        started = launch_engine(spec, ready_timeout_s=ready_timeout, router=router, log=out)
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
    host: Host = "127.0.0.1",
    port: Port = 8000,
    cache_threshold: float = typer.Option(0.5, help="cache_aware: matched fraction to follow."),
    balance_abs: int = typer.Option(32, help="cache_aware: load gap counted as uneven."),
    balance_rel: float = typer.Option(1.0001, help="cache_aware: load ratio counted as uneven."),
    health_interval: float = typer.Option(0.5, help="Seconds between health checks."),
    health_failures: int = typer.Option(2, help="Missed checks in a row that take a replica out."),
    health_timeout: float = typer.Option(1.0, help="A health check slower than this is a miss."),
    request_timeout: RequestTimeout = 300.0,
    allow_remote: bool = typer.Option(False, help="Allow non-loopback replicas."),
    duration: Duration = None,
    seed: int = typer.Option(0, help="Seed of random policies."),
) -> None:
    """HTTP router in front of replicas; prints its stats (JSON) when it stops."""
    from parlab.serve.policy import PolicyConfig  # lazy: parlab.serve.policy
    from parlab.serve.protocol import serve_until  # lazy: aiohttp
    from parlab.serve.router import Router, RouterConfig  # lazy: numpy

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
        try:
            await serve_until(r, host, port, duration, what="router")
        finally:
            print_json(r.stats())

    asyncio.run(main())

"""``parlab serve kv-transfer|sim|project`` and ``parlab project serving``: the serving
project and the parts of it that run without a server (the KV transfer, the simulator)."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from pathlib import Path

import typer

from parlab.cli.common import (
    JsonPrint,
    ResultsOption,
    console,
    err_console,
    print_json,
    reproduce_command,
    results_dir,
    tensor_dtype_choice,
    write,
)
from parlab.cli.project import project_app
from parlab.cli.serve import serve_app
from parlab.dtypes import SERVING_DTYPES, TORCH_NAMES
from parlab.errors import UsageError
from parlab.units import parse_count


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
    from parlab.projects.serving.rank import measure_kv  # lazy: numpy

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
    as_json: JsonPrint = False,
) -> None:
    """Discrete-event simulation of replicas, routing and arrivals (analytic; nothing written)."""
    from parlab.serve import sim  # lazy: numpy
    from parlab.serve.policy import PolicyConfig  # lazy: parlab.serve.policy

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
    from parlab.projects.serving import get_preset, run_project  # lazy: numpy

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


project_app.command(
    "serving", help="Replicas + router + load per policy, simulator check, KV transfer; a report."
)(serve_project_cmd)

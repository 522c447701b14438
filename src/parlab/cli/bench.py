"""``parlab bench serve``: the load generator against a running server or router, its
``serving-benchmark`` document and vLLM's result JSON beside it."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import (
    ResultsOption,
    console,
    err_console,
    print_json,
    reproduce_command,
    results_dir,
    write,
)
from parlab.contract import atomic_write_text, new_run_id
from parlab.errors import UsageError

if TYPE_CHECKING:
    from parlab.serve import bench, datasets

bench_app = typer.Typer(no_args_is_help=True, help="Benchmarks against running servers.")
app.add_typer(bench_app, name="bench")


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
    from parlab.serve import datasets  # lazy: parlab.serve.datasets

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
        ds = datasets.jsonl(path, num_prompts=num_prompts)
        for line, why in ds.bad_lines[:20]:
            err_console.print(f"{path}:{line}: skipped: {why}")
        if len(ds.bad_lines) > 20:
            err_console.print(f"... {len(ds.bad_lines) - 20} more bad lines")
        return ds
    raise UsageError(f"--dataset-name {kind!r} is not one of random, shared-prefix, jsonl")


def _slo(items: list[str] | None):  # type: ignore[no-untyped-def]
    from parlab.serve.metrics import Slo  # lazy: numpy

    try:
        return Slo.parse(items or [])
    except ValueError as exc:
        raise UsageError(f"--goodput: {exc}") from None


BaseUrl = Annotated[str, typer.Option(help="Server or router URL.")]
Api = Annotated[str, typer.Option(help="completions or chat.")]
Model = Annotated[str | None, typer.Option(help="Model name (default: the server's first).")]
DatasetName = Annotated[
    str, typer.Option("--dataset-name", help="random (vLLM's), shared-prefix or jsonl.")
]
DatasetPath = Annotated[Path | None, typer.Option(help="JSONL trace (--dataset-name jsonl).")]
NumPrompts = Annotated[int, typer.Option(help="Requests to send (at most, for jsonl).")]
InputLen = Annotated[
    int,
    typer.Option("--random-input-len", "--input-len", help="Prompt length, tokens (random)."),
]
OutputLen = Annotated[
    int,
    typer.Option("--random-output-len", "--output-len", help="Tokens to generate per request."),
]
RangeRatio = Annotated[
    float,
    typer.Option("--random-range-ratio", help="Lengths drawn within this ratio of the given ones."),
]
NumGroups = Annotated[int, typer.Option(help="Shared-prefix groups.")]
PrefixLen = Annotated[int, typer.Option(help="Shared-prefix length, tokens.")]
QuestionLen = Annotated[int, typer.Option(help="Unique part after the shared prefix, tokens.")]
RequestRate = Annotated[
    float,
    typer.Option(help="Requests/s (inf: all at once); vLLM's schedule: the last leaves at n/rate."),
]
Burstiness = Annotated[
    float, typer.Option(help="Gamma shape of arrival gaps (1: Poisson, inf: even spacing).")
]
MaxConcurrency = Annotated[int | None, typer.Option(help="Most requests in flight.")]
ReplayTimestamps = Annotated[bool, typer.Option(help="Send at the trace's timestamps.")]
Stream = Annotated[bool, typer.Option(help="Stream (SSE).")]
IgnoreEos = Annotated[
    bool,
    typer.Option(
        help="Send ignore_eos (every request runs to its length); off for servers "
        "that reject it (transformers serve).",
    ),
]
Seed = Annotated[int, typer.Option(help="Seed of dataset and arrivals.")]
Percentiles = Annotated[str, typer.Option(help="Percentiles to report, comma-separated.")]
Goodput = Annotated[
    list[str] | None,
    typer.Option(help="SLOs KEY:MS (ttft, tpot, e2el), as vLLM: --goodput ttft:500 tpot:50."),
]
RequestTimeout = Annotated[float, typer.Option(help="Per-request timeout, s.")]
MaxDuration = Annotated[float, typer.Option(help="Whole-run time limit, s.")]
AllowRemote = Annotated[bool, typer.Option(help="Allow a non-loopback target.")]
Role = Annotated[str, typer.Option(help="Document role: baseline or candidate.")]
SaveResult = Annotated[
    Path | None,
    typer.Option(
        help="Also write vLLM's result JSON here (always written beside the document as "
        "RUN_ID.vllm.jsonl, one line).",
    ),
]
Progress = Annotated[bool, typer.Option(help="Progress bar on stderr.")]
Client = Annotated[str, typer.Option(help="HTTP client: auto, fast or aiohttp.")]
Layout = Annotated[
    list[str] | None,
    typer.Option(
        help="KEY=VALUE describing the server side for the document (world_size=2, tp=2)."
    ),
]
Note = Annotated[list[str] | None, typer.Option(help="A note for the document.")]
JsonSummary = Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")]


@bench_app.command(
    "serve", context_settings={"allow_extra_args": True, "ignore_unknown_options": False}
)
def bench_serve_cmd(
    ctx: typer.Context,
    base_url: BaseUrl = "http://127.0.0.1:8000",
    api: Api = "completions",
    model: Model = None,
    dataset: DatasetName = "random",
    dataset_path: DatasetPath = None,
    num_prompts: NumPrompts = 100,
    input_len: InputLen = 128,
    output_len: OutputLen = 32,
    range_ratio: RangeRatio = 0.0,
    num_groups: NumGroups = 4,
    prefix_len: PrefixLen = 512,
    question_len: QuestionLen = 32,
    request_rate: RequestRate = math.inf,
    burstiness: Burstiness = 1.0,
    max_concurrency: MaxConcurrency = None,
    replay_timestamps: ReplayTimestamps = False,
    stream: Stream = True,
    ignore_eos: IgnoreEos = True,
    seed: Seed = 0,
    percentiles: Percentiles = "90,99",
    goodput: Goodput = None,
    request_timeout: RequestTimeout = 60.0,
    max_duration: MaxDuration = 600.0,
    allow_remote: AllowRemote = False,
    role: Role = "baseline",
    save_result: SaveResult = None,
    progress: Progress = True,
    client: Client = "auto",
    layout: Layout = None,
    note: Note = None,
    results: Path | None = ResultsOption,
    as_json: JsonSummary = False,
) -> None:
    """Load generator: vLLM/SGLang-defined TTFT, TPOT, ITL, E2E, throughput, goodput."""
    from parlab.serve import bench  # lazy: numpy

    if role not in ("baseline", "candidate"):
        raise UsageError(f"--role {role!r}: use baseline or candidate")
    goodput = _goodput_items(goodput, ctx.args)
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
        percentiles=_percentiles(percentiles),
        slo=_slo(goodput),
        allow_remote=allow_remote,
        progress=progress,
        client=client,
    )
    lay = _layout(layout)
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
    res = bench.run(cfg, ds)
    _record(res, cfg, ds, results_dir(results), role=role, layout=lay, notes=list(note or []),
            save_result=save_result, as_json=as_json)  # fmt: skip
    if res.summary["completed"] == 0:
        raise typer.Exit(1)


def _record(
    res: bench.BenchResult,
    cfg: bench.BenchConfig,
    ds: datasets.Dataset,
    root: Path,
    *,
    role: str,
    layout: dict[str, object],
    notes: list[str],
    save_result: Path | None,
    as_json: bool,
) -> None:
    """Write the run's document and vLLM's result JSON beside it; print the summary."""
    from parlab.serve import bench  # lazy: numpy

    run_id = new_run_id("serve-bench")
    rel = _save_vllm_result(res, cfg, len(ds.requests), root / bench.PROJECT, run_id, save_result)
    doc = bench.to_document(
        res,
        cfg,
        ds,
        command=reproduce_command(),
        role=role,
        layout=layout,
        notes=notes,
        artifacts={"vllm_result": rel},
        run_id=run_id,
    )
    path = write(doc, root, quiet=as_json)
    if as_json:
        print_json(res.summary)
    else:
        print_summary(res.summary, res.errors, res.dispatch_lag_ms)
        console.print(f"document: {path}")


def _percentiles(text: str) -> tuple[float, ...]:
    try:
        pcts = tuple(float(p) for p in text.split(",") if p.strip())
    except ValueError:
        raise UsageError(f"--percentiles {text!r}: write numbers like 50,90,99") from None
    if not pcts or not all(0 < p <= 100 for p in pcts):
        raise UsageError(f"--percentiles {text!r}: give values in (0, 100], like 50,90,99")
    return pcts


def _layout(items: list[str] | None) -> dict[str, object]:
    lay: dict[str, object] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise UsageError(f"--layout {item!r}: write KEY=VALUE")
        lay[k] = int(v) if v.isascii() and v.isdigit() else v
    return lay


def _save_vllm_result(
    res: bench.BenchResult,
    cfg: bench.BenchConfig,
    num_prompts: int,
    folder: Path,
    run_id: str,
    save_result: Path | None,
) -> str:
    """Write vLLM's result JSON as ``RUN_ID.vllm.jsonl`` in ``folder`` (and to
    ``save_result``); its name, relative to ``folder``."""
    from parlab.serve.metrics import vllm_result_json  # lazy: numpy

    # one line of JSON: what vLLM's --save-result writes; the .jsonl name keeps it out of
    # the results listing, which reads every *.json as a document
    rel = f"{run_id}.vllm.jsonl"
    extra = {
        "backend": "openai-chat" if cfg.api == "chat" else "openai",
        "model_id": res.model,
        "num_prompts": num_prompts,
        "request_rate": "inf" if math.isinf(cfg.request_rate) else cfg.request_rate,
        "burstiness": cfg.burstiness,
        "max_concurrency": cfg.max_concurrency,
    }
    vjson = json.dumps(vllm_result_json(res.summary, res.outcomes, extra=extra))
    atomic_write_text(folder / rel, vjson)
    if save_result is not None:
        atomic_write_text(save_result, vjson)
    return rel


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

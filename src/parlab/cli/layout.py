"""``parlab layout`` (analytic, instant) and ``parlab project model-internal``."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    RANKS,
    SECONDS,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    console,
    err_console,
    nodes,
    print_json,
    results_dir,
)
from parlab.cli.project import project_app
from parlab.layout import LayoutError, describe, model_shape
from parlab.runtime.launch import on_nodes


def print_constraints(
    rows: list[dict[str, Any]], *, only_failing: bool = False, to: Any = None
) -> None:
    t = Table(title="constraint table", title_justify="left")
    for c in ("rule", "valid", "detail"):
        t.add_column(c, overflow="fold")
    for r in rows:
        if only_failing and r["ok"]:
            continue
        t.add_row(r["name"], "yes" if r["ok"] else "[red]NO[/red]", r["detail"])
    (to or console).print(t)


def _span(pair: list[int]) -> str:
    return f"{pair[0]}" if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"


def print_layout(d: dict[str, Any]) -> None:
    """The layout tables a person reads: mesh, ranks, groups, holdings, constraints."""
    mesh = d["mesh"]
    m = d["model"]
    console.print(
        f"model {m['name']}: {m['layers']} layers, {m['heads']} heads ({m['kv_heads']} KV), "
        f"hidden {m['hidden']}, FFN {m['ffn']}, vocab {m['vocab']}"
        + (f"; seq {d['seq']}" if d["seq"] else "")
        + ("; sequence parallel" if d["sequence_parallel"] else "")
    )
    console.print(
        f"mesh (world {d['world_size']}): "
        + " x ".join(f"{a} {mesh[a]}" for a in d["axis_order"])
        + f"  (ep {mesh['ep']} splits dp)"
    )
    if mesh["pp"] > 1:
        console.print(f"stage split: {d['stage_split']}; the embedding on stage 0, the head on "
                      f"stage {mesh['pp'] - 1}")  # fmt: skip
    console.print(d["why_order"])
    if d["ranks_shown"] < d["world_size"]:
        console.print(f"(the first {d['ranks_shown']:,} of {d['world_size']:,} ranks are listed: "
                      "the pattern repeats)")  # fmt: skip
    t = Table(title="rank -> coordinates", title_justify="left")
    cols = ["rank", *d["axis_order"], "ep"] + (["node"] if "node" in d["ranks"][0] else [])
    for c in cols:
        t.add_column(c, justify="right")
    for r in d["ranks"]:
        t.add_row(*(str(r[c]) for c in cols))
    console.print(t)
    console.print("rank groups (as Megatron's initialize_model_parallel lists them):")
    for axis in (*d["axis_order"], "ep"):
        groups = d["groups"][axis]
        deg = mesh[axis]
        if deg == 1:
            continue
        text = " ".join("[" + ",".join(map(str, g)) + "]" for g in groups)
        console.print(f"  {axis} ({deg}, {len(groups)} groups): {text}")
    t = Table(title="what each rank holds", title_justify="left")
    cols2 = ["rank", "stage", "layers", "heads", "KV heads", "FFN cols", "vocab rows"]
    has_seq = "seq_chunks" in d["holdings"][0]
    if has_seq:
        cols2.append("seq chunks")
    for c in cols2:
        t.add_column(c, overflow="fold")
    for h in d["holdings"]:
        row = [
            str(h["rank"]),
            ",".join(map(str, h["stages"]))
            + (" +emb" if h["embedding"] else "")
            + (" +head" if h["output_head"] else ""),
            ",".join(_span(x) for x in h["layers"]),
            _span(h["heads"]),
            _span(h["kv_heads"]),
            _span(h["ffn_columns"]),
            _span(h["vocab_rows"]),
        ]
        if has_seq:
            chunks = ",".join(map(str, h["seq_chunks"]))
            if "seq_tokens" in h:
                chunks += " (" + ", ".join(_span(x) for x in h["seq_tokens"]) + ")"
            row.append(chunks)
        t.add_row(*row)
    console.print(t)
    print_constraints(d["constraints"])


@app.command("layout")
def layout_cmd(
    world: int = typer.Option(..., "--world", click_type=RANKS, help="Total ranks (GPUs)."),
    dp: int = typer.Option(1, click_type=RANKS, help="Data-parallel degree."),
    tp: int = typer.Option(1, click_type=RANKS, help="Tensor-parallel degree (heads, FFN)."),
    pp: int = typer.Option(1, click_type=RANKS, help="Pipeline-parallel degree (stages)."),
    cp: int = typer.Option(1, click_type=RANKS, help="Context-parallel degree (sequence)."),
    ep: int = typer.Option(1, click_type=RANKS, help="Expert-parallel degree (splits dp)."),
    vpp: int = typer.Option(1, click_type=COUNT, help="Virtual stages per pipeline rank."),
    model: str = typer.Option("llama3.1-8b", help="Model name or preset (parlab.models)."),
    seq: int | None = typer.Option(
        None, click_type=COUNT, help="Sequence length (needed for CP and SP)."
    ),
    sp: bool = typer.Option(False, "--sp", help="Sequence parallel on the TP axis."),
    gpus_per_node: int | None = typer.Option(
        None, click_type=COUNT, help="GPUs per node (TP must fit in one)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of tables."),
) -> None:
    """The analytic layout: mesh, rank table, groups per axis, what each rank holds, constraints."""
    shape = model_shape(model)
    degrees = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep}
    try:
        d = describe(
            world=world,
            degrees=degrees,
            shape=shape,
            seq=seq,
            sequence_parallel=sp,
            gpus_per_node=gpus_per_node,
            vpp=vpp,
        )
    except LayoutError as exc:
        rows = [{"name": r.name, "ok": r.ok, "detail": r.detail} for r in exc.rows]
        if as_json:
            print_json({"valid": False, "constraints": rows})
        else:
            err_console.print("the layout breaks these rows of the constraint table:")
            print_constraints(rows, only_failing=True, to=err_console)
        raise
    if as_json:
        print_json({"valid": True, **d})
    else:
        print_layout(d)


@project_app.command("model-internal")
def model_internal_cmd(
    results: Path | None = ResultsOption,
    preset: str = typer.Option(
        "cpu", help="cpu (tiny model, gloo ranks) or gpu (1.3B model, NCCL ranks)."
    ),
    nproc: int = typer.Option(2, help="Ranks (2 for the TP2/PP2/CP2 comparison set)."),
    only: list[str] | None = typer.Option(
        None, help="Run only these runs (tp2-sp, tp2, pp2-gpipe, pp2-1f1b, cp2-ring, ...)."
    ),
    seq: int | None = typer.Option(None, help="Override the sequence length."),
    steps: int | None = typer.Option(None, help="Override the measured steps per run."),
    timeout: float = typer.Option(
        600.0, click_type=SECONDS, help="Process-group timeout, seconds."
    ),
    budget: float | None = typer.Option(
        None,
        click_type=SECONDS,
        help="Wall-time cap for all launches (runs left out: failures).",
    ),
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
) -> None:
    """TP2 (+SP), PP2 (GPipe, 1F1B, interleaved), CP2 (32k/64k on GPU) and torch's own TP/PP,
    each against one rank at the same global batch: documents and a report."""
    from parlab.projects.model_internal import run_project  # lazy: torch

    with on_nodes(nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)):
        run_project(
            results_dir(results),
            console=console,
            preset=preset,
            nproc=nproc,
            only=only,
            seq=seq,
            steps=steps,
            timeout_s=timeout,
            budget_s=budget,
        )

"""Core commands: ``results``, ``env``, ``demo``."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import typer
from rich.markup import escape
from rich.table import Table

from parlab import contract
from parlab.cli import app
from parlab.cli.common import (
    COUNT,
    Choice,
    JsonDocument,
    NnodesOption,
    NodeRankOption,
    RdzvBackendOption,
    RdzvEndpointOption,
    RdzvIdOption,
    ResultsOption,
    TimeoutOption,
    console,
    nodes,
    print_json,
    reproduce_command,
    results_dir,
    say,
    say_error,
    write,
)
from parlab.errors import UsageError
from parlab.runtime.launch import default_timeout_s, on_nodes
from parlab.units import format_bytes, format_seconds


def format_metric(m: contract.Metric) -> str:
    if m.value is None:
        return "unknown"
    v = m.value
    if m.unit == "B":
        return format_bytes(v)
    if m.unit == "s":
        return format_seconds(v)
    if m.unit in ("B/s", "GB/s"):
        return f"{v / 1e9:.1f} GB/s" if m.unit == "B/s" else f"{v:.1f} GB/s"
    if m.unit == "bool":
        return "yes" if v else "no"
    if abs(v) >= 1000:
        return f"{v:,.0f} {m.unit}"
    return f"{v:.4g} {m.unit}"


@app.command("results")
def results_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder (default: ./parlab-results)."),
    project: str | None = typer.Option(
        None, click_type=Choice(contract.PROJECTS), help="Only this project."
    ),
    role: str | None = typer.Option(
        None, click_type=Choice(contract.ROLES), help="Only this role."
    ),
    level: str | None = typer.Option(
        None, click_type=Choice(contract.EVIDENCE_LEVELS), help="Only this evidence level."
    ),
    all_rows: bool = typer.Option(
        False, "--all", help="Every document, one row each (default: a summary per project)."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print JSON (every document) instead."),
) -> None:
    """The experiment asset table: what a results folder holds, per project, or every document."""
    root = results_dir(folder)
    entries, skipped = contract.read_results(root, nested=True)
    entries = contract.filter_entries(entries, project=project, role=role, level=level)
    if as_json:
        print_json(
            {
                "documents": [_row_json(e) for e in entries],
                "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped],
            }
        )
        return
    if all_rows:
        print_asset_table(root, entries, skipped)
    else:
        print_summary(root, entries, skipped)


def _row_json(e: contract.Entry) -> dict:
    h = contract.headline(e.doc)
    return {
        "run_id": e.doc.run_id,
        "project": e.doc.project,
        "task": e.doc.task,
        "role": e.doc.role,
        "evidence_level": e.doc.evidence_level,
        "status": e.doc.status,
        "headline": {"name": h[0], **h[1].to_json()} if h else None,
        "created": e.doc.created,
        "path": str(e.path),
    }


def print_summary(
    root: Path, entries: list[contract.Entry], skipped: list[contract.Skipped]
) -> None:
    """One row per project: how many documents, of which roles and evidence, how many failed,
    the newest, and the latest decision."""
    table = Table(
        title=f"parlab results: {escape(str(root))} -- {len(entries)} documents",
        title_justify="left",
    )
    for col in ("project", "documents", "roles", "evidence", "failed", "newest",
                "latest decision"):  # fmt: skip
        table.add_column(col, overflow="fold", justify="right" if col == "documents" else "left")
    by_project: dict[str, list[contract.Entry]] = {}
    for e in entries:
        by_project.setdefault(e.doc.project, []).append(e)
    for name in contract.PROJECTS:
        docs = [e.doc for e in by_project.get(name, [])]
        if not docs:
            continue
        roles = Counter(d.role for d in docs)
        levels = Counter(d.evidence_level for d in docs)
        failed = [d for d in docs if d.status != "ok"]
        decisions = [d for d in docs if d.decision is not None]
        latest = decisions[-1].decision if decisions else None
        table.add_row(
            name,
            str(len(docs)),
            ", ".join(f"{r} {n}" for r, n in sorted(roles.items())),
            ", ".join(f"{lv} {n}" for lv, n in levels.most_common()),
            f"{len(failed)} ({', '.join(sorted({d.failure.kind for d in failed if d.failure}))})"
            if failed
            else "0",
            docs[-1].created,
            escape(latest.chosen or "none chosen") if latest else "-",
        )
    console.print(table)
    if not entries:
        console.print("no documents match")
    console.print(
        f"every document, one row each: parlab results {escape(str(root))} --all "
        "(--project, --role, --level filter)"
    )
    _print_skipped(skipped)


def _print_skipped(skipped: list[contract.Skipped]) -> None:
    for s in skipped:
        say_error(f"skipped {s.path}: {s.reason}")


def print_asset_table(
    root: Path, entries: list[contract.Entry], skipped: list[contract.Skipped]
) -> None:
    table = Table(title=f"parlab results: {escape(str(root))}", title_justify="left")
    for col in ("project", "task", "role", "evidence", "status", "headline", "created", "path"):
        table.add_column(col, overflow="fold")
    for e in entries:
        h = contract.headline(e.doc)
        head = f"{h[0]} = {format_metric(h[1])}" if h else "-"
        status = e.doc.status if e.doc.failure is None else f"failed ({e.doc.failure.kind})"
        try:
            rel = e.path.relative_to(root)
        except ValueError:
            rel = e.path
        table.add_row(
            e.doc.project,
            e.doc.task,
            e.doc.role,
            e.doc.evidence_level,
            status,
            escape(head),
            e.doc.created,
            escape(str(rel)),
        )
    console.print(table)
    if not entries:
        console.print("no documents match")
    _print_skipped(skipped)


@app.command("env")
def env_cmd(
    results: Path | None = ResultsOption,
    nproc: int | None = typer.Option(
        None,
        click_type=COUNT,
        help="Ranks on this node for the sanity all-reduce (default: every GPU, or 2 on CPU).",
    ),
    timeout: float | None = TimeoutOption,
    nnodes: int = NnodesOption,
    node_rank: int | None = NodeRankOption,
    rdzv_endpoint: str | None = RdzvEndpointOption,
    rdzv_backend: str = RdzvBackendOption,
    rdzv_id: str = RdzvIdOption,
    as_json: JsonDocument = False,
) -> None:
    """Environment precheck: versions, GPUs, interconnect, NCCL/TORCH variables, a checked all-reduce."""
    from parlab.hardware.precheck import run_precheck  # lazy: torch

    job = nodes(nnodes, node_rank, rdzv_endpoint, rdzv_backend, rdzv_id)
    if job.multi and nproc is None:
        raise UsageError("on several nodes give --nproc (ranks on each node)")
    root = results_dir(results)  # a bad folder is refused before anything runs
    with on_nodes(job):
        doc = run_precheck(
            command=reproduce_command(),
            nproc=None if nproc is None else nproc * job.nnodes,
            timeout_s=timeout or default_timeout_s(nproc or 1),
        )
        path = write(doc, root, quiet=as_json)
    if as_json:
        print_json(doc.to_json())
    else:
        print_env_summary(doc, path)
    if doc.status != "ok":
        raise typer.Exit(1)


def print_env_summary(doc: contract.Document, path: Path) -> None:
    env = doc.environment
    sw, hw = env["software"], env["hardware"]
    say(
        f"python {sw['python']}  torch {sw['torch']}  CUDA {sw['cuda'] or '-'}  "
        f"NCCL {sw['nccl'] or '-'}  parlab {sw['parlab']}"
    )
    cpu = hw["cpu"]
    say(
        f"CPU: {cpu['count']} cores ({cpu.get('model') or 'unknown model'}); hosts: {hw['host_count']}"
    )
    if not hw["gpus"]:
        console.print(
            "GPUs: none found (this machine has no usable GPU; distributed runs use gloo CPU ranks)"
        )
    else:
        t = Table(title="GPUs", title_justify="left")
        for c in ("index", "name", "memory", "compute capability"):
            t.add_column(c)
        for i, g in enumerate(hw["gpus"]):
            t.add_row(
                str(i),
                escape(g["name"]),
                format_bytes(g["memory_bytes"]),
                g.get("compute_capability") or "-",
            )
        console.print(t)
    inter = hw.get("interconnect")
    if inter and inter.get("nvlinks"):
        t = Table(title=f"interconnect ({inter.get('source')})", title_justify="left")
        n = len(inter["nvlinks"])
        t.add_column("")
        for j in range(n):
            t.add_column(f"GPU{j}")
        for i in range(n):
            cells = []
            for j in range(n):
                if i == j:
                    cells.append("X")
                    continue
                label = inter["matrix"][i][j] if inter.get("matrix") else ""
                links = inter["nvlinks"][i][j]
                bw = (inter.get("per_direction_bw") or [[None] * n] * n)[i][j]
                text = label or (f"NV{links}" if links else "-")
                if bw:
                    text += f" ({bw / 1e9:.0f} GB/s)"
                cells.append(text)
            t.add_row(f"GPU{i}", *cells)
        console.print(t)
        if inter.get("per_link_bw"):
            console.print(
                f"per NVLink: {inter['per_link_bw'] / 1e9:.3f} GB/s per direction "
                f"(source: {inter.get('per_link_bw_source')})"
            )
    variables = env.get("variables") or {}
    say(
        "NCCL/TORCH variables: "
        + (", ".join(f"{k}={v}" for k, v in variables.items()) or "none set")
    )
    m = doc.metrics
    if "sanity_allreduce_ok" in m:
        ok = m["sanity_allreduce_ok"].value
        console.print(
            f"sanity all-reduce over {doc.layout['world_size']} {doc.layout['backend']} ranks: "
            f"{'correct' if ok else 'WRONG'} ({int(m['sanity_allreduce_wrong'].value or 0)} wrong values), "
            f"{format_metric(m['sanity_allreduce_time'])} for 4 MiB"
        )
    elif doc.failure:
        console.print(
            f"[red]sanity all-reduce failed[/red] ({doc.failure.kind}): {escape(doc.failure.message)}"
        )
    say(f"document: {path}")


@app.command("demo")
def demo_cmd(
    results: Path | None = ResultsOption,
    only: list[str] | None = typer.Option(None, help="Run only the named step(s)."),
) -> None:
    """The main job on the embedded default: every step of the lab at CPU size, then the asset table."""
    from parlab.cli.demo import run_demo  # lazy: torch

    root = results_dir(results)
    failed = run_demo(root, console, only=only)
    entries, skipped = contract.read_results(root)
    print_asset_table(root, entries, skipped)
    report = root / "report" / "report.html"
    if report.exists():
        say(f"report: {report} (Markdown beside it: {report.with_suffix('.md').name})")
    if failed:
        say_error(f"{failed} demo step(s) failed")
        raise typer.Exit(1)

"""Core commands: ``results``, ``env``, ``demo``."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from parlab import contract
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
    project: str | None = typer.Option(None, help="Only this project (e.g. PAR-COLLECTIVES)."),
    role: str | None = typer.Option(
        None, help="Only this role (baseline, candidate, failure, decision)."
    ),
    level: str | None = typer.Option(None, help="Only this evidence level (e.g. real-nccl)."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a table."),
) -> None:
    """The experiment asset table: every document in a results folder."""
    root = results_dir(folder)
    entries, skipped = contract.read_results(root)
    entries = contract.filter_entries(entries, project=project, role=role, level=level)
    if as_json:
        rows = []
        for e in entries:
            h = contract.headline(e.doc)
            rows.append(
                {
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
            )
        print_json(
            {
                "documents": rows,
                "skipped": [{"path": str(s.path), "reason": s.reason} for s in skipped],
            }
        )
        return
    print_asset_table(root, entries, skipped)


def print_asset_table(
    root: Path, entries: list[contract.Entry], skipped: list[contract.Skipped]
) -> None:
    table = Table(title=f"parlab results: {root}", title_justify="left")
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
            head,
            e.doc.created,
            str(rel),
        )
    console.print(table)
    if not entries:
        console.print("no documents match")
    for s in skipped:
        err_console.print(f"skipped {s.path}: {s.reason}")


@app.command("env")
def env_cmd(
    results: Path | None = ResultsOption,
    nproc: int | None = typer.Option(
        None, help="Ranks for the sanity all-reduce (default: every GPU, or 2 on CPU)."
    ),
    timeout: float = typer.Option(
        60.0, help="Process-group timeout for the sanity all-reduce, seconds."
    ),
    as_json: bool = typer.Option(False, "--json", help="Print the document as JSON."),
) -> None:
    """Environment precheck: versions, GPUs, interconnect, NCCL/TORCH variables, a checked all-reduce."""
    from parlab.hardware.precheck import run_precheck

    if nproc is not None and nproc < 1:
        raise ValueError(f"--nproc {nproc} is below 1: give at least one rank")
    doc = run_precheck(command=reproduce_command(), nproc=nproc, timeout_s=timeout)
    path = write(doc, results_dir(results), quiet=as_json)
    if as_json:
        print_json(doc.to_json())
    else:
        print_env_summary(doc, path)
    if doc.status != "ok":
        raise typer.Exit(1)


def print_env_summary(doc: contract.Document, path: Path) -> None:
    env = doc.environment
    sw, hw = env["software"], env["hardware"]
    console.print(
        f"python {sw['python']}  torch {sw['torch']}  CUDA {sw['cuda'] or '-'}  "
        f"NCCL {sw['nccl'] or '-'}  parlab {sw['parlab']}"
    )
    cpu = hw["cpu"]
    console.print(
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
                g["name"],
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
    console.print(
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
            f"[red]sanity all-reduce failed[/red] ({doc.failure.kind}): {doc.failure.message}"
        )
    console.print(f"document: {path}")


@app.command("demo")
def demo_cmd(
    results: Path | None = ResultsOption,
    only: list[str] | None = typer.Option(None, help="Run only the named step(s)."),
) -> None:
    """The main job on the embedded default: every step of the lab at CPU size, then the asset table."""
    from parlab.cli.demo import run_demo  # heavy: the demo imports every project

    root = results_dir(results)
    failed = run_demo(root, console, only=only)
    entries, skipped = contract.read_results(root)
    print_asset_table(root, entries, skipped)
    report = root / "report" / "report.html"
    if report.exists():
        console.print(f"report: {report} (Markdown beside it: {report.with_suffix('.md').name})")
    if failed:
        err_console.print(f"{failed} demo step(s) failed")
        raise typer.Exit(1)

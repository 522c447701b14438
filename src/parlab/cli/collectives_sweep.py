"""The sweep mode of ``parlab collectives`` (its default): nccl-tests' table over the ranks,
written as a ``real-nccl`` / ``cpu-mechanism`` document; Ctrl-C keeps what was measured."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from parlab.cli.common import (
    console,
    err_console,
    print_json,
    reproduce_command,
    results_dir,
    say_error,
    size,
    with_nodes,
)
from parlab.runtime.launch import current_nodes, default_timeout_s
from parlab.units import format_bytes


def _has_cuda() -> bool:
    import torch  # lazy: torch

    return torch.cuda.is_available()


def _default_nproc() -> int:
    import torch  # lazy: torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 2


def _spec(
    *,
    op: str,
    minbytes: str,
    maxbytes: str | None,
    stepfactor: int,
    dtype: str,
    warmup: int,
    iters: int,
    inplace: bool,
    mesh: str | None,
    axis: str | None,
    graph: bool,
    via: str,
    nproc: int | None,
    backend: str,
    timeout: float | None,
) -> Any:
    """The ``SweepSpec`` of the options; bad dtype/backend/--graph/--via combinations fail
    here, before launching."""
    from parlab.comm import ops as O  # lazy: torch
    from parlab.comm.sweep import SweepSpec, parse_mesh, resolve_backend  # lazy: torch

    per_node = nproc if nproc is not None else _default_nproc()
    if maxbytes is None:
        on_gpus = backend != "gloo" and _default_nproc() >= per_node and _has_cuda()
        maxbytes = "32MiB" if on_gpus else "1MiB"
    spec = SweepSpec(
        ops=tuple(O.parse_ops(op)),
        minbytes=size(minbytes, "-b"),
        maxbytes=size(maxbytes, "-e"),
        stepfactor=stepfactor,
        dtype=dtype,
        warmup=warmup,
        iters=iters,
        inplace=inplace,
        graph=graph,
        via=via,
        mesh=parse_mesh(mesh),
        axis=axis.strip().lower() if axis else None,
        nproc=per_node * current_nodes().nnodes,
        backend=backend,
        timeout_s=timeout or default_timeout_s(per_node, backend),
    )
    resolve_backend(spec)
    return spec


def _run(spec: Any) -> Any:
    """Run the sweep under a progress bar on stderr; its outcome."""
    from parlab.comm.sweep import run_sweep  # lazy: torch

    plan = spec.plan()
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=err_console,
        transient=True,
    )
    with progress:
        task = progress.add_task(f"{len(plan)} measurements", total=len(plan))

        def on_record(rec: dict) -> None:
            progress.update(task, advance=1, description=f"{rec['op']} {format_bytes(rec['size'])}")

        return run_sweep(spec, command=reproduce_command(), on_record=on_record)


def sweep(*, results: Path | None, as_json: bool, **options: Any) -> None:
    """Measure, write the document, print the table; exit 130 when interrupted, 1 when the
    sweep failed or a value was wrong. ``options``: ``_spec``'s."""
    from parlab.comm.report import format_table  # lazy: torch
    from parlab.comm.sweep import write_sweep  # lazy: torch

    root = results_dir(results)  # a bad folder is refused before anything runs
    outcome = _run(_spec(**options))
    doc = with_nodes(outcome.doc)
    path = write_sweep(doc, root)
    if as_json:
        print_json(doc.to_json())
    else:
        console.print(format_table(doc), markup=False, highlight=False, soft_wrap=True)
    say_error(f"wrote {path} ({doc.evidence_level}, {doc.role})")
    if outcome.interrupted:
        say_error(f"interrupted: {len(outcome.records)} measurement(s) kept")
        raise typer.Exit(130)
    if doc.status != "ok":
        msg = doc.failure.message if doc.failure else "?"
        say_error(f"sweep failed ({doc.failure.kind if doc.failure else '?'}): {msg}")
        raise typer.Exit(1)
    if doc.metric("wrong_total"):
        say_error(f"{int(doc.metric('wrong_total') or 0)} wrong values")
        raise typer.Exit(1)

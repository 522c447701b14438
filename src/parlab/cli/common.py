"""Helpers shared by the command modules: the results folder, typed options (``docs/cli.md``'s
vocabulary), torchrun's launch flags, the reproduce line, output."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import shlex
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Annotated, Any

import click
import typer
from rich.console import Console

from parlab import dtypes, units
from parlab.contract import Document, write_result
from parlab.errors import UsageError
from parlab.runtime.launch import Nodes, current_nodes

DEFAULT_RESULTS = "parlab-results"

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)


def say(text: str) -> None:
    """One line on stdout, printed as it is (paths and messages are never markup)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)


def say_error(text: str) -> None:
    """One line on stderr, printed as it is (a message may hold ``[/...]``: never markup)."""
    err_console.print(text, markup=False, highlight=False, soft_wrap=True)


# --- typed values: what --help lists and what a bad value answers -------------------------


class _Typed(click.ParamType):
    """A click type whose parser is one of ``parlab.units``'; its ``UsageError`` becomes
    click's one-line usage error."""

    def parse(self, value: str) -> Any:
        raise NotImplementedError

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if not isinstance(value, str):
            return value
        try:
            return self.parse(value)
        except UsageError as exc:  # click names the option: the message starts at the value
            self.fail(str(exc).strip(), param, ctx)


class Count(_Typed):
    """A whole number in ASCII digits within a range."""

    name = "N"

    def __init__(self, minimum: int = 1, maximum: int = 2**31 - 1) -> None:
        self.minimum, self.maximum = minimum, maximum

    def parse(self, value: str) -> int:
        return units.parse_count(value, "", minimum=self.minimum, maximum=self.maximum)


class Seconds(_Typed):
    """A finite number of seconds above 0."""

    name = "SECONDS"

    def parse(self, value: str) -> float:
        return units.parse_seconds(value, "")


class Number(_Typed):
    """A finite number, above ``minimum`` (or at least it, ``closed=True``)."""

    name = "X"

    def __init__(self, minimum: float = 0.0, *, closed: bool = False) -> None:
        self.minimum, self.closed = minimum, closed

    def parse(self, value: str) -> float:
        try:
            x = float(value)
        except ValueError:
            raise UsageError(f"{units.shown(value)} is not a number") from None
        low = x >= self.minimum if self.closed else x > self.minimum
        if not math.isfinite(x) or not low:
            bound = f"{'at least' if self.closed else 'above'} {self.minimum:g}"
            raise UsageError(f"{units.shown(value)} must be a finite number {bound}")
        return x


class Port(Count):
    """A TCP port, 0 (a free one) to 65535."""

    name = "PORT"

    def __init__(self) -> None:
        super().__init__(0, 65535)


class Choice(click.Choice):
    """A typed choice whose retired spellings answer with the one that replaced them."""

    def __init__(self, choices: Iterable[str], *, flag: str = "--dtype") -> None:
        super().__init__(list(choices))
        self.flag = flag

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        if isinstance(value, str) and value not in self.choices:
            msg = dtypes.retired_message(value, self.flag, self.choices)
            if msg is not None:  # click names the option: the message starts at the value
                self.fail(msg.removeprefix(self.flag).strip(), param, ctx)
        return super().convert(value, param, ctx)


def recipe_choice(names: Iterable[str] = tuple(dtypes.RECIPES)) -> Choice:
    return Choice(names, flag="--dtype")


def tensor_dtype_choice(names: Iterable[str] = dtypes.TENSOR_DTYPES) -> Choice:
    return Choice(names, flag="--tensor-dtype")


COUNT = Count()
COUNT0 = Count(0)
RANKS = Count(1, units.MAX_WORLD)
"""A degree or a number of GPUs: at most ``parlab.units.MAX_WORLD``."""
SECONDS = Seconds()
PORT = Port()
POSITIVE = Number()
NONNEGATIVE = Number(closed=True)


def size(text: str, flag: str) -> int:
    """``parlab.units.parse_size`` naming the flag."""
    return units.parse_size(text, flag)


# --- results folder -----------------------------------------------------------------------

ResultsOption = typer.Option(
    None,
    "--results",
    help=f"Results folder (default: $PARLAB_RESULTS or ./{DEFAULT_RESULTS}).",
)


def results_dir(value: str | Path | None) -> Path:
    path = Path(value or os.environ.get("PARLAB_RESULTS") or DEFAULT_RESULTS)
    if path.exists() and not path.is_dir():
        raise UsageError(f"results folder {path} is a file: give a folder")
    return path


# --- torchrun's launch flags --------------------------------------------------------------

NnodesOption = typer.Option(
    1, "--nnodes", click_type=COUNT, help="Nodes in the job (torchrun --nnodes)."
)
NodeRankOption = typer.Option(
    None,
    "--node-rank",
    click_type=COUNT0,
    help="This node's rank, 0 to nnodes-1 (torchrun --node-rank); needed with --nnodes > 1.",
)
RdzvEndpointOption = typer.Option(
    None,
    "--rdzv-endpoint",
    help="HOST:PORT every node joins, the head node's (torchrun --rdzv-endpoint).",
)
RdzvBackendOption = typer.Option(
    "c10d",
    "--rdzv-backend",
    click_type=click.Choice(["c10d", "static"]),
    help="Rendezvous backend (torchrun --rdzv-backend).",
)
RdzvIdOption = typer.Option(
    "parlab", "--rdzv-id", help="Job id every node passes (torchrun --rdzv-id)."
)
TimeoutOption = typer.Option(
    None,
    "--timeout",
    click_type=SECONDS,
    help="Process-group timeout, seconds (default: 60 on gloo CPU ranks, 180 on NCCL).",
)


Backend = Annotated[
    str,
    typer.Option(
        click_type=Choice(("auto", "nccl", "gloo")), help="auto: NCCL on GPUs, else gloo."
    ),
]
MicroBatch = Annotated[
    int,
    typer.Option("--micro-batch", click_type=COUNT, help="Sequences per rank per micro-batch."),
]
Nproc = Annotated[
    int | None,
    typer.Option(click_type=COUNT, help="Ranks on this node (default: every GPU, or 2 on CPU)."),
]


def nodes(
    nnodes: int,
    node_rank: int | None,
    rdzv_endpoint: str | None,
    rdzv_backend: str,
    rdzv_id: str,
) -> Nodes:
    """The job's nodes from the five launch flags (``UsageError`` for a bad combination)."""
    return Nodes(
        nnodes=nnodes,
        node_rank=node_rank,
        rdzv_endpoint=rdzv_endpoint,
        rdzv_backend=rdzv_backend,
        rdzv_id=rdzv_id,
    )


# --- documents and output -----------------------------------------------------------------

_invocation: list[str] | None = None
"""The arguments ``main`` was called with (None: take them from ``sys.argv``)."""


def set_invocation(argv: list[str] | None) -> None:
    global _invocation
    _invocation = None if argv is None else list(argv)


def reproduce_command() -> str:
    """The command line that reproduces this run, as the user would type it."""
    args = sys.argv[1:] if _invocation is None else _invocation
    return shlex.join(["parlab", *args])


def with_nodes(doc: Document) -> Document:
    """On several nodes: the document records them (``layout.nodes``, the host count)."""
    n = current_nodes()
    if not n.multi:
        return doc
    env = dict(doc.environment)
    hw = dict(env.get("hardware") or {})
    hw["host_count"] = n.nnodes
    env["hardware"] = hw
    note = (
        f"written by the launcher of --node-rank {n.node_rank} of {n.nnodes} nodes "
        f"(rendezvous {n.rdzv_endpoint}, id {n.rdzv_id})"
    )
    return dataclasses.replace(
        doc,
        environment=env,
        layout={**doc.layout, "nodes": n.to_json()},
        notes=[*doc.notes, note],
    )


def write(doc: Document, results: Path, *, quiet: bool = False) -> Path:
    path = write_result(with_nodes(doc), results)
    if not quiet:
        say_error(f"wrote {path} ({doc.evidence_level}, {doc.role})")
    return path


JsonDocument = Annotated[bool, typer.Option("--json", help="Print the document as JSON.")]
JsonPrint = Annotated[bool, typer.Option("--json", help="Print JSON.")]


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")

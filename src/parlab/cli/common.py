"""Helpers shared by the command modules: the results folder, the reproduce line, output."""

from __future__ import annotations

import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

import typer
from rich.console import Console

from parlab.contract import write_document
from parlab.errors import UsageError

DEFAULT_RESULTS = "parlab-results"

console = Console(highlight=False, width=None if sys.stdout.isatty() else 160)
err_console = Console(stderr=True, highlight=False, width=None if sys.stderr.isatty() else 160)

ResultsOption = typer.Option(
    None,
    "--results",
    help=f"Results folder (default: $PARLAB_RESULTS or ./{DEFAULT_RESULTS}).",
)


def results_dir(value: str | Path | None) -> Path:
    path = Path(value or os.environ.get("PARLAB_RESULTS") or DEFAULT_RESULTS)
    if path.exists() and not path.is_dir():
        raise UsageError(f"results folder {path} is a file: pass a folder with --results DIR")
    return path


_invocation: list[str] | None = None
"""The arguments ``main`` was called with (None: take them from ``sys.argv``)."""


def set_invocation(argv: list[str] | None) -> None:
    global _invocation
    _invocation = None if argv is None else list(argv)


def reproduce_command() -> str:
    """The command line that reproduces this run, as the user would type it."""
    args = sys.argv[1:] if _invocation is None else _invocation
    return shlex.join(["parlab", *args])


write = write_document
"""Write a document and say where it went (``parlab.contract.write_document``)."""


def print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2, default=str) + "\n")

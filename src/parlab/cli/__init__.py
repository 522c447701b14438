"""The ``parlab`` command: a thin layer that parses, calls one function, prints or writes.

Each area registers its commands from its own module (``parlab.cli.<area>``).
Bad input -- a ``ValueError`` (parlab's ``UsageError`` is one) or a click
usage error -- prints one line on stderr and exits with status 2. Set
``PARLAB_DEBUG=1`` to see the traceback instead.
"""

from __future__ import annotations

import os
import sys

import typer

app = typer.Typer(
    name="parlab",
    help="A lab for multi-GPU parallelism and communication: can it fit, can it be faster, "
    "is the cost acceptable? Every answer is a distributed-benchmark/v1 document.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

# Each module below adds its commands to ``app`` when imported.
from parlab.cli import core
from parlab.cli import doctor
from parlab.cli import analytic
from parlab.cli import train  # noqa: E402, F401
from parlab.cli import collectives
from parlab.cli import layout
from parlab.cli import moe
from parlab.cli import profile
from parlab.cli import serve
from parlab.cli import plan


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``parlab`` console script and ``python -m parlab``."""
    from parlab.cli.common import set_invocation

    set_invocation(argv)
    try:
        rv = app(args=argv, standalone_mode=False, prog_name="parlab")
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        print("parlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except ValueError as exc:
        if os.environ.get("PARLAB_DEBUG"):
            raise
        print(f"parlab: error: {' '.join(str(exc).split())}", file=sys.stderr)
        sys.exit(2)
    except KeyboardInterrupt:
        print("parlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except Exception as exc:
        # click's usage errors (typer may vendor click, so match by shape, not class)
        if hasattr(exc, "format_message") and getattr(exc, "exit_code", None) == 2:
            print(f"parlab: error: {' '.join(exc.format_message().split())}", file=sys.stderr)
            sys.exit(2)
        raise
    sys.exit(rv if isinstance(rv, int) else 0)

"""The ``parlab`` command: a thin layer that parses, calls one function, prints or writes.

Each area registers its commands from its own module (``parlab.cli.<area>``); every
command's ``--help`` opens with its examples (``parlab.cli.examples``). Exit status
(``docs/cli.md``): bad input -- parlab's ``UsageError``, a click usage error, a retired
flag -- prints one line on stderr and exits 2; a run that failed exits 1; an internal
error prints one line naming what failed and in which file and exits 3. Set
``PARLAB_DEBUG=1`` to see the traceback instead.

Lazy imports, so that ``--help`` and the formula-only commands (``fit``, ``ledger``,
``layout``, ``explain``) start in well under a second: torch comes only with the commands
that launch ranks or serve (``parlab.projects.*``, ``parlab.comm.ops``/``sweep``,
``parlab.profile.*``, ``parlab.serve.*``, imported inside those commands), matplotlib only
with those that draw (``parlab.comm.report``, ``parlab.profile``, ``parlab.report``); the
analytic documents' environment is ``snapshot(light=True)``, which reads versions from
package metadata instead of importing torch.
"""

from __future__ import annotations

import errno
import os
import sys
import traceback

import click
import typer

import parlab

app = typer.Typer(
    name="parlab",
    help="A lab for multi-GPU parallelism and communication: can it fit, can it be faster, "
    "is the cost acceptable? Every answer is a distributed-benchmark/v1 document.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        print(f"parlab {parlab.__version__}")
        raise typer.Exit(0)


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", is_eager=True, callback=_version, help="Print the version and exit."
    ),
) -> None:
    """A lab for multi-GPU parallelism and communication: can it fit, can it be faster, is the
    cost acceptable? Every answer is a distributed-benchmark/v1 document."""


# Each module below adds its commands to ``app`` when imported.
from parlab.cli import core
from parlab.cli import doctor
from parlab.cli import analytic
from parlab.cli import fit
from parlab.cli import train  # noqa: E402, F401
from parlab.cli import collectives
from parlab.cli import layout
from parlab.cli import moe
from parlab.cli import profile
from parlab.cli import profile_presets
from parlab.cli import bench
from parlab.cli import serve
from parlab.cli import serve_project
from parlab.cli import plan
from parlab.cli import launch
from parlab.cli.examples import RETIRED_FLAGS, add_examples
from parlab.cli.common import set_invocation
from parlab.errors import UsageError


def one_line(text: str) -> str:
    return " ".join(str(text).split())


def _where(exc: BaseException) -> str:
    """``file:line in function`` of the innermost frame in parlab's own source."""
    frames = traceback.extract_tb(exc.__traceback__)
    root = os.path.dirname(os.path.dirname(parlab.__file__))
    own = [f for f in frames if f.filename.startswith(os.path.dirname(parlab.__file__))]
    f = (own or frames or [None])[-1]
    if f is None:
        return "an unknown place"
    return f"{os.path.relpath(f.filename, root)}:{f.lineno} in {f.name}"


def _usage_exit(message: str) -> None:
    print(f"parlab: error: {one_line(message)}", file=sys.stderr)
    sys.exit(2)


def _click_error(exc: click.ClickException) -> None:
    if isinstance(exc, click.NoSuchOption) and exc.option_name in RETIRED_FLAGS:
        _usage_exit(f"{exc.option_name} is now {RETIRED_FLAGS[exc.option_name]}")
    _usage_exit(exc.format_message())


def _os_error(exc: OSError) -> None:
    if exc.errno == errno.EADDRINUSE:
        _usage_exit(f"{exc.strerror or exc}: pick another --port (0: a free one)")
    if exc.filename is not None and exc.errno in (
        errno.ENOENT, errno.EEXIST, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EROFS,
    ):  # fmt: skip
        _usage_exit(f"{exc.filename}: {exc.strerror}")
    _internal(exc)


def _internal(exc: BaseException) -> None:
    print(
        f"parlab: internal error: {type(exc).__name__}: {one_line(str(exc))[:300]} "
        f"(at {_where(exc)}; PARLAB_DEBUG=1 shows the traceback)",
        file=sys.stderr,
    )
    sys.exit(3)


def main(argv: list[str] | None = None) -> None:
    """Entry point of the ``parlab`` console script and ``python -m parlab``."""
    set_invocation(argv)
    command = typer.main.get_command(app)
    add_examples(command)
    debug = bool(os.environ.get("PARLAB_DEBUG"))
    try:
        rv = command.main(args=argv, standalone_mode=False, prog_name="parlab")
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        print("parlab: interrupted", file=sys.stderr)
        sys.exit(130)
    except UsageError as exc:
        if debug:
            raise
        _usage_exit(str(exc))
    except click.ClickException as exc:
        if debug:
            raise
        _click_error(exc)
    except OSError as exc:
        if debug:
            raise
        _os_error(exc)
    except Exception as exc:
        if debug:
            raise
        _internal(exc)
    sys.exit(rv if isinstance(rv, int) else 0)

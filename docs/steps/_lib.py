"""What the step pages are built from: commands run in-process (``run``), contract documents
read from the committed folders (``find``, ``configs_of``), numbers formatted as the report
formats them, and the page's parts (``Exercise``, ``exercises``, ``page``).

Every number a page shows is computed here or by parlab during the build, or read from a
document whose path and evidence level the page prints. Commands are named in
``_commands.COMMANDS`` and nowhere else.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shlex
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "src"))
os.environ.setdefault("COLUMNS", "160")

from _commands import COMMANDS  # noqa: E402

from parlab.contract import Document, Metric, read_results  # noqa: E402
from parlab.report.format import fmt_value  # noqa: E402
from parlab.report.groups import Config, Spread, configs  # noqa: E402

GPU = ROOT / "results"
"""The 2 x H200 documents."""
CPU = ROOT / "docs" / "steps" / "cpu-results"
"""The CPU documents (``parlab demo``: 2 gloo ranks)."""
PAGES = ROOT / "docs" / "steps"

_OUT: dict[str, str] = {}
_DOCS: dict[Path, list[tuple[Path, Document]]] = {}
_SCRATCH = Path(tempfile.mkdtemp(prefix="parlab-steps-"))
_STAMP = re.compile(r"\d{8}T\d{6}-[0-9a-f]{6}")
_VOLATILE = (
    (re.compile(r"searched (\d+) candidates in [\d.]+ s"), r"searched \1 candidates in <time> s"),
    (re.compile(r"wall_s: [\d.e+-]+"), "wall_s: <time>"),
)
"""What changes from one run of a command to the next (timings), shown as placeholders."""


def cmd(key: str) -> str:
    """The command line named ``key``."""
    return COMMANDS[key]


def run(key: str) -> str:
    """The output of command ``key``, run in this process as a user runs it (documents it
    writes go to a scratch folder, shown as ``parlab-results``; run ids as ``<run id>``)."""
    line = cmd(key)
    if line not in _OUT:
        from parlab.cli import main

        out = io.StringIO()
        saved = os.environ.get("PARLAB_RESULTS")
        os.environ["PARLAB_RESULTS"] = str(_SCRATCH)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out), \
                    contextlib.chdir(ROOT):  # fmt: skip
                main(shlex.split(line)[1:])
        except SystemExit as exc:
            if exc.code not in (0, None):
                raise RuntimeError(f"{line!r} exited {exc.code}: {out.getvalue()}") from None
        finally:
            if saved is None:
                os.environ.pop("PARLAB_RESULTS", None)
            else:
                os.environ["PARLAB_RESULTS"] = saved
        text = out.getvalue().replace(str(_SCRATCH), "parlab-results")
        text = _STAMP.sub("<run id>", text)
        for pattern, repl in _VOLATILE:
            text = pattern.sub(repl, text)
        _OUT[line] = "\n".join(ln.rstrip() for ln in text.splitlines()) + "\n"
    return _OUT[line]


def shown(text: str, *, first: int | None = None, drop: tuple[str, ...] = ()) -> str:
    """Output as a page shows it: lines starting with ``drop`` left out, at most ``first``."""
    lines = [ln for ln in text.splitlines() if not ln.lstrip().startswith(drop)] if drop else (
        text.splitlines())  # fmt: skip
    if first is not None and len(lines) > first:
        lines = [*lines[:first], f"[... {len(lines) - first} more lines: run the command]"]
    return "\n".join(lines)


def docs(root: Path = GPU) -> list[tuple[Path, Document]]:
    if root not in _DOCS:
        _DOCS[root] = [(e.path, e.doc) for e in read_results(root)[0]] if root.is_dir() else []
    return _DOCS[root]


def find(pattern: str, root: Path = GPU, **where: object) -> list[Document]:
    """Documents whose file name matches ``pattern`` and whose layout/workload scalars match
    ``where`` (``world_size=2``, ``seq=4096``, ``model="1.3b"``), oldest first."""
    out = []
    for path, d in docs(root):
        if not path.match(pattern):
            continue
        got = {**d.workload, **d.layout}
        if isinstance(got.get("model"), dict):
            got["model"] = got["model"].get("name")
        if all(got.get(k) == v for k, v in where.items()):
            out.append(d)
    return out


def path_of(doc: Document) -> Path:
    return next(p for root in (GPU, CPU) for p, d in docs(root) if d.run_id == doc.run_id)


def link(doc: Document) -> str:
    """A Markdown link from a page to the document, with its evidence level."""
    rel = os.path.relpath(path_of(doc), PAGES)
    return f"[`{doc.run_id}`]({rel}) `{doc.evidence_level}`"


def configs_of(pattern: str, root: Path = GPU, **where: object) -> dict[str, Config]:
    """Configuration name -> its repeats, among the matching documents."""
    return {c.label: c for c in configs(find(pattern, root, **where))}


def med(c: Config, metric: str) -> float:
    s = c.spread(metric)
    if s is None:
        raise KeyError(f"{metric} not measured by {c.label}")
    return s.median


def val(v: float | None, unit: str) -> str:
    """A value as the report writes it (``41,437 tokens/s``, ``25.43 GiB``, ``197.70 ms``)."""
    return fmt_value(v, unit)


def spread(s: Spread | None, unit: str) -> str:
    if s is None:
        return "not measured"
    text = val(s.median, unit)
    return text + (f" (median of {s.n}, {val(s.lo, unit)} to {val(s.hi, unit)})" if s.n > 1 else "")


def metric(doc: Document, name: str) -> Metric:
    m = doc.metrics.get(name)
    if m is None:
        raise KeyError(f"{doc.run_id} has no metric {name}")
    return m


def table(headers: list[str], rows: list[list[str]]) -> str:
    out = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    out += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(out)


@dataclass(frozen=True, kw_only=True)
class Exercise:
    """A question, the command that answers it, and the answer worked out from its output.

    ``answer(output)`` writes the folded answer; ``check(output)`` raises ``AssertionError``
    when the output no longer supports it (the test suite runs every exercise's command)."""

    question: str
    command: str
    """A key of ``COMMANDS``."""
    answer: Callable[[str], str]
    check: Callable[[str], None]


def exercises(items: list[Exercise]) -> str:
    out = ["## Exercises", ""]
    for i, ex in enumerate(items, 1):
        out += [f"**{i}.** {ex.question}", "", "```bash", cmd(ex.command), "```", "",
                "<details><summary>Answer</summary>", "", ex.answer(run(ex.command)), "",
                "</details>", ""]  # fmt: skip
    return "\n".join(out)


@dataclass(frozen=True, kw_only=True)
class Page:
    """One step page: its parts in order."""

    step: str
    title: str
    question: str
    mechanism: str
    runs: str
    why: str
    exercises: list[Exercise] = field(default_factory=list)

    def markdown(self) -> str:
        return "\n".join([
            f"# {self.step} -- {self.title}", "",
            "<!-- generated by docs/steps/_build.py from documents and commands; edit the "
            "build, not this file -->", "",
            f"**The question.** {self.question}", "",
            "## The mechanism", "", self.mechanism.strip(), "",
            "## Run it", "", self.runs.strip(), "",
            "## Why it looks like that", "", self.why.strip(), "",
            exercises(self.exercises).strip(), "",
            "Evidence levels: `analytic` = formulas only; `cpu-mechanism` = real processes and "
            "collectives on CPU (the mechanism and its bytes, not GPU speed); `real-nccl`, "
            "`real-training`, `serving-benchmark` = measured on the 2 x H200 machine. "
            "`parlab explain TERM` explains a term.", "",
        ])  # fmt: skip


def block(key: str, output: str, level: str = "analytic, computed now by the build") -> str:
    """A command and its output, as a page shows them."""
    return f"```bash\n{cmd(key)}\n```\n\nOutput ({level}):\n\n```text\n{output}\n```\n"

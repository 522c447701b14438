"""``parlab doctor`` (the case collection over a results folder, reproductions) and
``parlab explain`` (the glossary)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer
from rich.markup import escape
from rich.table import Table

from parlab.cli import app
from parlab.cli.common import JsonPrint, console, print_json
from parlab.errors import UsageError
from parlab.glossary import TERMS, lookup


def print_diagnosis(diag: Any, *, show_help: bool = True) -> None:
    """The findings of ``parlab.doctor.diagnose``, ranked first, then grouped by case."""
    from parlab.doctor.render import print_diagnosis as render  # lazy: parlab.doctor.render

    render(diag, console, show_help=show_help)


def print_cases() -> None:
    from parlab.doctor.cases import CASES  # lazy: parlab.doctor.cases

    table = Table(title="parlab doctor: the case collection", show_lines=True)
    for col in ("case", "symptom", "evidence (document fields)", "reproduce"):
        table.add_column(col, overflow="fold")
    for c in CASES:
        rep = f"{c.reproduce}: {c.reproduce_note}" if c.reproduce != "none" else "-"
        table.add_row(f"{c.id}\n({c.title})", c.symptom, c.evidence, rep)
    console.print(table)


def run_reproduction(case: str, out: Path | None, *, as_json: bool = False) -> bool:
    """Run ``case``'s reproduction; print the doctor on both folders; True if it shows the case
    in the case folder and not in the healthy one."""
    from parlab.doctor import diagnose  # lazy: parlab.doctor.diagnose
    from parlab.doctor.reproduce import get  # lazy: torch

    rep = get(case)
    out = Path(out or Path("parlab-doctor") / case)
    case_dir, healthy_dir = rep.run(out)
    d_case, d_ok = diagnose(case_dir), diagnose(healthy_dir)
    shown = case in d_case.cases_found() and case not in d_ok.cases_found()
    if as_json:
        print_json({"case": case, "shown": shown, "case_folder": d_case.to_json(),
                    "healthy_folder": d_ok.to_json()})  # fmt: skip
        return shown
    console.rule(f"reproduction {case}: the case")
    print_diagnosis(d_case, show_help=False)
    console.rule(f"reproduction {case}: the healthy twin")
    print_diagnosis(d_ok, show_help=False)
    verdict = "shown" if shown else "NOT shown"
    console.print(
        f"reproduction {case}: {verdict} (found in {case_dir}, absent from {healthy_dir})"
        if shown
        else f"reproduction {case}: {verdict}: case folder "
        f"{'has' if case in d_case.cases_found() else 'lacks'} it, healthy folder "
        f"{'has' if case in d_ok.cases_found() else 'lacks'} it"
    )
    return shown


@app.command("doctor")
def doctor_cmd(
    folder: Path | None = typer.Argument(None, help="Results folder to diagnose."),
    reproduce: str | None = typer.Option(
        None, "--reproduce", help="Run a small experiment that shows CASE beside a healthy twin."
    ),
    out: Path | None = typer.Option(
        None, "--out", help="With --reproduce: where to write (default ./parlab-doctor/CASE)."
    ),
    list_: bool = typer.Option(False, "--list", help="List the case collection."),
    case: list[str] | None = typer.Option(None, "--case", help="Check only this case (repeat)."),
    as_json: JsonPrint = False,
) -> None:
    """Why is multi-GPU not faster? Check a results folder against the case collection."""
    from parlab.doctor import diagnose  # lazy: parlab.doctor.diagnose
    from parlab.doctor.cases import BY_ID, CASES  # lazy: parlab.doctor.cases

    if list_:
        if as_json:
            print_json([{k: v for k, v in c.__dict__.items() if k != "detector"} for c in CASES])
        else:
            print_cases()
        return
    if reproduce is not None:
        if folder is not None:
            raise UsageError("pass either RESULTS_DIR or --reproduce CASE, not both")
        if not run_reproduction(reproduce, out, as_json=as_json):
            raise typer.Exit(1)
        return
    if folder is None:
        raise UsageError(
            "pass a RESULTS_DIR to diagnose (e.g. parlab doctor results), --list, or "
            "--reproduce CASE"
        )
    for c in case or []:
        if c not in BY_ID:
            raise UsageError(f"unknown case {c!r}: use one of {', '.join(BY_ID)}")
    diag = diagnose(folder, cases=case or None)
    if as_json:
        print_json(diag.to_json())
    else:
        print_diagnosis(diag)


@app.command("explain")
def explain_cmd(
    term: str | None = typer.Argument(None, help="A term: ZeRO-3, busbw, TTFT, bubble, ..."),
    list_: bool = typer.Option(False, "--list", help="List every term."),
) -> None:
    """The glossary: what a term means, its formula, what frameworks call it, the command that
    measures it."""
    if list_ or term is None:
        if term is None and not list_:
            raise UsageError("pass a TERM (e.g. parlab explain busbw) or --list")
        for t in TERMS:
            console.print(f"{escape(t.name)}: {escape(', '.join(t.aliases[:4]))}")
        return
    t = lookup(term)
    console.print(f"[bold]{escape(t.name)}[/bold]  ({escape(t.group)})")
    console.print(escape(t.meaning))
    if t.formula:
        console.print(f"[bold]formula[/bold]: {escape(t.formula)}")
    if t.elsewhere:
        console.print(f"[bold]elsewhere[/bold]: {escape(t.elsewhere)}")
    console.print(f"[bold]measure it[/bold]: {escape(t.measure)}")

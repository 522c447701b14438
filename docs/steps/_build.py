"""Build docs/steps/T0.md ... T6.md, the learning path, from documents and commands.

Each page (``_t0.py`` ... ``_t6.py``) teaches one step: the question; the mechanism with its
formula and a worked number parlab computes here; the command and its real output (run now
when it is analytic; from the committed 2 x H200 documents under ``results/`` when it needs
GPUs, or the CPU documents under ``docs/steps/cpu-results/`` otherwise, each with its evidence
level); why the output looks like it does; and exercises whose folded answers are worked out
from their commands' output. Commands are spelled once, in ``_commands.py``;
``tests/test_steps.py`` runs every exercise's command and checks its answer still holds.
Run from the repository root:

    .venv/bin/python docs/steps/_build.py          # rewrite the seven files
    .venv/bin/python docs/steps/_build.py --check  # exit 1 if a file is stale
"""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _lib import PAGES, Exercise, Page  # noqa: E402

STEPS = ("T0", "T1", "T2", "T3", "T4", "T5", "T6")


def page(step: str) -> Page:
    return importlib.import_module(f"_{step.lower()}").page()


def all_exercises() -> list[tuple[str, Exercise]]:
    """(step, exercise) for every page."""
    return [(s, ex) for s in STEPS for ex in importlib.import_module(f"_{s.lower()}").EXERCISES]


def main(argv: list[str]) -> int:
    check = "--check" in argv
    steps = [a for a in argv if a in STEPS] or list(STEPS)
    stale = []
    for step in steps:
        path = PAGES / f"{step}.md"
        text = page(step).markdown()
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(path.name)
        else:
            path.write_text(text)
    if stale:
        print(f"stale: {', '.join(stale)} (run docs/steps/_build.py)")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

"""The learning path (docs/steps/T0.md ... T6.md) cannot go stale: every exercise's command
runs here, its check must still hold on the fresh output, and the page must show the answer
the fresh output gives (else: rebuild with ``python docs/steps/_build.py``)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STEPS = ROOT / "docs" / "steps"
sys.path.insert(0, str(STEPS))

import _build  # noqa: E402
import _lib  # noqa: E402
from _commands import COMMANDS  # noqa: E402

EXERCISES = _build.all_exercises()


@pytest.mark.parametrize(
    ("step", "exercise"), EXERCISES, ids=[f"{s}-{i}" for i, (s, _) in enumerate(EXERCISES)]
)
def test_each_exercise_still_holds(step: str, exercise: _lib.Exercise) -> None:
    out = _lib.run(exercise.command)
    exercise.check(out)
    page = (STEPS / f"{step}.md").read_text()
    assert exercise.answer(out) in page, (
        f"docs/steps/{step}.md shows a stale answer: run python docs/steps/_build.py {step}"
    )


@pytest.mark.parametrize("step", _build.STEPS)
def test_every_page_teaches_in_the_same_order(step: str) -> None:
    text = (STEPS / f"{step}.md").read_text()
    heads = re.findall(r"^## (.+)$", text, re.M)
    assert heads == ["The mechanism", "Run it", "Why it looks like that", "Exercises"], heads
    assert text.count("<details><summary>Answer</summary>") >= 1
    assert "**The question.**" in text and "not in document" not in text
    # every command a page shows is spelled in _commands.py (one place to rename a flag)
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.strip().splitlines():
            assert line in COMMANDS.values(), f"{step}: {line!r} is not in _commands.py"
    # every document a page links exists
    for rel in re.findall(r"\]\(((?:\.\./\.\./results|cpu-results)/[^)]+\.json)\)", text):
        assert (STEPS / rel).resolve().is_file(), rel

"""``parlab demo``'s steps: each a function, in T0-T6 order; ``--only`` refuses a name no step has."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab.cli import main
from parlab.cli.demo import STEPS


def test_steps_are_functions_in_task_order() -> None:
    assert all(callable(s.run) for s in STEPS)
    assert [s.task for s in STEPS] == sorted(s.task for s in STEPS)
    assert len({s.name for s in STEPS}) == len(STEPS)


def test_only_an_unknown_step_is_one_line_exit_2_nothing_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r"
    with pytest.raises(SystemExit) as info:
        main(["demo", "--only", "fit", "--only", "trainig state", "--results", str(results)])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and "\n" not in err
    assert "'trainig state' is not a demo step" in err
    assert all(repr(s.name) in err for s in STEPS)  # it lists every valid name
    assert not results.exists()  # the valid 'fit' did not run either


def test_the_plan_and_decide_step_plans_and_writes_its_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    results = tmp_path / "r"
    with pytest.raises(SystemExit) as info:
        main(["demo", "--only", "plan and decide", "--results", str(results)])
    assert info.value.code == 0  # the step did not fail
    out = capsys.readouterr().out
    assert "plan [analytic] 1.3b on 2xH200" in out and "top: none" not in out
    (doc,) = (results / "PAR-TRAINING-STATE").glob("*.json")
    assert '"role": "decision"' in doc.read_text()

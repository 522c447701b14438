"""Messages and paths print as they are: a gloo message holds ``[/__w/...]``, a path may hold
``[/b]``; printed as Rich markup either would end in a traceback after the document is written."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab import contract
from parlab.cli import main

GLOO = (
    "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:78]"
    " Timed out waiting 4000ms for recv operation to complete"
)


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def test_a_training_failure_with_gloo_brackets_prints_as_text(
    capsys: pytest.CaptureFixture[str],
) -> None:
    from parlab.cli.train import _print_run
    from tests.test_contract import make_doc

    doc = make_doc(
        status="failed",
        role="failure",
        failure=contract.Failure(kind="timeout", message=GLOO, rank=1),
        layout={"world_size": 2, "strategy": "zero2"},
    )
    _print_run(doc, Path("/tmp/a[/b]/doc.json"))
    err = capsys.readouterr().err
    assert GLOO in err and "rank 1" in err and "/tmp/a[/b]/doc.json" in err


def test_a_results_path_with_markup_characters(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "a[/b]c"
    assert run_cli(["fit", "tiny", "--gpus", "H100", "--results", str(root)]) == 0
    assert f"wrote {root}" in capsys.readouterr().err
    for args in (["results", str(root)], ["results", str(root), "--all"], ["doctor", str(root)]):
        assert run_cli(args) == 0
        assert "a[/b]c" in capsys.readouterr().out

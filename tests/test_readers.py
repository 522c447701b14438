"""Readers of a results folder survive what a damaged folder holds: a FIFO, a link to a device,
a huge or deeply nested JSON, stale temp files, a folder that is not a results folder."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from parlab import contract
from parlab.cli import main
from parlab.contract import read
from tests.test_contract import make_doc


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


@pytest.fixture
def damaged(tmp_path: Path) -> tuple[Path, Path]:
    """A results folder with one good document and everything that used to crash or hang."""
    good = contract.write_result(make_doc(), tmp_path)
    folder = good.parent
    os.mkfifo(folder / "fifo.json")  # reading it would block forever
    (folder / "zero.json").symlink_to("/dev/zero")  # reading it would never end
    (folder / "deep.json").write_text("[" * 100_000 + "]" * 100_000)  # RecursionError
    nested = {"a": 1}
    for _ in range(100):
        nested = {"a": nested}
    (folder / "nested.json").write_text(json.dumps({**make_doc().to_json(), "workload": nested}))
    with open(folder / "huge.json", "wb") as f:  # sparse: 65 MiB without the disk
        f.truncate(contract.MAX_DOCUMENT_BYTES + 2**20)
    stale = folder / f".{good.name}.abc123.tmp"
    stale.write_text("half a document")
    old = time.time() - 2 * contract.STALE_TEMP_S
    os.utime(stale, (old, old))
    fresh = folder / ".other.json.def456.tmp"  # a write in progress: left alone
    fresh.write_text("being written")
    return tmp_path, good


def test_damaged_folder_reads_the_good_document_and_names_the_rest(
    damaged: tuple[Path, Path],
) -> None:
    root, good = damaged
    t0 = time.perf_counter()
    entries, skipped = contract.read_results(root)
    assert time.perf_counter() - t0 < 5  # no hang on the FIFO, no endless read of /dev/zero
    assert [e.path for e in entries] == [good]
    reasons = {s.path.name: s.reason for s in skipped}
    assert "not a regular file" in reasons["fifo.json"]
    assert "not a regular file" in reasons["zero.json"]
    assert "nested too deep" in reasons["deep.json"]
    assert "nested more than 64 deep" in reasons["nested.json"]
    assert "larger than a document can be" in reasons["huge.json"]
    stale = next(s for s in skipped if s.path.name.endswith(".abc123.tmp"))
    assert "removed" in stale.reason and not stale.path.exists()
    assert (good.parent / ".other.json.def456.tmp").exists()


@pytest.mark.parametrize("command", ["results", "doctor", "decide", "report"])
def test_every_reader_command_survives_the_damaged_folder(
    damaged: tuple[Path, Path], command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    root, _ = damaged
    args = [command, str(root)]
    if command == "report":
        args += ["--out", str(root / "report-out")]
    code = run_cli(args)
    err = capsys.readouterr().err
    assert "Traceback" not in err and "RecursionError" not in err
    # results and report read the good document; doctor finds nothing wrong in it; decide has no
    # runs to compare in one baseline (a one-line usage error)
    assert code in (0, 2), err
    if code == 2:
        assert len(err.strip().splitlines()) == 1


def test_decide_and_report_read_only_project_subfolders(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder that is not a results folder (the system temp folder, say) is not walked."""
    deep = tmp_path / "a" / "b"
    deep.mkdir(parents=True)
    (deep / "x.json").write_text("[" * 100_000)
    os.mkfifo(deep / "pipe.json")
    assert run_cli(["decide", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and "no project" in err
    assert len(err.splitlines()) == 1
    entries, skipped = contract.read_results(tmp_path)
    assert entries == [] and skipped == []


def test_read_document_refuses_a_fifo_in_one_line(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "doc.json")
    with pytest.raises(contract.NotADocument, match="not a regular file"):
        contract.read_document(tmp_path / "doc.json")


def _depth(x: object) -> int:
    if isinstance(x, dict):
        return 1 + max((_depth(v) for v in x.values()), default=0)
    if isinstance(x, list):
        return 1 + max((_depth(v) for v in x), default=0)
    return 0


_TRICKY = st.sampled_from(['a"[{', 'x\\"]]}', "\\\\", "\u5b00\u2200", 1, None, 2.5])
_JSON = st.recursive(
    _TRICKY,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(["k[", "v"]), inner, max_size=3)
    ),
    max_leaves=200,
)


def _nest(x: object, levels: int) -> object:
    for i in range(levels):
        x = [x] if i % 2 else {"k{": x}
    return x


@settings(max_examples=150, deadline=None)
@given(_JSON, st.integers(0, 80), st.sampled_from(["utf-8", "utf-16", "utf-32"]), st.booleans())
def test_the_byte_level_nesting_check_agrees_with_the_parsed_depth(
    inner: object, levels: int, encoding: str, ascii_only: bool
) -> None:
    data = _nest(inner, levels)
    raw = json.dumps(data, ensure_ascii=ascii_only).encode(encoding)
    assert read._too_deep(raw) == (_depth(data) > contract.MAX_NESTING)

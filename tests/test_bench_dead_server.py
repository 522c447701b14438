"""A load run against a server that is not there: every request failed, and the table, the
document and the exit status say so (no 0.00 ms latencies)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from parlab.cli import main


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])  # closed again when this returns: nobody listens


def test_every_request_failed_is_said_in_table_document_and_status(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    url = f"http://127.0.0.1:{_closed_port()}"
    with pytest.raises(SystemExit) as info:
        main(["bench", "serve", "--base-url", url, "--num-prompts", "4", "--model", "tiny",
              "--no-progress", "--results", str(tmp_path)])  # fmt: skip
    out, err = capsys.readouterr()
    assert info.value.code == 1
    assert "every request failed (4 of 4)" in err
    table = out[out.index("latency (ms)") :]
    assert "none measured" in table and "0.00" not in table
    [path] = list((tmp_path / "PAR-DISTRIBUTED-INFERENCE").glob("*.json"))
    doc = json.loads(path.read_text())
    assert doc["status"] == "failed" and doc["role"] == "failure"
    assert doc["metrics"]["completed"]["value"] == 0
    assert doc["metrics"]["mean_ttft_ms"]["value"] is None  # unknown, not 0 ms

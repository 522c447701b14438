"""The distributed-benchmark/v1 contract: round trip, schema, atomic write, results listing."""

from __future__ import annotations

import gc
import json
import os
from pathlib import Path

import jsonschema_rs
import pytest

from parlab import contract
from parlab.contract import Decision, Document, Failure, Metric, Prediction, validation
from parlab.contract import read as contract_read


def make_doc(**over) -> Document:
    fields = dict(
        run_id=contract.new_run_id("test"),
        created=contract.now_iso(),
        project="PAR-COLLECTIVES",
        task="T1",
        role="baseline",
        evidence_level="cpu-mechanism",
        command="parlab collectives -b 8 -e 1M",
        environment={
            "hardware": {"gpus": [], "gpu_count": 0, "cpu": {"count": 2}, "host_count": 1},
            "software": {"python": "3.11", "torch": "2.13", "parlab": "0.1.0"},
        },
        workload={"ops": ["all_reduce"]},
        layout={"world_size": 2, "mesh": {"dp": 2}, "strategy": None},
        metrics={
            "busbw_peak": Metric(value=1.5e9, unit="B/s"),
            "time": Metric(value=0.001, unit="s", per_rank=[0.001, 0.0009]),
            "mfu": Metric(value=None, unit="%"),
        },
        predictions={"time": Prediction(value=0.0011, unit="s", model="alpha-beta")},
    )
    fields.update(over)
    return Document(**fields)


def test_round_trip_and_schema(tmp_path: Path) -> None:
    doc = make_doc()
    path = contract.write_result(doc, tmp_path)
    assert path == tmp_path / "PAR-COLLECTIVES" / f"{doc.run_id}.json"
    data = json.loads(path.read_text())
    jsonschema_rs.validate(contract.schema(), data)
    back = contract.read_document(path)
    assert back == doc
    assert back.metric("mfu") is None
    assert back.metrics["time"].per_rank == [0.001, 0.0009]


def test_failure_and_decision_documents_validate(tmp_path: Path) -> None:
    fail = make_doc(
        role="failure",
        status="failed",
        failure=Failure(kind="oom", message="CUDA out of memory", rank=1),
    )
    dec = make_doc(
        role="decision",
        decision=Decision(
            chosen="fsdp", rejected=[{"candidate": "ddp", "reason": "OOM"}], rests_on=["a", "b"]
        ),
    )
    for d in (fail, dec):
        back = contract.read_document(contract.write_result(d, tmp_path))
        assert back == d


@pytest.mark.parametrize(
    "over, message",
    [
        ({"project": "PAR-NOPE"}, "project"),
        ({"role": "winner"}, "role"),
        ({"evidence_level": "vibes"}, "evidence_level"),
        ({"status": "failed"}, "failure"),
        ({"role": "failure"}, "status 'failed'"),
        ({"role": "decision"}, "decision"),
        ({"layout": {"mesh": {}}}, "world_size"),
    ],
)
def test_invalid_documents_are_refused(over: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        make_doc(**over)


def test_schema_refuses_what_dataclasses_cannot_see(tmp_path: Path) -> None:
    data = make_doc().to_json()
    data["metrics"]["x"] = {"value": "fast", "unit": "s"}
    with pytest.raises(ValueError, match='schema at metrics/x/value: "fast" is not of type'):
        contract.validate(data)
    data = make_doc().to_json()
    data["surprise"] = 1
    with pytest.raises(ValueError, match=r"schema at <root>: .*'surprise' was unexpected"):
        contract.validate(data)
    # one validator, built once, checks every document (the schema is not re-checked per call)
    assert validation._validator() is validation._validator()


def test_nan_is_never_written(tmp_path: Path) -> None:
    doc = make_doc(metrics={"x": Metric(value=float("nan"), unit="s")})
    with pytest.raises(ValueError):
        contract.write_result(doc, tmp_path)
    assert not list(tmp_path.rglob("*.json"))


def test_interrupted_write_leaves_no_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    doc = make_doc()

    def broken_fsync(fd: int) -> None:
        raise KeyboardInterrupt  # the process is interrupted between write and rename

    monkeypatch.setattr(os, "fsync", broken_fsync)
    with pytest.raises(KeyboardInterrupt):
        contract.write_result(doc, tmp_path)
    assert list(tmp_path.rglob("*")) == [
        tmp_path / "PAR-COLLECTIVES"
    ]  # folder only: no file, no temp


def test_overwrite_is_atomic(tmp_path: Path) -> None:
    target = tmp_path / "x.json"
    contract.atomic_write_text(target, "old")
    contract.atomic_write_text(target, "new")
    assert target.read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["x.json"]


def test_results_folder_skips_foreign_and_corrupt(tmp_path: Path) -> None:
    good = contract.write_result(make_doc(), tmp_path)
    (tmp_path / "PAR-COLLECTIVES" / "truncated.json").write_text(good.read_text()[:50])
    folder = tmp_path / "PAR-COLLECTIVES"
    (folder / "foreign.json").write_text(json.dumps({"hello": "world"}))
    (folder / "list.json").write_text("[1, 2]")
    wrong = make_doc().to_json()
    wrong["role"] = "winner"
    (folder / "wrong.json").write_text(json.dumps(wrong))
    (folder / "notes.txt").write_text("not json at all")
    entries, skipped = contract.read_results(tmp_path)
    assert [e.path for e in entries] == [good]
    reasons = {s.path.name: s.reason for s in skipped}
    assert set(reasons) == {"truncated.json", "foreign.json", "list.json", "wrong.json"}
    assert "corrupt JSON" in reasons["truncated.json"]
    assert "not a distributed-benchmark/v1" in reasons["foreign.json"]
    assert "role" in reasons["wrong.json"]


def _interrupted(path: Path) -> None:
    raise KeyboardInterrupt


def test_reading_leaves_the_collector_running_as_it_was(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = contract.write_result(make_doc(), tmp_path)
    (good.parent / ".hidden.json").write_text("{")
    (good.parent / "folder.json").mkdir()
    was = gc.isenabled()
    try:
        gc.enable()
        gc.unfreeze()
        entries, skipped = contract.read_results(tmp_path)
        assert gc.isenabled() and gc.get_freeze_count() == 0
        assert [e.path for e in entries] == [good]
        assert [s.path.name for s in skipped] == ["folder.json"]
        contract.read_results(tmp_path, freeze=True)
        assert gc.isenabled() and gc.get_freeze_count() > 0  # what is alive, frozen
        gc.unfreeze()
        gc.disable()
        contract.read_results(tmp_path, freeze=True)
        assert not gc.isenabled() and gc.get_freeze_count() == 0
        gc.enable()
        monkeypatch.setattr(contract_read, "read_document", _interrupted)
        with pytest.raises(KeyboardInterrupt):
            contract.read_results(tmp_path, freeze=True)
        assert gc.isenabled() and gc.get_freeze_count() == 0  # a failed read froze nothing
    finally:
        gc.unfreeze()
        (gc.enable if was else gc.disable)()


def test_missing_results_folder_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="does not exist"):
        contract.read_results(tmp_path / "nope")


def test_filters_and_headline(tmp_path: Path) -> None:
    a = make_doc()
    b = make_doc(project="PAR-ENV", role="candidate", evidence_level="env-precheck")
    for d in (a, b):
        contract.write_result(d, tmp_path)
    entries, _ = contract.read_results(tmp_path)
    assert [e.doc.run_id for e in contract.filter_entries(entries, project="PAR-ENV")] == [b.run_id]
    assert [e.doc.run_id for e in contract.filter_entries(entries, role="baseline")] == [a.run_id]
    assert len(contract.filter_entries(entries, level="cpu-mechanism")) == 1
    with pytest.raises(ValueError, match="unknown level"):
        contract.filter_entries(entries, level="nope")
    assert contract.headline(a) == ("busbw_peak", a.metrics["busbw_peak"])


def test_run_ids_are_unique_and_safe() -> None:
    ids = {contract.new_run_id("all reduce/sweep") for _ in range(200)}
    assert len(ids) == 200
    assert all("/" not in i and " " not in i for i in ids)


def test_a_folder_that_cannot_be_listed_holds_no_documents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    contract.write_result(make_doc(), tmp_path)

    def refuse(path: object) -> None:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(contract_read.os, "scandir", refuse)
    assert contract.read_results(tmp_path) == ([], [])

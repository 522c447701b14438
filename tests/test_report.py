"""``parlab report``: Markdown and self-contained HTML from contract documents alone."""

from __future__ import annotations

import base64
import re
from pathlib import Path
from typing import Any

import pytest

from parlab import contract
from parlab.contract import Document, Metric, Prediction
from parlab.plan.decide import decide
from parlab.report import build_report
from tests.test_decide import ENV_GPU, make_project

# the smallest valid PNG (1x1, transparent)
PNG_1x1 = base64.b64decode(
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="
)


def sweep_doc() -> Document:
    rows: list[dict[str, Any]] = [
        {"op": op, "size": s, "time_s": 1e-5 + s / 4e11, "busbw": s / (1e-5 + s / 4e11), "wrong": 0}
        for op in ("all_reduce", "all_gather")
        for s in (2**10, 2**20, 2**30)
    ]
    return Document(
        run_id=contract.new_run_id("collectives"),
        created="2026-01-01T00:00:10Z",
        project="PAR-COLLECTIVES",
        task="T1",
        role="baseline",
        evidence_level="real-nccl",
        command="parlab collectives --ops all_reduce,all_gather",
        environment=ENV_GPU,
        workload={"kind": "collectives-sweep", "measurements": rows},
        layout={"world_size": 2, "mesh": {"world": 2}, "strategy": None},
        metrics={
            "busbw_peak": Metric(value=3.9e11, unit="B/s"),
            "weird_new_metric": Metric(value=7.0, unit="widgets", per_rank=[6.0, 8.0]),
        },
        artifacts={"busbw_plot": "busbw.png", "raw": "raw.csv"},
    )


def serving_doc() -> Document:
    metrics = {
        f"{s}_{k}_ms": Metric(value=v, unit="ms")
        for k, base in (("ttft", 120.0), ("tpot", 12.0))
        for s, v in (("mean", base), ("median", base * 0.9), ("p99", base * 3))
    }
    metrics["output_throughput"] = Metric(value=5000.0, unit="tokens/s")
    return Document(
        run_id=contract.new_run_id("serve-bench"),
        created="2026-01-01T00:00:11Z",
        project="PAR-DISTRIBUTED-INFERENCE",
        task="T4",
        role="baseline",
        evidence_level="serving-benchmark",
        command="parlab serve-bench",
        environment=ENV_GPU,
        workload={"dataset": "random", "num_requests": 64},
        layout={"world_size": 1, "strategy": "serving"},
        metrics=metrics,
        predictions={"mean_ttft_ms": Prediction(value=100.0, unit="ms", model="sim:profile")},
    )


def populate(root: Path) -> dict[str, Document]:
    docs = dict(make_project(root))
    cpu = Document(
        run_id=contract.new_run_id("train-cpu"),
        created="2026-01-01T00:00:09Z",
        project="PAR-TRAINING-STATE",
        task="T2",
        role="candidate",
        evidence_level="cpu-mechanism",
        command="parlab train --strategy ddp",
        environment={**ENV_GPU, "hardware": {**ENV_GPU["hardware"], "gpus": [], "gpu_count": 0}},
        workload={"model": {"name": "tiny"}},
        layout={"world_size": 2, "mesh": {"dp": 2}, "strategy": "ddp"},
        metrics={"tokens_per_s_per_gpu": Metric(value=900.0, unit="tokens/s")},
    )
    contract.write_result(cpu, root)
    docs["cpu"] = cpu
    sweep = sweep_doc()
    path = contract.write_result(sweep, root)
    (path.parent / "busbw.png").write_bytes(PNG_1x1)
    (path.parent / "raw.csv").write_text("size,busbw\n")
    docs["sweep"] = sweep
    docs["serve"] = serving_doc()
    contract.write_result(docs["serve"], root)
    docs["decision"] = decide(root, project="PAR-TRAINING-STATE", command="parlab decide").doc
    (root / "PAR-COLLECTIVES" / "junk.json").write_text("[1, 2]")
    return docs


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Document], Any]:
    root = tmp_path_factory.mktemp("results")
    docs = populate(root)
    out = build_report(root)
    return root, docs, out


def test_report_holds_every_document_with_its_level(built: tuple) -> None:
    root, docs, out = built
    assert out.html == root / "report" / "report.html" and out.markdown.is_file()
    assert out.documents == len(docs) and out.skipped == 1
    html = out.html.read_text()
    md = out.markdown.read_text()
    for d in docs.values():
        for text in (html, md):
            assert d.run_id in text
        # the level sits beside the run id in the document's own heading
        assert re.search(re.escape(d.run_id) + r"[^\n]*" + re.escape(d.evidence_level), md)
    assert "junk.json" in md  # skipped files are listed with the reason
    assert "weird_new_metric" in md and "6 widgets, 8 widgets" in md  # unknown metrics, generically
    assert "failed (oom, rank 1)" in md and "CUDA out of memory on rank 1" in md
    assert f"Decision: chosen {docs['fsdp'].run_id}" in md


def test_report_figures_one_level_each_and_embedded(built: tuple) -> None:
    _, _, out = built
    html = out.html.read_text()
    titles = re.findall(r'<img alt="([^"]*)"', html)
    expect = [
        "PAR-TRAINING-STATE: tokens_per_s_per_gpu [real-training]",
        "PAR-TRAINING-STATE: tokens_per_s_per_gpu [cpu-mechanism]",
        "PAR-TRAINING-STATE: peak memory per rank [real-training]",
        "PAR-TRAINING-STATE: step_time [real-training]",
        "PAR-TRAINING-STATE: step_time predicted vs measured [real-training]",
        "PAR-TRAINING-STATE: peak_memory predicted vs measured [real-training]",
        "PAR-COLLECTIVES: busbw per message size [real-nccl]",
        "PAR-DISTRIBUTED-INFERENCE: TTFT and TPOT [serving-benchmark]",
        "PAR-DISTRIBUTED-INFERENCE: mean_ttft_ms predicted vs measured [serving-benchmark]",
    ]
    for t in expect:
        assert t in titles, t
    # every figure and artifact is a data URI that decodes to a PNG; nothing is fetched
    srcs = re.findall(r'<img [^>]*src="([^"]*)"', html)
    assert len(srcs) == out.figures + 1  # + the sweep's PNG artifact
    for src in srcs:
        assert src.startswith("data:image/png;base64,")
        assert base64.b64decode(src.split(",", 1)[1])[:8] == b"\x89PNG\r\n\x1a\n"
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert "raw.csv" in html  # non-image artifacts are listed
    # every figure caption names its evidence level
    for cap in re.findall(r"<figcaption>(.*?)</figcaption>", html):
        assert re.search(r"[Ee]vidence level: [a-z-]+", cap), cap
    # Markdown references PNG files written beside it
    md = out.markdown.read_text()
    for name in re.findall(r"!\[[^\]]*\]\(([^)]+)\)", md):
        assert (out.markdown.parent / name).read_bytes()[:4] == b"\x89PNG"


def test_prediction_table_shows_the_error(built: tuple) -> None:
    _, docs, out = built
    md = out.markdown.read_text()
    # (0.75 - 0.71) / 0.71 = +5.6 %, at the level of the measurement
    row = next(
        line for line in md.splitlines() if line.startswith(f"| {docs['fsdp'].run_id} | real")
    )
    assert "step_time" in row and "+5.6 %" in row and "plan" in row


def test_empty_and_missing_folders(tmp_path: Path) -> None:
    out = build_report(tmp_path, tmp_path / "r")
    assert out.documents == 0 and "No documents" in out.markdown.read_text()
    with pytest.raises(ValueError, match="does not exist"):
        build_report(tmp_path / "missing")

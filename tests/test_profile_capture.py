"""parlab profile on real traces: 2 gloo ranks train the reference model under torch.profiler
(DDP, FSDP2, TP presets and a user script through the runner), then the analysis, the
document and the merged trace are checked against what the model says must cross the wire."""

from __future__ import annotations

import gzip
import json
import os
import textwrap
from pathlib import Path
from typing import Any

import pytest

from parlab.cli import main as cli_main
from parlab.contract import read_document
from parlab.profile.analyze import analyze_folder
from parlab.profile.capture import ENV_DIR, ENV_SCHEDULE, Profiler, maybe_profile
from parlab.profile.presets import ddp_rank, fsdp_rank, tp_rank
from parlab.profile.report import profile_folder
from parlab.profile.summary import summarize
from parlab.profile.sweep import predict_wire
from parlab.profile.trace_reader import read_header
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(120)
SCHED = [1, 1, 2]


def grad_bytes(model: str = "tiny") -> int:
    from parlab.models import get_spec
    from parlab.models.reference import build_model

    net = build_model(get_spec(model), device="meta")
    return sum(p.numel() * 4 for p in net.parameters())


@pytest.fixture(scope="module")
def ddp_traces(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("ddp")
    res = run_ranks(
        ddp_rank,
        2,
        model="tiny",
        batch=2,
        seq=32,
        buckets_mb=[0.01, 25.0],
        out_dir=str(out),
        schedule=SCHED,
        run_id="t-ddp",
    )
    return res[0]


def test_each_rank_writes_a_trace_with_its_rank(ddp_traces: list[dict[str, Any]]) -> None:
    for cfg in ddp_traces:
        for rank in (0, 1):
            meta = read_header(Path(cfg["dir"]) / f"rank{rank}.trace.json.gz")
            assert meta["distributedInfo"]["rank"] == rank
            assert meta["distributedInfo"]["world_size"] == 2
            assert meta["parlab"]["run_id"] == f"t-ddp-{cfg['label']}"


def test_ddp_all_reduce_payload_is_the_gradient(ddp_traces: list[dict[str, Any]]) -> None:
    small, big = (analyze_folder(c["dir"]) for c in ddp_traces)
    want = grad_bytes()
    counts = []
    for run in (small, big):
        assert [r.rank for r in run.ranks] == [0, 1] and not run.problems
        for r in run.ranks:
            assert r.device == "cpu" and r.backend == "gloo"
            assert [s.step for s in r.steps] == [2, 3]  # steps 0-1: wait, warm-up
            names = {c.name for c in r.collectives}
            assert names == {"all_reduce"}
            for s in r.steps:
                assert s.comm_bytes == want  # every gradient, all-reduced once per step
                assert 0 <= s.overlap_s <= s.comm_s
                assert s.exposed_s == pytest.approx(s.comm_s - s.overlap_s)
                assert s.compute_s > 0 and s.window_s > 0
            counts.append(r.steps[0].comm_count)
    # smaller buckets: more, smaller all-reduces
    assert counts[0] > counts[2] and counts[2] == 1
    # the ledger's wire table says the same bytes (it owns the formula)
    preds, why = predict_wire(
        "ddp-buckets", {"bucket_cap_mb": 25.0}, model="tiny", batch=2, seq=32, nproc=2, gpu=False
    )
    assert why is None and preds["comm_bytes_per_step"].value == want
    assert preds["comm_count_per_step"].value == 1


def test_document_and_artifacts(ddp_traces: list[dict[str, Any]], tmp_path: Path) -> None:
    o = profile_folder(ddp_traces[0]["dir"], results=tmp_path, command="parlab profile analyze x")
    doc = read_document(o.path)  # validates against the schema where jsonschema_rs is installed
    assert doc.task == "T5" and doc.evidence_level == "cpu-mechanism"
    assert doc.project == "PAR-TRAINING-STATE"
    m = doc.metrics
    assert m["ranks_analysed"].value == 2 and m["ranks_missing"].value == 0
    assert len(m["overlap_fraction"].per_rank or []) == 2
    assert m["comm_bytes_per_step"].value == grad_bytes()
    assert 0 <= m["exposed_comm_fraction"].value <= 100
    for rel in doc.artifacts.values():
        assert (o.path.parent / rel).is_file()
    merged = json.loads(
        gzip.decompress((o.path.parent / doc.artifacts["merged_trace"]).read_bytes())
    )
    evs = merged["traceEvents"]
    assert {e["pid"] for e in evs} == {0, 1}
    names = {e["args"]["name"] for e in evs if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    assert any(e["name"] == "thread_name" for e in evs)
    assert sum(1 for e in evs if e.get("name", "").startswith("gloo:")) >= 4
    text = (o.path.parent / doc.artifacts["hotspots"]).read_text()
    assert "all_reduce" in text and "try:" in text


def test_fsdp_gathers_params_and_scatters_grads(tmp_path: Path) -> None:
    res = run_ranks(
        fsdp_rank,
        2,
        model="tiny",
        batch=2,
        seq=32,
        configs=[{"prefetch": True, "reshard_after_forward": True}],
        out_dir=str(tmp_path),
        schedule=SCHED,
        run_id="t-fsdp",
    )
    run = analyze_folder(res[0][0]["dir"])
    names = {c.name for r in run.ranks for c in r.collectives}
    assert {"all_gather", "reduce_scatter"} <= names


def test_tp_sequence_parallel_changes_the_collectives(tmp_path: Path) -> None:
    res = run_ranks(
        tp_rank,
        2,
        model="tiny",
        batch=2,
        seq=32,
        sequence_parallel=[False, True],
        out_dir=str(tmp_path),
        schedule=SCHED,
        run_id="t-tp",
    )
    plain, sp = (analyze_folder(c["dir"]) for c in res[0])
    plain_names = {c.name for c in plain.ranks[0].collectives}
    sp_names = {c.name for c in sp.ranks[0].collectives}
    assert "all_reduce" in plain_names and "reduce_scatter" not in plain_names
    assert {"all_gather", "reduce_scatter"} <= sp_names


SCRIPT = """
import torch, torch.distributed as dist
assert dist.is_initialized()
torch.manual_seed(0)
net = torch.nn.Linear(16, 16)
ddp = torch.nn.parallel.DistributedDataParallel(net)
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
for _ in range(5):
    ddp(torch.randn(4, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
"""


def _run_script(ctx: Any, script: str, out: str) -> bool:
    from parlab.profile import runner

    os.environ[ENV_DIR] = out
    os.environ[ENV_SCHEDULE] = "1,1,2"
    os.environ["RANK"] = str(ctx.rank)
    os.environ["WORLD_SIZE"] = str(ctx.world_size)
    return runner.main([script]) == 0


def test_runner_profiles_an_unchanged_script(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    out = tmp_path / "traces"
    assert run_ranks(_run_script, 2, str(script), str(out)) == [True, True]
    run = analyze_folder(out)
    assert [r.rank for r in run.ranks] == [0, 1]
    s = summarize(run)
    assert s.steps == [2, 3]
    assert s.comm_bytes == [(16 * 16 + 16) * 4] * 2


def _train_rank_profiled(ctx: Any, out: str) -> list[str]:
    from parlab.projects.training_state import TrainConfig, train_rank

    os.environ[ENV_DIR] = out
    os.environ[ENV_SCHEDULE] = "1,1,2"
    cfg = TrainConfig(strategy="fsdp", model="tiny", seq=32, warmup=2, steps=2)
    train_rank(ctx, **cfg.to_json())
    return sorted(p.name for p in Path(out).iterdir())


def test_parlab_train_loop_profiles_under_parlab_profile_run(tmp_path: Path) -> None:
    """``parlab profile run -- parlab train ...``: the training loop steps the profiler, so
    every rank writes its trace, and the analysis sees the profiled steps."""
    out = tmp_path / "traces"
    names = run_ranks(_train_rank_profiled, 2, str(out), timeout=120)
    assert names[0] == ["rank0.trace.json.gz", "rank1.trace.json.gz"]
    s = summarize(analyze_folder(out))
    assert s.steps == [2, 3]
    assert s.comm_bytes[0] > 0  # FSDP's all-gathers and reduce-scatters were recorded


def test_maybe_profile_is_a_no_op_without_the_variable(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_DIR, raising=False)
    with maybe_profile(None) as prof:
        prof.step()
    assert not prof.done
    with pytest.raises(ValueError, match="wait,warmup,active"):
        Profiler(None, "/tmp/x", active=0)


def _exit_code(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    with pytest.raises(SystemExit) as exc:
        cli_main(argv)
    return int(exc.value.code or 0), capsys.readouterr().err


def test_cli_analyze_and_bad_input(
    ddp_traces: list[dict[str, Any]], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    folder = Path(ddp_traces[1]["dir"])
    code, _ = _exit_code(["profile", "analyze", str(folder), "--results", str(tmp_path)], capsys)
    assert code == 0
    assert list((tmp_path / "PAR-TRAINING-STATE").glob("*.json"))
    code, err = _exit_code(
        [
            "profile",
            "analyze",
            str(folder),
            "--timeline-step",
            "99",
            "--results",
            str(tmp_path / "r"),
        ],
        capsys,
    )
    assert code == 2 and "--timeline-step 99" in err and not (tmp_path / "r").exists()
    code, err = _exit_code(["profile", "analyze", str(tmp_path / "nope")], capsys)
    assert code == 2 and "does not exist" in err
    code, err = _exit_code(["profile", "fsdp", "--configs", "bogus"], capsys)
    assert code == 2 and "--configs" in err
    code, err = _exit_code(["profile", "run"], capsys)
    assert code == 2 and "nothing to profile" in err
    code, err = _exit_code(["profile", "ddp-buckets", "--buckets", "0,x"], capsys)
    assert code == 2 and "--buckets" in err

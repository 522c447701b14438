"""parlab fit / parlab ledger: the search, the documents, the exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from parlab import contract
from parlab.cli import main
from parlab.hardware.catalog import require
from parlab.ledger.fit import fit, layouts
from parlab.models import get_spec


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    out, err = capsys.readouterr()
    return int(exc.value.code or 0), out, err


def test_small_model_fits_one_gpu() -> None:
    res = fit(get_spec("1.3b"), gpu=require("H100"), seq_len=2048)
    assert res.single_fits and not res.candidates


def test_big_model_gets_fitting_candidates() -> None:
    gpu = require("H100")
    res = fit(get_spec("llama3.1-70b"), gpu=gpu, seq_len=4096, overhead_bytes=2**30)
    assert not res.single_fits
    assert res.world_size is not None and res.world_size > 1
    assert res.candidates and all(c.ledger.peak_bytes <= gpu.memory_bytes for c in res.candidates)
    assert all(c.ledger.topology.world_size == res.world_size for c in res.candidates)
    keys = [c.blocking_per_microbatch for c in res.candidates]
    assert keys == sorted(keys)
    # nothing fits on fewer GPUs: the search stops at the first world size that works
    smaller = fit(get_spec("llama3.1-70b"), gpu=gpu, gpus=res.world_size // 2, seq_len=4096,
                  overhead_bytes=2**30)  # fmt: skip
    assert not smaller.candidates
    fams = res.best_per_family()
    assert len({c.family for c in fams}) == len(fams)
    for c in fams[:2]:
        assert c.sync_points()


def test_layout_space_respects_the_model() -> None:
    spec = get_spec("llama3.1-405b")  # 126 layers, 128 heads
    for topo, strategy, shard in layouts(spec, 64, seq_len=4096):
        assert spec.layers % topo.pp == 0 and spec.heads % topo.tp == 0 and topo.tp <= 8
        assert topo.world_size == 64
        if strategy == "fsdp-hybrid":
            assert shard is not None and topo.dp % shard == 0


def test_fit_cli_writes_an_analytic_t0_document(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = _run(["fit", "llama3.1-8b", "--gpus", "H100", "--seq", "4096", "--json",
                         "--results", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0
    data = json.loads(out)
    doc = contract.Document.from_json(data)
    assert (doc.project, doc.task, doc.evidence_level) == ("PAR-TRAINING-STATE", "T0", "analytic")
    assert doc.metric("single_gpu_fits") == 0
    assert doc.metric("min_gpus") and doc.metric("min_gpus") > 1
    assert doc.layout["candidates"][0]["sync_points"]
    files = list((tmp_path / "PAR-TRAINING-STATE").glob("*.json"))
    assert len(files) == 1
    contract.read_document(files[0])
    code, out, _ = _run(["fit", "tiny", "--gpus", "H200", "--results", str(tmp_path)], capsys)
    assert code == 0 and out.startswith("fits on one H200")  # the verdict first


def test_ledger_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["ledger", "llama2-7b", "--strategy", "zero2", "--dp", "8", "--seq", "2048",
                         "--json", "--results", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0
    doc = contract.Document.from_json(json.loads(out))
    assert doc.task == "T2" and doc.layout["world_size"] == 8
    assert len(doc.metrics["peak_memory"].per_rank) == 8
    assert any(w["collective"] == "reduce-scatter" for w in doc.layout["wire"])
    code, out, _ = _run(["ledger", "llama2-7b", "--pp", "4", "--tp", "2", "--sp", "--micro-batches",
                         "8", "--results", str(tmp_path)], capsys)  # fmt: skip
    assert code == 0 and "stage 3" in out and "send-recv" in out


@pytest.mark.parametrize(
    "argv, words",
    [
        (["fit", "llama9-1t"], "unknown model"),
        (["fit", "tiny", "--gpus", "V99"], "unknown GPU"),
        (["fit", "tiny", "--gpus", "8xV99"], "unknown GPU"),
        (["fit", "tiny", "--gpus", "0xH100"], "--gpus 0 is out of range"),
        (["fit", "tiny", "--gpu", "H100"], "--gpu is now --gpus"),
        (["fit", "tiny", "--micro-batch", "0"], "--micro-batch"),
        (["fit", "tiny", "--batch", "2"], "--batch is now --micro-batch"),
        (["fit", "tiny", "--seq", "-3"], "--seq"),
        (["fit", "tiny", "--dtype", "fp8"], "dtype"),
        (["fit", "tiny", "--dtype", "bf16-mixed"], "bf16-mixed is now bf16-compute"),
        (["fit", "tiny", "--dtype", "bf16-master"], "bf16-master is now bf16-params"),
        (["ledger", "tiny", "--dtype", "bf16"], "use bf16-compute"),
        (["ledger", "tiny", "--virtual-stages", "2"], "--virtual-stages is now --vpp"),
        (["ledger", "tiny", "--microbatches", "2"], "--microbatches is now --micro-batches"),
        (["ledger", "tiny", "--dp", "2", "--gpus", "4xH100"], "the layout has 2 ranks"),
        (["ledger", "llama3.1-8b", "--tp", "3"], "heads"),
        (["ledger", "llama3.1-8b", "--pp", "33"], "layers"),
        (["ledger", "llama3.1-8b", "--strategy", "zero9"], "strategy"),
        (["ledger", "llama3.1-8b", "--dp", "0"], "dp"),
        (["ledger", "tiny", "--overhead", "lots"], "--overhead"),
        (["ledger", "llama3.1-70b", "--tp", "16", "--no-kv-replicate"], "kv_heads"),
    ],
)
def test_bad_input_exits_2_and_writes_nothing(
    argv: list[str], words: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, _, err = _run([*argv, "--results", str(tmp_path)], capsys)
    assert code == 2
    assert words in err and len(err.strip().splitlines()) == 1
    assert not list(tmp_path.rglob("*.json"))


def test_demo_step(tmp_path: Path) -> None:
    from rich.console import Console

    from parlab.cli.fit import demo_step

    demo_step(tmp_path, Console(file=open("/dev/null", "w")))  # noqa: SIM115
    (doc,) = [contract.read_document(p) for p in tmp_path.rglob("*.json")]
    assert doc.task == "T0" and doc.metric("single_gpu_fits") == 0


def test_models_lists_the_catalog(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(["models", "--json"], capsys)
    rows = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and rows["llama3.1-405b"]["params"] == 405_853_388_800

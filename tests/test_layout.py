"""The analytic layout: rank groups as Megatron lists them, holdings, the constraint table, CLI."""

from __future__ import annotations

import json

import pytest

from parlab.cli import main
from parlab.layout import LayoutError, ModelShape, constraints, describe, model_shape

L8B = ModelShape(name="8b", layers=32, heads=32, kv_heads=8, hidden=4096, ffn=14336, vocab=128256)


def test_groups_match_megatron_docstring_example() -> None:
    # Megatron's initialize_model_parallel docstring: 16 GPUs, tp 2, pp 4 (so dp 2)
    d = describe(world=16, degrees={"tp": 2, "pp": 4, "dp": 2}, shape=L8B)
    assert d["groups"]["tp"][:3] == [[0, 1], [2, 3], [4, 5]]
    assert d["groups"]["dp"][:4] == [[0, 2], [1, 3], [4, 6], [5, 7]]
    assert d["groups"]["pp"][:2] == [[0, 4, 8, 12], [1, 5, 9, 13]]


def test_holdings_cut_layers_heads_ffn_vocab_and_sequence() -> None:
    d = describe(world=16, degrees={"dp": 2, "tp": 4, "pp": 2}, shape=L8B, gpus_per_node=8)
    h = {x["rank"]: x for x in d["holdings"]}
    assert h[0]["layers"] == [[0, 15]] and h[9]["layers"] == [[16, 31]]
    assert h[5]["heads"] == [8, 15] and h[5]["kv_heads"] == [2, 3]
    assert h[3]["ffn_columns"] == [10752, 14335] and h[3]["vocab_rows"] == [96192, 128255]
    assert h[0]["embedding"] and not h[8]["embedding"] and h[8]["output_head"]
    assert all(r["node"] == r["rank"] // 8 for r in d["ranks"])
    cp = describe(world=4, degrees={"cp": 4}, shape=L8B, seq=8192)
    assert [x["seq_chunks"] for x in cp["holdings"]] == [[0, 7], [1, 6], [2, 5], [3, 4]]
    assert cp["holdings"][1]["seq_tokens"] == [[1024, 2047], [6144, 7167]]


def test_interleaved_stages() -> None:
    d = describe(world=2, degrees={"pp": 2}, shape=L8B, vpp=2)
    assert d["holdings"][0]["stages"] == [0, 2]
    assert d["holdings"][0]["layers"] == [[0, 7], [16, 23]]


@pytest.mark.parametrize(
    ("degrees", "kw", "rule"),
    [
        ({"tp": 3, "dp": 1}, {}, "heads % tp == 0"),
        ({"pp": 33}, {}, "layers >= pp*vpp (a layer per chunk)"),
        ({"cp": 2}, {"seq": 1002}, "seq % (2*cp) == 0"),
        ({"tp": 2, "dp": 4}, {}, "world == pp*dp*cp*tp"),
        ({"tp": 16}, {"gpus_per_node": 8}, "tp <= gpus per node"),
        ({"dp": 2, "ep": 4}, {}, "ep divides dp"),
    ],
)
def test_constraint_rows_fail_with_reason(degrees: dict, kw: dict, rule: str) -> None:
    world = 1
    for a in ("dp", "tp", "pp", "cp"):
        world *= degrees.get(a, 1)
    if rule == "world == pp*dp*cp*tp":
        world = 16
    with pytest.raises(LayoutError) as exc:
        describe(world=world, degrees=degrees, shape=L8B, **kw)
    assert rule in [r.name for r in exc.value.failing]
    assert rule in str(exc.value)


def test_cli_json_and_bad_layout_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert model_shape("llama3.1-8b").kv_heads == 8
    with pytest.raises(SystemExit) as ok:
        main(["layout", "--world", "16", "--dp", "2", "--tp", "4", "--pp", "2", "--json"])
    assert ok.value.code == 0
    data = json.loads(capsys.readouterr().out)
    assert data["valid"] and data["mesh"] == {"pp": 2, "dp": 2, "cp": 1, "tp": 4, "ep": 1}
    with pytest.raises(SystemExit) as bad:
        main(["layout", "--world", "24", "--tp", "24", "--model", "llama3.1-8b"])
    assert bad.value.code == 2
    err = capsys.readouterr().err
    assert "heads % tp == 0" in err and "heads = 32 is not divisible by tp = 24" in err


def test_fewer_kv_heads_than_tp_ranks_keep_one_replicated_kv_head_each() -> None:
    shape = model_shape("llama3.1-8b")  # 8 KV heads
    rows = constraints(world=16, degrees={"tp": 16}, shape=shape)
    kv = next(r for r in rows if r.name == "kv_heads vs tp")
    assert kv.ok and "one replicated KV head per rank" in kv.detail

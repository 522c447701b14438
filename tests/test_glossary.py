"""The glossary: one source of truth for ``parlab explain`` and ``docs/glossary.md``."""

from __future__ import annotations

from pathlib import Path

import pytest

from parlab.errors import UsageError
from parlab.glossary import TERMS, lookup, render_markdown

ROOT = Path(__file__).resolve().parents[1]


def test_markdown_is_generated_from_the_data() -> None:
    assert (ROOT / "docs" / "glossary.md").read_text() == render_markdown(), (
        "docs/glossary.md drifted: run `python -m parlab.glossary > docs/glossary.md`"
    )


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("ZeRO-1", "ZeRO"), ("zero3", "ZeRO"), ("SHARD_GRAD_OP", "FSDP"),
        ("full_shard", "FSDP"), ("HYBRID_SHARD", "FSDP"), ("hsdp", "FSDP"),
        ("Megatron distributed optimizer", "distributed optimizer"), ("algbw", "algbw"),
        ("BusBW", "busbw"), ("tensor parallel", "TP"), ("sequence parallel", "SP"),
        ("ulysses", "CP"), ("ring attention", "CP"), ("EP", "EP"),
        ("capacity factor", "capacity factor"), ("bubble", "bubble"), ("ttft", "TTFT"),
        ("TPOT", "TPOT"), ("itl", "ITL"), ("goodput", "goodput"), ("MFU", "MFU"),
        ("overlap", "overlap"), ("exposed comm", "exposed communication"),
        ("TORCH_NCCL_TRACE_BUFFER_SIZE", "flight recorder"),
    ],
)  # fmt: skip
def test_lookup_by_name_and_alias(query: str, name: str) -> None:
    assert lookup(query).name == name


def test_unknown_term_suggests_close_matches() -> None:
    with pytest.raises(UsageError, match="did you mean bubble"):
        lookup("bubbel")
    with pytest.raises(UsageError, match="unknown term"):
        lookup("qwertyuiop")


def test_every_term_names_a_real_parlab_command() -> None:
    from parlab.cli import app

    commands = {c.name for c in app.registered_commands} | {g.name for g in app.registered_groups}
    for t in TERMS:
        for part in t.measure.split(";"):
            words = part.split()
            assert words[0] == "parlab", (t.name, part)
            assert words[1] in commands, (t.name, part)


def test_aliases_are_unambiguous() -> None:
    from parlab.glossary import _key

    seen: dict[str, str] = {}
    for t in TERMS:
        for k in (t.name, *t.aliases):
            assert seen.setdefault(_key(k), t.name) == t.name, k


@pytest.mark.parametrize(
    ("query", "name"),
    [
        ("ledger", "ledger"), ("roofline", "roofline"), ("pareto", "Pareto front"),
        ("sync points", "sync points"), ("kv cache", "KV cache"), ("prefill", "prefill and decode"),
        ("decode", "prefill and decode"), ("continuous batching", "continuous batching"),
        ("PagedAttention", "paged attention"),
    ],
)  # fmt: skip
def test_parlabs_own_words_and_serving_basics_have_a_formula(query: str, name: str) -> None:
    t = lookup(query)
    assert t.name == name and t.formula and t.measure.startswith("parlab ")


def test_explain_prints_the_formula(capsys: pytest.CaptureFixture[str]) -> None:
    from parlab.cli import main

    with pytest.raises(SystemExit) as info:
        main(["explain", "kv cache"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert "formula: KV bytes per token = 2 (K and V) x layers x KV heads" in " ".join(out.split())
    assert "**Formula:** KV bytes per token" in render_markdown()

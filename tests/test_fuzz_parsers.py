"""Fuzzing every command's size, count, layout, cluster and dtype parsers: each input gives a
value or the project's one-line usage error, never a traceback.

Three levels: the parsers themselves; every option of every command through click's parsing
(what ``parlab CMD --opt VALUE`` does before anything runs); and the formula-only commands
run to the end on fuzzed values."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import click
import pytest
import typer
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from parlab import dtypes, units
from parlab.cli import app, main
from parlab.cli.examples import EXAMPLES, add_examples, commands
from parlab.errors import UsageError

ROOT = typer.main.get_command(app)
add_examples(ROOT)

SPECIAL = [
    "", " ", "0", "-1", "1", "8", "+3", "007", "1.5", "1e3", "1e999", "nan", "inf", "-inf",
    "9" * 25, "9" * 400, "²", "①", "٣", "８", "8G", "1.5GiB", "64 KiB", "2 parsecs", "8xH100",
    "64xH100", "0xH100", "H100", "8*H200", "x", "dp=2,tp=4", "dp=²", "dp=①", "dp=2,dp=2",
    "pp=0", "tp=99999999999999999999999", "bf16", "bf16-mixed", "bf16-master", "bf16-compute",
    "fp32", "half", "bfloat16", "[/b]", "\x00", "a" * 300,
]  # fmt: skip
TEXT = st.one_of(
    st.sampled_from(SPECIAL),
    st.text(max_size=24),
    st.from_regex(r"[0-9²①٣.,=xX* a-zA-Z+-]{0,16}", fullmatch=True),
    st.integers(min_value=-(2**70), max_value=2**70).map(str),
)
FAST = settings(max_examples=200, deadline=None)


def _one_line_usage(fn, text: str) -> None:  # type: ignore[no-untyped-def]
    try:
        fn(text)
    except UsageError as exc:
        assert "\n" not in str(exc) and len(str(exc)) < 400, str(exc)


@FAST
@given(TEXT)
def test_size_parser(text: str) -> None:
    _one_line_usage(lambda t: units.parse_size(t, "--size"), text)


@FAST
@given(TEXT)
def test_count_parser(text: str) -> None:
    _one_line_usage(lambda t: units.parse_count(t, "--n"), text)


@FAST
@given(TEXT)
def test_seconds_parser(text: str) -> None:
    _one_line_usage(units.parse_seconds, text)


@FAST
@given(TEXT)
def test_cluster_parser(text: str) -> None:
    _one_line_usage(units.parse_cluster, text)
    _one_line_usage(lambda t: units.parse_cluster(t, count=False), text)


@FAST
@given(TEXT)
def test_layout_and_mesh_parsers(text: str) -> None:
    from parlab.comm.explain import parse_layout
    from parlab.comm.sweep import parse_mesh

    _one_line_usage(parse_layout, text)
    _one_line_usage(parse_mesh, text)


@FAST
@given(TEXT)
def test_dtype_parsers(text: str) -> None:
    from parlab.ledger import dtype_policy

    _one_line_usage(dtypes.check_recipe, text)
    _one_line_usage(lambda t: dtypes.check_recipe(t, dtypes.TENSOR_DTYPES, "--tensor-dtype"), text)
    _one_line_usage(dtype_policy, text)


@FAST
@given(TEXT)
def test_model_names(text: str) -> None:
    from parlab.models import get_spec

    if "\x00" not in text:  # a NUL in a path: the OS refuses it before parlab sees it
        _one_line_usage(get_spec, text)


JSON_VALUE = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=8)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=4), inner, max_size=3)),
    max_leaves=6,
)  # fmt: skip


@settings(
    max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.dictionaries(st.sampled_from(["hidden_size", "num_hidden_layers", "num_attention_heads",
       "vocab_size", "intermediate_size", "num_key_value_heads", "head_dim", "rope_theta",
       "max_position_embeddings", "model_type", "num_local_experts", "num_experts_per_tok"]),
       JSON_VALUE, max_size=12))  # fmt: skip
def test_hf_config_values(tmp_path: Path, cfg: dict) -> None:
    from parlab.models.hf import load_hf_config

    base = {"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
            "num_attention_heads": 4, "vocab_size": 128, "intermediate_size": 128}  # fmt: skip
    path = tmp_path / "config.json"
    path.write_text(json.dumps({**base, **cfg}))
    _one_line_usage(load_hf_config, str(path))


# --- every option of every command, through click's parsing --------------------------------

VALUED = [
    (path, p.opts[0])
    for path, cmd in sorted(commands(ROOT).items())
    if not isinstance(cmd, click.Group)
    for p in cmd.params
    if isinstance(p, click.Option) and not p.is_flag and p.opts[0] != "--help"
]


def _context(path: str, extra: list[str]) -> None:
    """Parse ``EXAMPLES[path][0] + extra`` as the command would, without running it."""
    words = shlex.split(EXAMPLES[path][0])[1:]
    cmd: click.Command = ROOT
    while isinstance(cmd, click.Group):
        cmd = cmd.commands[words.pop(0)]
    before = words[: words.index("--")] if "--" in words else words
    after = words[len(before) :]
    try:
        cmd.make_context(path.split()[-1], [*before, *extra, *after])
    except click.ClickException as exc:
        assert exc.exit_code == 2 and "\n" not in " ".join(exc.format_message().split())
    except UsageError as exc:  # an option callback's check
        assert "\n" not in str(exc)


@pytest.mark.parametrize("path, opt", VALUED, ids=[f"{p}:{o}" for p, o in VALUED])
@settings(max_examples=12, deadline=None)
@given(value=TEXT)
def test_every_option_parses_or_refuses_in_one_line(path: str, opt: str, value: str) -> None:
    assume("\x00" not in value)  # a command line cannot hold a NUL
    _context(path, [opt, value])


# --- the formula-only commands, run to the end ---------------------------------------------

RUNS = [
    ("fit", ["fit", "tiny", "--gpus", "{v}"]),
    ("fit", ["fit", "tiny", "--overhead", "{v}"]),
    ("fit", ["fit", "tiny", "--dtype", "{v}"]),
    ("fit", ["fit", "tiny", "--micro-batch", "{v}", "--max-gpus", "8"]),
    ("ledger", ["ledger", "tiny", "--gpus", "{v}"]),
    ("ledger", ["ledger", "tiny", "--dp", "{v}"]),
    ("ledger", ["ledger", "tiny", "--overhead", "{v}"]),
    ("ledger", ["ledger", "tiny", "--dtype", "{v}"]),
    ("collectives", ["collectives", "--explain", "tiny", "--layout", "{v}", "--gpus", "H100"]),
    ("collectives", ["collectives", "--explain", "tiny", "--layout", "dp=2", "--gpus", "{v}"]),
]


@pytest.mark.parametrize("name, template", RUNS, ids=[" ".join(t) for _, t in RUNS])
@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(value=TEXT)
def test_formula_only_commands_end_with_a_value_or_one_line(
    name: str, template: list[str], value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assume("\x00" not in value)  # a command line cannot hold a NUL
    args = [value if a == "{v}" else a for a in template]
    args += ["--results", str(tmp_path)]
    with pytest.raises(SystemExit) as info:
        main(args)
    err = capsys.readouterr().err
    assert info.value.code in (0, 1, 2, None), err  # 3 would be an internal error
    assert "Traceback" not in err
    if info.value.code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("parlab: error:"), err

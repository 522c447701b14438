"""The CLI speaks one vocabulary (docs/cli.md): every --help opens with examples that parse,
retired spellings answer with the new one, hints name only options that exist, and the
formula-only commands start without torch or matplotlib."""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
from pathlib import Path

import click
import pytest
import typer

import parlab
from parlab.cli import app, main
from parlab.cli.examples import EXAMPLES, RETIRED_FLAGS, add_examples, commands

ROOT = typer.main.get_command(app)
add_examples(ROOT)
SRC = Path(__file__).parents[1] / "src" / "parlab"


def run_cli(args: list[str]) -> int:
    with pytest.raises(SystemExit) as info:
        main(args)
    return int(info.value.code or 0)


def _options() -> set[str]:
    out = {"--help", "--version"}
    for cmd in commands(ROOT).values():
        for p in cmd.params:
            out.update(getattr(p, "opts", []))
            out.update(getattr(p, "secondary_opts", []))
    return out


def parse_example(example: str) -> click.Context:
    """Parse an example as its command would (types, choices, retired-name checks), without
    running it."""
    words = shlex.split(example)
    assert words[0] == "parlab"
    cmd: click.Command = ROOT
    rest = words[1:]
    name = "parlab"
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        name, rest = rest[0], rest[1:]
        cmd = cmd.commands[name]
    if isinstance(cmd, click.Group):  # a group's example names a sub-command's options
        return parse_example(example)
    return cmd.make_context(name, rest)


def test_every_command_has_examples_and_its_help_opens_with_them() -> None:
    cmds = commands(ROOT)
    assert set(cmds) == set(EXAMPLES)
    for path, cmd in cmds.items():
        assert cmd.help.startswith("Examples:\n"), path
        for e in EXAMPLES[path]:
            assert e in cmd.help, path


@pytest.mark.parametrize(
    "example", [e for path in sorted(EXAMPLES) for e in EXAMPLES[path] if " " in e]
)
def test_every_example_parses(example: str) -> None:
    words = shlex.split(example)
    assert not set(words) & set(RETIRED_FLAGS), example
    if (words[1] in ("project", "profile", "serve", "bench") and len(words) > 2) or words[
        1
    ] not in ("project", "profile", "serve", "bench"):
        parse_example(example)


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(["--version"]) == 0
    assert capsys.readouterr().out.strip() == f"parlab {parlab.__version__}"


def test_choices_are_typed_so_help_lists_them() -> None:
    fit = commands(ROOT)["fit"]
    dtype = next(p for p in fit.params if p.name == "dtype")
    assert list(dtype.type.choices) == ["fp32", "bf16-compute", "bf16-params", "bf16-all"]
    train = commands(ROOT)["train"]
    strategy = next(p for p in train.params if p.name == "strategy")
    from parlab.cli.train import STRATEGY_CHOICES
    from parlab.projects.training_state import STRATEGIES

    assert tuple(strategy.type.choices) == STRATEGY_CHOICES == STRATEGIES


@pytest.mark.parametrize(
    "args, fragment",
    [
        (["fit", "tiny", "--batch", "2"], "--batch is now --micro-batch"),
        (["ledger", "tiny", "--batch", "2"], "--batch is now --micro-batch"),
        (["profile", "ddp", "--batch", "2"], "--batch is now --micro-batch"),
        (["ledger", "tiny", "--microbatches", "4"], "--microbatches is now --micro-batches"),
        (["collectives", "--explain", "tiny", "--microbatches", "4"], "is now --micro-batches"),
        (["ledger", "tiny", "--virtual-stages", "2"], "--virtual-stages is now --vpp"),
        (["fit", "tiny", "--gpu", "H100"], "--gpu is now --gpus"),
        (["fit", "tiny", "--gpus", "8"], "write [COUNTx]GPU"),
        (["train", "--strategy", "ddp", "--dtype", "bf16"], "bf16 is retired"),
        (["train", "--strategy", "ddp", "--dtype", "bf16-master"], "is now bf16-params"),
        (["train", "--strategy", "ddp", "--dtype", "bf16-all"], "'bf16-all' is not one of"),
        (["ledger", "tiny", "--dtype", "bf16-mixed"], "bf16-mixed is now bf16-compute"),
        (["collectives", "-d", "bfloat16"], "bfloat16 is now bf16"),
        (["serve", "replica", "--tensor-dtype", "float32"], "float32 is now fp32"),
        (["serve", "replica", "--dtype", "bf16"], "No such option"),
        (["train", "--strategy", "ddp", "--nproc-per-node", "2"], "--nproc-per-node is now"),
    ],
)
def test_retired_spellings_answer_with_the_new_flag(
    args: list[str], fragment: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli([*args]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and fragment in err, err
    assert len(err.splitlines()) == 1


EXTERNAL_FLAGS = {
    # torchrun's, Slurm's, nvidia-smi's, docker's, Megatron's and vLLM's (the glossary compares)
    "--standalone", "--max-restarts", "--nproc-per-node", "--ntasks-per-node",
    "--kill-on-bad-exit", "--query-gpu", "--query-compute-apps", "--format", "--ipc", "--bf16",
    "--tensor-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
    "--expert-model-parallel-size", "--enable-expert-parallel", "--use-distributed-optimizer",
    "--recompute-granularity", "--moe-expert-capacity-factor", "--moe-token-drop-policy",
    "--moe-router-load-balancing-type", "--num-layers-per-virtual-pipeline-",
    # the engines' own server flags, which serve launch passes on (vLLM, SGLang, transformers)
    "--tokenizer", "--kv-transfer-config", "--model-path", "--tp-size", "--disaggregation-mode",
    "--force-model", "--max-model-len", "--context-length",
    "--watch",  # the launcher's watchdog, python -m parlab.runtime.launch --watch
}  # fmt: skip


def test_hints_name_only_options_that_exist() -> None:
    """Every ``--flag`` written in parlab's source is an option of a parlab command (or another
    tool's flag, named as such); a retired one appears only in the table that retires it."""
    known = _options() | EXTERNAL_FLAGS
    unknown: dict[str, list[str]] = {}
    for f in SRC.rglob("*.py"):
        if f.name == "examples.py":
            continue  # RETIRED_FLAGS names the retired ones
        for m in re.finditer(r"(?<![\w-])(--[a-z][a-z0-9-]*)", f.read_text()):
            if m.group(1) not in known:
                unknown.setdefault(m.group(1), []).append(str(f.relative_to(SRC)))
    assert not unknown, unknown


def test_a_reader_without_results_option_does_not_hint_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for cmd in ("results", "doctor", "decide", "report"):
        assert run_cli([cmd, str(tmp_path / "nope")]) == 2
        err = capsys.readouterr().err
        assert "does not exist" in err and "--results" not in err, (cmd, err)


@pytest.mark.parametrize(
    "args",
    [
        ["fit", "llama3.1-8b", "--gpus", "H100"],
        ["ledger", "llama3.1-8b", "--strategy", "zero2", "--dp", "8", "--gpus", "H100"],
        ["layout", "--world", "16", "--dp", "2", "--tp", "4", "--pp", "2"],
        ["explain", "busbw"],
    ],
)
def test_formula_only_commands_import_neither_torch_nor_matplotlib(
    args: list[str], tmp_path: Path
) -> None:
    """What made them slow to start (about 2 s of torch's import on this machine)."""
    code = (
        "import sys\n"
        "from parlab.cli import main\n"
        "try:\n"
        f"    main({[*args, '--results', str(tmp_path)] if args[0] in ('fit', 'ledger') else args!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "heavy = [m for m in ('torch', 'matplotlib') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
    )
    env = {"PYTHONPATH": str(SRC.parent), "PATH": "/usr/bin:/bin"}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert res.returncode == 0, res.stderr[-1500:]


def test_ledger_says_whether_the_layout_fits_and_by_how_much(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["ledger", "llama3.1-8b", "--strategy", "zero2", "--dp", "8", "--seq", "1024",
            "--results", str(tmp_path)]  # fmt: skip
    assert run_cli([*args, "--gpus", "H100"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("fits on one H100") and "to spare" in first
    assert run_cli(["ledger", "llama3.1-70b", "--results", str(tmp_path), "--gpus", "8xH100",
                    "--dp", "8"]) == 0  # fmt: skip
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("does not fit on one H100") and "over" in first


def test_bf16_compute_means_the_same_in_train_and_ledger() -> None:
    """The 1.3B under FSDP on two H200s at 2 x 4096 tokens, trained with bf16 compute, measured
    a 25.77 GiB peak; the ledger's bf16-compute agrees within 5 % (its old 'bf16', everything
    in bf16, said 21.4 GiB)."""
    from parlab import contract
    from parlab.dtypes import document_dtype
    from parlab.ledger import predict
    from parlab.models import get_spec
    from parlab.topology import Topology

    doc = contract.read_document(
        Path(__file__).parents[1]
        / "results/PAR-TRAINING-STATE/train-fsdp-1.3b-20261130T154534-8fc096.json"
    )
    assert document_dtype(doc) == "bf16-compute"  # the document says bf16: train's bf16
    measured = doc.metric("peak_memory")
    led = predict(
        get_spec("1.3b"), strategy="fsdp", topology=Topology.from_degrees(dp=2), micro_batch=2,
        seq_len=4096, dtype="bf16-compute",
    )  # fmt: skip
    assert measured and abs(led.peak_bytes - measured) / measured < 0.05
    all_bf16 = predict(
        get_spec("1.3b"), strategy="fsdp", topology=Topology.from_degrees(dp=2), micro_batch=2,
        seq_len=4096, dtype="bf16-all",
    )  # fmt: skip
    assert (measured - all_bf16.peak_bytes) / measured > 0.1

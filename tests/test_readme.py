"""Every command the README shows: each parses against the CLI as written (its flags, choices
and values exist), and each one short enough for the suite runs, the long ones at CPU size, so
the README and the CLI cannot drift apart again."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import click
import pytest
import typer

from parlab.cli import app, main
from parlab.cli.examples import add_examples

README = Path(__file__).parents[1] / "README.md"
ROOT = typer.main.get_command(app)
add_examples(ROOT)


def readme_commands() -> list[str]:
    """``parlab ...`` in inline code and in the bash blocks (continuation lines joined)."""
    text = README.read_text()
    found = [m.group(1) for m in re.finditer(r"`(parlab [^`]+)`", text)]
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        for line in block.replace("\\\n", " ").splitlines():
            line = line.split("#", 1)[0].strip().removeprefix(".venv/bin/")
            if line.startswith("parlab "):
                found.append(" ".join(line.split()))
    return sorted(set(found))


PLACEHOLDERS = {"TERM": "busbw", "TRACE_DIR": "/tmp/no-such-traces"}
"""The README's placeholders, as a user fills them in."""

CPU_SIZE = {
    "parlab collectives -b 8 -e 8G -f 2": "parlab collectives -b 8 -e 1KiB -f 32 -w 1 -n 1 --op all_reduce",
    "parlab train --strategy zero2 --model tiny --nproc 2": "parlab train --strategy zero2 --model tiny --nproc 2 --steps 1 --warmup 1 --seq 32",
    "parlab decide results": "parlab decide {results}",
    "parlab report results --out /tmp/parlab-report": "parlab report {results} --out {tmp}/report",
    "parlab launch --slurm --nodes 2 --gpus-per-node 8 --time 01:00:00 --out job.sbatch -- parlab train --strategy fsdp --model 8b --dtype bf16-compute": "parlab launch --slurm --nodes 2 --gpus-per-node 8 --time 01:00:00 --out {tmp}/job.sbatch -- parlab train --strategy fsdp --model 8b --dtype bf16-compute",
    "parlab launch --slurm --nodes 2 --gpus-per-node 8 -- parlab train --strategy fsdp --model 8b --dtype bf16-compute": "parlab launch --slurm --nodes 2 --gpus-per-node 8 --out {tmp}/job.sbatch -- parlab train --strategy fsdp --model 8b --dtype bf16-compute",
}  # fmt: skip
"""README command -> what the test runs (the same flags; CPU sizes; temporary folders)."""

PARSED_ONLY = {
    "parlab bench serve --base-url http://127.0.0.1:8000": "needs a server: tests/test_serve.py, tests/test_bench_dead_server.py",
    "parlab serve replica --model tiny --port 8000": "serves until stopped: tests/test_serve.py",
    "parlab serve router --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002": "routes until stopped: tests/test_router.py",
    "parlab serve sim": "100,000 requests: tests/test_serve.py runs the simulator",
    "parlab serve kv-transfer": "tests/test_serve.py",
    "parlab project training-state": "tests/test_training_report.py (CPU size)",
    "parlab project model-internal": "tests/test_layout_project.py (CPU size)",
    "parlab project moe": "tests/test_moe_project.py (CPU size)",
    "parlab project serving": "tests/test_serve.py (CPU size)",
    "parlab profile ddp-buckets": "tests/test_profile_capture.py",
    "parlab profile fsdp": "tests/test_profile_capture.py",
    "parlab profile tp": "tests/test_profile_capture.py",
    "parlab profile run -- parlab train --strategy ddp --model tiny --nproc 2": "tests/test_profile_capture.py",
    "parlab doctor --reproduce collective-timeout": "tests/test_doctor_reproduce.py",
    "parlab profile analyze TRACE_DIR": "tests/test_profile.py",
    "parlab train --strategy fsdp --model 8b --dtype bf16-compute --nproc 8 --nnodes 2 --node-rank 0 --rdzv-backend c10d --rdzv-endpoint host0:29500 --rdzv-id job1": "8 GPUs on each of 2 nodes: tests/test_multinode.py runs two nodes on the CPU",
}  # fmt: skip
PROSE = {"parlab launch --slurm", "parlab plan"}
"""Commands the README names in a sentence; their full forms are in the table and run."""
"""README commands the suite parses but runs elsewhere (or cannot run here), and where."""


def _fill(cmd: str, tmp: Path, results: Path) -> list[str]:
    cmd = CPU_SIZE.get(cmd, cmd).format(tmp=tmp, results=results)
    words = [PLACEHOLDERS.get(w, w) for w in shlex.split(cmd)]
    return words[1:]


def _writes(cmd: click.Command) -> bool:
    return any("--results" in getattr(p, "opts", []) for p in cmd.params)


def _command(words: list[str]) -> tuple[click.Command, list[str]]:
    cmd: click.Command = ROOT
    rest = list(words)
    while isinstance(cmd, click.Group) and rest and rest[0] in cmd.commands:
        cmd = cmd.commands[rest.pop(0)]
    return cmd, rest


def test_the_readme_shows_commands() -> None:
    assert len(readme_commands()) > 25


@pytest.mark.parametrize("cmd", [c for c in readme_commands() if c not in PROSE])
def test_every_readme_command_parses(cmd: str, tmp_path: Path) -> None:
    words = _fill(cmd, tmp_path, tmp_path)
    target, rest = _command(words)
    if isinstance(target, click.Group):  # `parlab --version`
        assert rest == ["--version"], cmd
        return
    target.make_context(words[0], rest)


@pytest.fixture(scope="module")
def small_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A results folder with a baseline and a candidate training run to decide and report on
    (the README's `results` is the repository's folder: decide would write into it)."""
    from parlab import contract
    from parlab.contract import Metric
    from tests.test_contract import make_doc

    root = tmp_path_factory.mktemp("readme-results")
    for role, tps in (("baseline", 900.0), ("candidate", 1200.0)):
        contract.write_result(
            make_doc(
                project="PAR-TRAINING-STATE", task="T2", evidence_level="cpu-mechanism",
                role=role, layout={"world_size": 2, "mesh": {"dp": 2}, "strategy": "ddp"},
                metrics={"tokens_per_s_per_gpu": Metric(value=tps, unit="tokens/s"),
                         "step_time": Metric(value=1000.0 / tps, unit="s")},
                predictions={},
            ),
            root,
        )  # fmt: skip
    return root


@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    "cmd", [c for c in readme_commands() if c not in PARSED_ONLY and c not in PROSE]
)
def test_every_readme_command_runs(
    cmd: str, tmp_path: Path, small_results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    words = _fill(cmd, tmp_path, small_results)
    target, _ = _command(words)
    if not isinstance(target, click.Group) and _writes(target) and "--results" not in words:
        words += ["--results", str(tmp_path / "results")]  # never into the repository's folder
    with pytest.raises(SystemExit) as info:
        main(words)
    err = capsys.readouterr().err
    assert info.value.code in (0, None), f"{cmd}: {err[-1500:]}"

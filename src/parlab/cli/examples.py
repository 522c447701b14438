"""Every command's examples, in one place: each ``--help`` opens with them, and the test suite
parses each one against its command (``tests/test_cli_vocabulary.py``), so an example can
never name an option that does not exist."""

from __future__ import annotations

import click

EXAMPLES: dict[str, tuple[str, ...]] = {
    "results": ("parlab results results", "parlab results results --project PAR-COLLECTIVES --all"),
    "env": ("parlab env", "parlab env --nproc 2 --timeout 30"),
    "demo": ("parlab demo --results /tmp/parlab-demo",),
    "doctor": ("parlab doctor results", "parlab doctor --reproduce collective-timeout"),
    "explain": ("parlab explain busbw", "parlab explain --list"),
    "fit": (
        "parlab fit llama3.1-8b --gpus H100",
        "parlab fit llama3.1-70b --gpus 64xH100 --seq 8192",
    ),
    "ledger": (
        "parlab ledger llama3.1-8b --strategy zero2 --dp 8 --gpus H100",
        "parlab ledger 1.3b --strategy fsdp --dp 2 --micro-batch 2 --seq 4096 --dtype bf16-compute",
    ),
    "models": ("parlab models", "parlab models --json"),
    "train": (
        "parlab train --strategy zero2 --model tiny --nproc 2",
        "parlab train --strategy fsdp --model 1.3b --nproc 8 --dtype bf16-compute --nnodes 2 "
        "--node-rank 0 --rdzv-endpoint head:29500 --rdzv-id job1",
    ),
    "collectives": (
        "parlab collectives -b 8 -e 8G -f 2",
        "parlab collectives --explain llama3.1-8b --layout dp=8,tp=2 --gpus H100",
    ),
    "layout": ("parlab layout --world 16 --dp 2 --tp 4 --pp 2 --model llama3.1-8b",),
    "report": ("parlab report results --out /tmp/parlab-report",),
    "decide": ("parlab decide results --project PAR-TRAINING-STATE",),
    "plan": ("parlab plan --model llama3.1-70b --gpus 64xH100 --global-batch 512 --seq 4096",),
    "launch": (
        "parlab launch --slurm --nodes 2 --gpus-per-node 8 --out job.sbatch -- parlab train "
        "--strategy fsdp --model 8b --dtype bf16-compute",
    ),
    "project": ("parlab project training-state", "parlab project moe --ep 2"),
    "project training-state": ("parlab project training-state --only ddp --only zero2",),
    "project model-internal": ("parlab project model-internal --only tp2",),
    "project moe": ("parlab project moe --ep 2 --experts 8 --topk 2",),
    "project serving": ("parlab project serving --policies round_robin,cache_aware",),
    "profile": ("parlab profile ddp-buckets", "parlab profile analyze TRACE_DIR"),
    "profile analyze": ("parlab profile analyze parlab-results/profile-traces/RUN",),
    "profile run": (
        "parlab profile run -- parlab train --strategy ddp --model tiny --nproc 2",
        "parlab profile run --nproc 2 -- train.py --steps 4",
    ),
    "profile ddp": ("parlab profile ddp --bucket-mb 25",),
    "profile ddp-buckets": ("parlab profile ddp-buckets --buckets 1,5,25",),
    "profile fsdp": ("parlab profile fsdp --configs prefetch-reshard,noprefetch-keep",),
    "profile tp": ("parlab profile tp --seq 64",),
    "bench": ("parlab bench serve --base-url http://127.0.0.1:8000",),
    "bench serve": (
        "parlab bench serve --base-url http://127.0.0.1:8000 --num-prompts 100",
        "parlab bench serve --dataset-name shared-prefix --request-rate 20",
    ),
    "serve": ("parlab serve replica --model tiny --port 8000",),
    "serve replica": ("parlab serve replica --model tiny --port 8000",),
    "serve router": (
        "parlab serve router --replica http://127.0.0.1:8001 --replica http://127.0.0.1:8002",
    ),
    "serve launch": ("parlab serve launch --engine vllm --model meta-llama/Llama-3.1-8B --tp 2",),
    "serve sim": ("parlab serve sim --replicas 8 --policy cache_aware",),
    "serve kv-transfer": ("parlab serve kv-transfer --tokens 16,256",),
    "serve project": ("parlab serve project --preset cpu",),
}
"""Command path -> its examples, as a user types them."""

RETIRED_FLAGS: dict[str, str] = {
    "--batch": "--micro-batch (sequences per rank per micro-batch)",
    "--microbatches": "--micro-batches (micro-batches per optimizer step)",
    "--virtual-stages": "--vpp (virtual stages per pipeline rank)",
    "--gpu": "--gpus (a GPU type, --gpus H100, or a cluster, --gpus 8xH100)",
    "--nproc-per-node": "--nproc (ranks on this node, torchrun's --nproc-per-node)",
}
"""A flag that no command has any more -> the one that replaced it (``docs/cli.md``)."""


def commands(group: click.Command, path: str = "") -> dict[str, click.Command]:
    """Every command under ``group`` by its path (``"project moe"``), groups included."""
    out: dict[str, click.Command] = {}
    if isinstance(group, click.Group):
        for name, cmd in group.commands.items():
            sub = f"{path} {name}".strip()
            out[sub] = cmd
            out.update(commands(cmd, sub))
    return out


def add_examples(root: click.Command) -> None:
    """Open each command's help with its examples (the short help keeps its first line)."""
    for path, cmd in commands(root).items():
        examples = EXAMPLES.get(path)
        if not examples or getattr(cmd, "_parlab_examples", False):
            continue
        body = (cmd.help or "").strip()
        if cmd.short_help is None and body:
            cmd.short_help = body.split("\n\n")[0].replace("\n", " ")
        lines = "\n".join(f"  {e}" for e in examples)
        cmd.help = f"Examples:\n\n\b\n{lines}\n\n{body}"
        cmd._parlab_examples = True  # type: ignore[attr-defined]

"""How exactly the ledger predicts what the training-state runs hold and move.

For every PAR-TRAINING-STATE document in a results folder (default
``results/``), or -- with ``--cpu`` -- for fresh runs of each strategy on 2
gloo CPU ranks (the tiny model, AdamW, through ``parlab.runtime.testing``),
one row per strategy: per-rank state bytes of each item (params, grads,
optimizer; the largest rank) measured from the real tensors against the
ledger, the comm meter's bytes per step against the ledger's wire table, and
peak memory against the ledger's peak.

Targets (issue 5): state bytes and comm bytes equal the ledger exactly
(error 0); peak memory within 5 % on GPUs (CUDA allocator, ``real-training``
documents). On CPU the peak is tracked tensor bytes -- shown, but the 5 %
target is for GPUs only.

Run: ``.venv/bin/python benchmarks/ledger_state_accuracy.py [RESULTS_DIR | --cpu]``.
Output starts with the versions and devices; Ctrl-C prints the rows so far.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

PEAK_TARGET = 0.05
ITEMS = ("params", "grads", "optimizer")


def err(measured: float | None, predicted: float | None) -> str:
    if measured is None or not predicted:
        return "-"
    return f"{(measured - predicted) / predicted:+.2%}"


def rows_from_documents(folder: Path) -> list[dict[str, Any]]:
    from parlab.contract import read_results
    from parlab.projects.training_state import PROJECT, run_label

    entries, _ = read_results(folder)
    out = []
    for e in entries:
        d = e.doc
        if d.project != PROJECT or d.status != "ok":
            continue
        row: dict[str, Any] = {"run": run_label(d), "level": d.evidence_level}
        for name in (*(f"state_bytes.{i}" for i in ITEMS), "comm_bytes_per_step", "peak_memory"):
            p = d.predictions.get(name)
            row[name] = (d.metric(name), None if p is None else p.value)
        out.append(row)
    return out


def rows_from_cpu_runs() -> list[dict[str, Any]]:
    from parlab.projects.training_state import TrainConfig, ledger_predictions, train_rank
    from parlab.runtime.testing import run_ranks

    out = []
    try:
        for s, n in (("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("fsdp", 2),
                     ("fsdp-hybrid", 4)):  # fmt: skip
            cfg = TrainConfig(strategy=s, model="tiny", nproc=n, steps=1, warmup=1, seq=32)
            res = run_ranks(train_rank, n, **cfg.to_json())
            preds, _ = ledger_predictions(cfg, "gloo")
            row: dict[str, Any] = {"run": f"{s} tiny x{n}", "level": "cpu-mechanism"}
            for i in ITEMS:
                row[f"state_bytes.{i}"] = (
                    max(r["state_bytes"][i] for r in res),
                    preds[f"state_bytes.{i}"].value,
                )
            row["comm_bytes_per_step"] = (
                max(r["comm_bytes_per_step"] for r in res),
                preds["comm_bytes_per_step"].value,
            )
            row["peak_memory"] = (max(r["peak_memory"] for r in res), preds["peak_memory"].value)
            out.append(row)
            print(f"  measured {row['run']}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: showing what was measured")
    return out


def main(argv: list[str]) -> int:
    import torch

    from parlab.units import format_bytes

    print(f"torch {torch.__version__}  CUDA {torch.version.cuda or '-'}  "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}  "
          f"devices: {torch.cuda.device_count()} GPU(s)")  # fmt: skip
    if argv and argv[0] == "--cpu":
        rows = rows_from_cpu_runs()
    else:
        rows = rows_from_documents(Path(argv[0] if argv else "results"))
    if not rows:
        print("no PAR-TRAINING-STATE documents found")
        return 1
    head = f"{'run':<28} {'level':<14}"
    for col in (*ITEMS, "comm/step", "peak"):
        head += f" {col + ' meas':>14} {'ledger':>12} {'err':>8}"
    print(head)
    worst: float | None = None
    for r in rows:
        line = f"{r['run']:<28} {r['level']:<14}"
        for key in (*(f"state_bytes.{i}" for i in ITEMS), "comm_bytes_per_step", "peak_memory"):
            m, p = r[key]
            line += f" {format_bytes(m) if m is not None else '-':>14}"
            line += f" {format_bytes(p) if p is not None else '-':>12} {err(m, p):>8}"
            if key == "peak_memory" and m and p and r["level"] == "real-training":
                worst = max(worst or 0.0, abs(m - p) / p)
        print(line)
    if worst is None:
        print("no real-training documents: the 5 % peak-memory target applies to GPU runs only")
    else:
        print(f"worst GPU peak-memory error: {worst:.2%} (target {PEAK_TARGET:.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

"""The host's spread: one configuration's host-bound step in separate processes on one machine.

    python benchmarks/host_spread.py DOCUMENT_OR_FOLDER ...

Reads ``parlab train`` documents (``*.json``, or ``*.json.log`` where a call kept diagnostics
apart from the training runs), groups them by configuration (strategy, model, micro-batch x
sequence, recompute, ranks) and prints, per configuration, each run's step (the median of its
timed steps) and its host's time to issue a step (the sum of ``workload.phase_times``' host
phases, rank 0), the spread (slowest over fastest), and the host probe's step where the run
made one (``--host-probe``). ``scripts/gpu/host_spread.sh`` made the runs this is for: the
same two host-bound configurations, one process each, alternating, at their own length and at
32 tokens (``benchmarks/results/host_spread.txt``); the ``--host-probe`` runs of 20261201T1355
are ``benchmarks/results/host_probe.txt``.
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path
from typing import Any


def documents(paths: list[str]) -> list[dict[str, Any]]:
    files: list[Path] = []
    for p in map(Path, paths):
        files += sorted(p.glob("*.json*")) if p.is_dir() else [p]
    docs = [json.loads(f.read_text()) for f in files if f.name.endswith((".json", ".json.log"))]
    return [d for d in docs if d.get("run_id", "").startswith("train-") and d.get("metrics")]


def config(d: dict[str, Any]) -> str:
    w, lay = d["workload"], d["layout"]
    model = w.get("preset") or w.get("model")
    rc = (lay.get("knobs") or {}).get("recompute", "none")
    return f"{lay['strategy']} {model} {w['micro_batch']}x{w['seq']} {rc} n{lay['world_size']}"


def host_s(d: dict[str, Any]) -> float | None:
    host = (d["workload"].get("phase_times") or {}).get("host") or {}
    return sum(statistics.median(ts) for ts in host.values()) if host else None


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    groups: dict[str, list[dict[str, Any]]] = {}
    for d in sorted(documents(argv), key=lambda d: d["created"]):
        groups.setdefault(config(d), []).append(d)
    head = f"{'configuration':32} {'runs':>4}  {'steps (ms, in run order)':40} {'spread':>6}  "
    print(f"{head}{'host':24}  host probe")
    print("-" * 130)
    for name, docs in groups.items():
        steps = [d["metrics"]["step_time"]["value"] for d in docs]
        hosts = [host_s(d) for d in docs]
        spread = max(steps) / min(steps) - 1
        shown = ", ".join(f"{s * 1e3:.1f}" for s in steps)
        host = ", ".join("-" if h is None else f"{h * 1e3:.1f}" for h in hosts)
        probes = [(d["workload"].get("host_probe") or {}).get("step_s") for d in docs]
        probe = ", ".join("-" if p is None else f"{p * 1e3:.1f}" for p in probes)
        print(f"{name:32} {len(docs):>4}  {shown:40} {spread:>6.0%}  {host:24}  {probe}")
    print(
        "steps: each run's median timed step; host: its rank 0's time to issue a step (the sum "
        "of the phases' medians, workload.phase_times), waits for the device included; spread: "
        "slowest run over fastest; host probe: the median step of parlab train --host-probe in "
        "the run's own processes before it (workload.host_probe)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

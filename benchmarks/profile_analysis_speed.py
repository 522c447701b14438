"""How fast, and in how much memory, ``parlab profile`` analyses a large set of traces.

Target (issue 9): 1 GB of traces analysed in under 60 s and under 2 GB of memory
on 2 CPU cores.

Method: ``write_big_trace`` streams ``--ranks`` GPU-shaped Chrome traces (Kineto's
layout: per step 200 compute kernels, 20 all-reduce kernels on a second stream,
each kernel with its launch event and a CPU op; ~900 bytes per kernel) of
``--size / --ranks`` bytes each into a temporary folder. Then, each in a fresh
process so the memory figures are its own:

- ``analyze``: ``analyze_folder`` alone (one worker process per rank file);
- ``analyze+merge``: ``analyze_folder`` writing the merged-trace fragments too
  (what ``parlab profile analyze`` does), then the merged trace.

Wall time is ``time.perf_counter`` around the call; CPU time is user + system
time of the process and its workers (on a shared machine the wall time also
counts other people's load; the header prints the load average); memory is the peak resident
set of the process and of its largest worker (``getrusage``; the workers run
at once, so the total peak is at most parent + ranks x worker). The known
overlap of the generated trace (45 %: 18 of each 40 us all-reduce covered by
compute) is checked. The files are deleted at the end (``--keep`` keeps them).
Ctrl-C prints what was measured so far.

    .venv/bin/python benchmarks/profile_analysis_speed.py [--size 1GB] [--ranks 2]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

from parlab.units import format_bytes, parse_size  # noqa: E402

CHILD = r"""
import json, resource, sys, time, tempfile
from pathlib import Path
from parlab.profile.analyze import analyze_folder
from parlab.profile.export import write_merged_trace
from parlab.profile.summary import summarize
folder, mode = sys.argv[1], sys.argv[2]
t = time.perf_counter()
with tempfile.TemporaryDirectory() as frag:
    run = analyze_folder(folder, fragments_dir=frag if mode == "analyze+merge" else None)
    merged = None
    if mode == "analyze+merge":
        merged = write_merged_trace(run, Path(frag), Path(folder) / "out" / "merged.trace.json.gz")
    wall = time.perf_counter() - t
    s = summarize(run)
print(json.dumps({
    "wall_s": wall,
    "cpu_s": sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime
                 for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)),
    "self_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
    "worker_rss": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024,
    "events": sum(r.events for r in run.ranks),
    "steps": len(s.steps),
    "overlap_pct": s.mean("overlap_pct"),
    "merged_bytes": merged.stat().st_size if merged else 0,
}))
"""


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", default="1GB", help="total trace bytes (default 1GB)")
    ap.add_argument("--ranks", type=int, default=2, help="rank files (default 2)")
    ap.add_argument(
        "--dir", default=None, help="where to write the traces (default: a temp folder)"
    )
    ap.add_argument("--keep", action="store_true", help="keep the generated traces")
    args = ap.parse_args()
    total = parse_size(args.size)
    import torch

    from parlab.profile.synthetic import write_big_trace

    print(
        f"python {platform.python_version()}  torch {torch.__version__}  "
        f"cpus {len(os.sched_getaffinity(0))}  load {os.getloadavg()[0]:.1f}  "
        f"({platform.processor() or platform.machine()})"
    )
    folder = Path(tempfile.mkdtemp(prefix="parlab-bench-", dir=args.dir))
    rows = []
    try:
        t = time.perf_counter()
        written = 0
        for r in range(args.ranks):
            with open(folder / f"rank{r}.trace.json", "w") as f:
                info = write_big_trace(
                    f, target_bytes=total // args.ranks, rank=r, world_size=args.ranks
                )
            written += info["bytes"]
        print(
            f"generated {args.ranks} trace(s), {format_bytes(written)} in "
            f"{time.perf_counter() - t:.1f} s, under {folder}"
        )
        env = dict(os.environ, PYTHONPATH=str(ROOT / "src"))
        for mode in ("analyze", "analyze+merge"):
            out = subprocess.run(
                [sys.executable, "-c", CHILD, str(folder), mode],
                env=env,
                capture_output=True,
                text=True,
                check=True,
            )
            rows.append((mode, json.loads(out.stdout.strip().splitlines()[-1])))
            _print(rows, written)
    except KeyboardInterrupt:
        print("interrupted: what was measured so far")
        _print(rows, 0)
    finally:
        if not args.keep:
            shutil.rmtree(folder, ignore_errors=True)
    return 0


def _print(rows: list[tuple[str, dict]], written: int) -> None:
    print(
        f"{'mode':<15}{'wall':>9}{'cpu':>9}{'MB/s':>8}{'events':>11}{'steps':>7}"
        f"{'overlap':>9}{'parent RSS':>12}{'worker RSS':>12}{'merged':>11}"
    )
    for mode, m in rows:
        rate = written / m["wall_s"] / 1e6 if written else float("nan")
        print(
            f"{mode:<15}{m['wall_s']:>8.1f}s{m['cpu_s']:>8.1f}s{rate:>8.1f}{m['events']:>11,}{m['steps']:>7}"
            f"{m['overlap_pct']:>8.1f}%{format_bytes(m['self_rss']):>12}"
            f"{format_bytes(m['worker_rss']):>12}{format_bytes(m['merged_bytes']):>11}"
        )
    print("target: 1 GB under 60 s and under 2 GB of memory on 2 cores; known overlap 45.0%")


if __name__ == "__main__":
    sys.exit(main())

"""GPU kernel time per profiled step by kind, read from a merged trace ``parlab profile`` wrote.

``parlab profile`` keeps each run's merged Perfetto trace (``<run>/merged.trace.json.gz``: every
rank's kernels, ``pid`` = rank) beside its document. This script sums the kernels' durations
inside each ``ProfilerStep#N`` window of each rank by ``parlab.profile.classify`` -- the same
rules the analysis uses (``kernel_kind`` for communication, ``compute_kind`` for the rest) --
so traces written before the analysis reported compute time by kind can still be read.
Times are kernel durations summed (kernels on several streams can add up to more than the
step); the profiler's own overhead is in the step windows.

    python benchmarks/profile_kernel_kinds.py results/PAR-TRAINING-STATE/<run>/merged.trace.json.gz
"""

from __future__ import annotations

import gzip
import json
import sys
from collections import Counter

from parlab.profile.classify import COMM, compute_kind, kernel_kind


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__.strip().splitlines()[-1].strip())
        return 2
    with gzip.open(argv[0], "rt") as f:
        data = json.load(f)
    events = data["traceEvents"] if isinstance(data, dict) else data
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") == "kernel"]
    steps = [
        e
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    ]
    for st in sorted(steps, key=lambda e: (e.get("pid"), e["ts"])):
        t0, t1 = st["ts"], st["ts"] + st["dur"]
        by: Counter[str] = Counter()
        for k in kernels:
            if k.get("pid") == st.get("pid") and t0 <= k["ts"] <= t1:
                kind = (
                    "communication" if kernel_kind(k["name"]) == COMM else compute_kind(k["name"])
                )
                by[kind] += k["dur"]
        print(
            f"rank {st.get('pid')} {st['name']} (window {st['dur'] / 1e3:.1f} ms): "
            + ", ".join(f"{kind} {us / 1e3:.1f} ms" for kind, us in by.most_common())
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

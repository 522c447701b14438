"""Fit the planner's built-in compute figures on the committed probes and write them.

What it measures: nothing new. It reads the GPU GEMM-shape, param-work and NCCL sweep documents
under ``results/`` (``parlab.plan.fit.efficiency_fit``), fits the GEMM and attention laws of
``parlab.plan.compute``, writes ``src/parlab/plan/efficiency.json`` and prints each GPU's
figures and how well the GEMM law fits the probe's passes.

Run: ``.venv/bin/python benchmarks/plan_efficiency.py [RESULTS_DIR] [--check]`` (``--check``:
exit 1 where the shipped file differs from the fit, write nothing).
"""

from __future__ import annotations

import json
import statistics
import sys
from pathlib import Path

from parlab import contract
from parlab.plan.compute import GpuEfficiency
from parlab.plan.fit.efficiency_fit import fit_all, gemm_rows, probe_documents, shipped

OUT = Path(__file__).resolve().parents[1] / "src" / "parlab" / "plan" / "efficiency.json"


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    root = Path(args[0]) if args else Path(__file__).resolve().parents[1] / "results"
    table = fit_all(root)
    if "--check" in sys.argv:
        same = table == shipped()
        print("efficiency.json is the fit" if same else "efficiency.json differs from the fit")
        sys.exit(0 if same else 1)
    OUT.write_text(json.dumps(table, indent=2, sort_keys=True) + "\n")
    print(f"wrote {OUT}")
    cols = ("gemm_max", "gemm_ceiling", "gemm_tiles", "gemm_depth", "misaligned",
            "attention_max", "attention_work", "attention_head_dim", "memory", "link")  # fmt: skip
    print(f"{'gpu':<12}" + "".join(f"{c:>20}" for c in cols))
    for name, fig in table["gpus"].items():
        print(f"{name:<12}" + "".join(f"{fig.get(c, 0):>20.4g}" for c in cols))
        print(f"{'':<12}rests on: {fig['rests_on']}")
    entries, _ = contract.read_results(root)
    docs = probe_documents(entries, "PAR-TRAINING-STATE", "gemm-shapes")
    for name, fig in table["gpus"].items():
        mine = [d for d in docs if d.workload["calibration"]["device"].endswith(name)]
        if not mine:
            continue
        eff = GpuEfficiency(gpu=name, **fig)
        rows = gemm_rows(mine)
        aligned = [r for r in rows if all(int(x) % 8 == 0 for x in r[:3])]
        errs = [abs(eff.gemm(*r[:3]) / r[3] - 1) for r in aligned]
        print(
            f"{name}: GEMM law against {len(aligned)} aligned probe passes: median |error| "
            f"{statistics.median(errs):.1%}, 90th percentile "
            f"{statistics.quantiles(errs, n=10)[-1]:.1%}, worst {max(errs):.1%}"
        )


if __name__ == "__main__":
    main()

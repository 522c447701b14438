"""The T1 step of ``parlab demo``: a CPU-sized sweep, its alpha-beta fit and the T1 table.

Every op from 8 B to 1 MiB (x4 steps) on 2 ranks (gloo on CPU, NCCL where
there are GPUs), checked and timed; the fit of that sweep as a calibration;
and the T1 table of the ``tiny`` model on dp=2 from that calibration. Three
documents and one plot, in well under a minute on 2 cores.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from parlab.comm import ops as O


def demo_step(results: Path, console: Console) -> None:
    from parlab.cli.common import write
    from parlab.comm.calibration import calibration_document
    from parlab.comm.explain import explain_document, format_explain
    from parlab.comm.sweep import SweepSpec, run_sweep, write_sweep

    args = "-b 8 -e 1MiB -f 4 -w 2 -n 10 --nproc 2"
    spec = SweepSpec(
        ops=tuple(O.OPS), minbytes=8, maxbytes=1 << 20, stepfactor=4, warmup=2, iters=10, nproc=2
    )
    outcome = run_sweep(spec, command=f"parlab collectives {args} --results {results}")
    doc = outcome.doc
    path = write_sweep(doc, results)
    console.print(f"sweep: {len(outcome.records)} measurements, {path}")
    if doc.status != "ok" or outcome.interrupted:
        raise RuntimeError(f"sweep failed: {doc.failure.message if doc.failure else 'interrupted'}")
    if doc.metric("wrong_total"):
        raise RuntimeError(f"sweep found {doc.metric('wrong_total')} wrong values")
    peak = doc.metric("busbw_peak") or 0.0
    console.print(f"busbw peak {peak / 1e9:.3f} GB/s ({doc.evidence_level}), 0 wrong values")
    cal = calibration_document(doc, command=f"parlab collectives --fit {path} --results {results}")
    cal_path = write(cal, results)
    t1 = explain_document(
        model_name="tiny",
        layout="dp=2",
        strategy="ddp",
        micro_batch=1,
        seq=None,
        calibration=cal_path,
        command=f"parlab collectives --explain tiny --layout dp=2 --calibration {cal_path}",
    )
    write(t1, results)
    format_explain(t1, console)

"""``parlab collectives``' sweep: what to measure, the driver that launches the ranks, the document.

- ``spec``: ``SweepSpec`` (nccl-tests' options, mesh axis, launcher) and the ranks' environment;
- ``run``: ``run_sweep`` launches ``parlab.comm.bench:sweep_rank`` and follows its progress;
- ``document``: ``build_document``, the T1 document (its fields are listed there).
"""

from parlab.comm.sweep.document import build_document
from parlab.comm.sweep.run import SweepOutcome, resolve_backend, run_sweep, write_sweep
from parlab.comm.sweep.spec import FR_ENV, GRAPH_ENV, SweepSpec, parse_mesh, rank_env

__all__ = [
    "FR_ENV",
    "GRAPH_ENV",
    "SweepOutcome",
    "SweepSpec",
    "build_document",
    "parse_mesh",
    "rank_env",
    "resolve_backend",
    "run_sweep",
    "write_sweep",
]

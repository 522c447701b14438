"""PAR-MOE-EXPERT (T4): routing, capacity, overflow and all-to-all over expert-parallel ranks.

- ``config``: ``MoERunConfig``, checked before anything launches;
- ``rank``: what a rank measures (``moe_rank``): the reference all-to-all, the routing
  workloads through the expert-parallel and the naive layer, the capacity sweep, the learned
  routing on the shared step loop (``parlab.runtime.loop``);
- ``workloads``: the routing workloads' draws; ``dispatch_plans`` computes the plans
  beforehand with no process group;
- ``calibration``: what ``parlab collectives`` measured for all_to_all, as the reference;
- ``documents``: the run's contract documents;
- ``report``: the report's blocks and figures, from documents alone;
- ``run``: launch a run and write it all (``run_moe_project``).
"""

from parlab.projects.moe.calibration import calibration_busbw, calibration_points, find_calibration
from parlab.projects.moe.config import PROJECT, MoERunConfig, parse_floats, parse_skews
from parlab.projects.moe.documents import sweep_document, training_document, workload_document
from parlab.projects.moe.rank import moe_rank
from parlab.projects.moe.report import cell
from parlab.projects.moe.run import MoEOutcome, render_report, run_moe_project
from parlab.projects.moe.workloads import dispatch_plans, hot_order

__all__ = [
    "PROJECT",
    "MoEOutcome",
    "MoERunConfig",
    "calibration_busbw",
    "calibration_points",
    "cell",
    "dispatch_plans",
    "find_calibration",
    "hot_order",
    "moe_rank",
    "parse_floats",
    "parse_skews",
    "render_report",
    "run_moe_project",
    "sweep_document",
    "training_document",
    "workload_document",
]

"""PAR-MODEL-INTERNAL: TP/SP, PP and CP runs of the reference model, against one rank.

- ``config``: ``RunConfig`` and the comparison set of (one-rank baseline, layout) pairs;
- ``rank``: what a rank does (``mi_rank``), on the shared step loop (``parlab.runtime.loop``);
- ``many``: several isolated runs in one launch (``mi_many``);
- ``documents``: a run's contract document, the ledger's and the bubble formula's predictions;
- ``report``: the report's blocks, from documents alone;
- ``run``: launch the set (``launch_set``, ``run_project``) and compare it with one rank.
"""

from parlab.projects.model_internal.config import NAMES, PROJECT, RunConfig, comparison_set
from parlab.projects.model_internal.documents import document, predictions
from parlab.projects.model_internal.many import mi_many
from parlab.projects.model_internal.rank import make_optimizer, metered, mi_rank
from parlab.projects.model_internal.run import launch_set, run_project

__all__ = [
    "NAMES",
    "PROJECT",
    "RunConfig",
    "comparison_set",
    "document",
    "launch_set",
    "make_optimizer",
    "metered",
    "mi_many",
    "mi_rank",
    "predictions",
    "run_project",
]

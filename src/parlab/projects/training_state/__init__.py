"""PAR-TRAINING-STATE: train the reference model under DDP, ZeRO-1/2/3 or FSDP and measure it.

Strategies: ``ddp`` (torch DDP, the baseline), ``fsdp`` (FSDP2), ``fsdp-hybrid`` (FSDP2 over
``dp_replicate x dp_shard``), parlab's own ``zero1|zero2|zero3`` and ``ddp-bucket`` (and each
one's ``-naive`` form), and ``deepspeed-zero1|2|3`` (DeepSpeed's ZeRO stages, where DeepSpeed
is installed).

- ``config``: ``TrainConfig``, checked before anything launches;
- ``rank``: what a rank does (``train_rank``), on the shared step loop (``parlab.runtime.loop``);
- ``documents``: the contract document of a run, the ledger's predictions beside it;
- ``report``: the report's blocks, from documents alone;
- ``run``: launch one run (``run_training``) or the comparison set (``run_project``).
"""

from parlab.projects.training_state.config import PROJECT, STRATEGIES, TrainConfig, ledger_strategy
from parlab.projects.training_state.documents import document, ledger_predictions, predict_step
from parlab.projects.training_state.rank import train_rank
from parlab.projects.training_state.report import run_label
from parlab.projects.training_state.run import run_project, run_training, train_command

__all__ = [
    "PROJECT",
    "STRATEGIES",
    "TrainConfig",
    "document",
    "ledger_predictions",
    "ledger_strategy",
    "predict_step",
    "run_label",
    "run_project",
    "run_training",
    "train_command",
    "train_rank",
]

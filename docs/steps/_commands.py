"""Every parlab command line the step pages show or run, in one place.

The pages name commands by key; the build runs the analytic ones in-process and prints their
output, and the test suite runs every exercise's command. When a flag is renamed, change it
here (and rebuild: ``python docs/steps/_build.py``); nothing else spells a command.
"""

COMMANDS: dict[str, str] = {
    # T0 constraints
    "fit": "parlab fit llama3.1-8b --gpus H100 --seq 4096",
    "fit-h200": "parlab fit llama3.1-8b --gpus H200 --seq 4096",
    "train-8b": "parlab train --strategy fsdp --model 8b --nproc 2 --micro-batch 1 --seq 4096 "
    "--dtype bf16-compute",
    # T1 collectives and topology
    "env": "parlab env",
    "sweep": "parlab collectives --op all -b 8 -e 8GiB -f 2 --nproc 2",
    "calibrate": "parlab collectives --fit parlab-results/PAR-COLLECTIVES",
    "explain-fsdp": "parlab collectives --explain 1.3b --layout dp=2 --strategy fsdp --seq 4096 "
    "--micro-batch 2",
    "explain-ddp-8": "parlab collectives --explain 1.3b --layout dp=8 --strategy ddp --seq 4096 "
    "--micro-batch 2",
    "explain-busbw": "parlab explain busbw",
    "explain-zero3-8": "parlab collectives --explain 1.3b --layout dp=8 --strategy zero3 "
    "--seq 4096 --micro-batch 2",
    # T2 training state
    "ledger-zero3": "parlab ledger 1.3b --strategy zero3 --dp 2 --seq 4096 --micro-batch 2",
    "ledger-ddp": "parlab ledger 1.3b --strategy ddp --dp 2 --seq 4096 --micro-batch 2",
    "ledger-zero1-4": "parlab ledger 1.3b --strategy zero1 --dp 4 --seq 4096 --micro-batch 2",
    "project-state": "parlab project training-state",
    "train-zero2": "parlab train --strategy zero2 --model 1.3b --nproc 2 --micro-batch 2 "
    "--seq 4096 --dtype bf16-compute",
    # T3 model internals
    "layout": "parlab layout --world 8 --pp 2 --tp 2 --dp 2 --model 1.3b --seq 4096",
    "layout-16": "parlab layout --world 16 --pp 2 --tp 4 --dp 2 --model 1.3b --seq 4096",
    "ledger-tp2": "parlab ledger 1.3b --tp 2 --seq 4096 --micro-batch 2",
    "explain-bubble": "parlab explain bubble",
    "project-mi": "parlab project model-internal --preset cpu",
    # T4 dynamic routing
    "project-moe": "parlab project moe --ep 2 --experts 16 --topk 2 --capacity-factor 1.25 "
    "--skew zipf:1.2",
    "project-serving": "parlab project serving",
    "models": "parlab models",
    "sim-50": "parlab serve sim --replicas 4 --requests 4000 --rate 50 --policy round_robin",
    "sim-200": "parlab serve sim --replicas 4 --requests 4000 --rate 200 --policy round_robin",
    # T5 scheduling and overlap
    "profile-buckets": "parlab profile ddp-buckets --buckets 1,25,250 --model 1.3b --seq 4096",
    "profile-fsdp": "parlab profile fsdp --model 1.3b --seq 4096",
    "profile-tp": "parlab profile tp --model 1.3b",
    "explain-bucket": "parlab explain bucket",
    "fit-calibration": "parlab collectives --fit "
    "results/PAR-COLLECTIVES/collectives-20261130T140456-7d5586.json",
    # T6 admission and decision
    "plan": "parlab plan --model 1.3b --gpus 2xH200 --gpus-per-node 2 --global-batch 4 --seq 4096",
    "plan-8": "parlab plan --model llama3.1-8b --gpus 8xH100 --gpus-per-node 8 "
    "--global-batch 16 --seq 4096",
    "decide": "parlab decide parlab-results --project PAR-TRAINING-STATE",
    "doctor": "parlab doctor results",
    "report": "parlab report results",
}

#!/usr/bin/env bash
# Does a host-bound step's host time move between processes, or with the tokens? One go: about
# 5 minutes on 1 H200.
#
#   scripts/gpu/host_spread.sh OUT_DIR
#
# Why: in the 20261201T1304 call (scripts/gpu/phases.sh) the runs' host took 0.76-1.27 x what the
# host-step probe measured for the same configuration on one sequence of 32 tokens, minutes
# before on the same machine (GPT-2 124M, DDP, 1 x 1024: 41 ms a step against 33 ms, with 8 ms of
# GPU work; the 1.3B, DDP, 1 x 512: 63 ms against 84 ms). Either each process's host runs at
# its own speed, or the host's work grows with the tokens. Here each of those two configurations
# runs REPEATS (3) times at its own length and as often at 32 tokens, alternating, each run its
# own process (parlab train, every step's phases in workload.phase_times).
# Documents: OUT_DIR/full/results (the runs at their own length: training runs like any other,
# each recording its step prediction before it starts) and OUT_DIR/short/results (32 tokens:
# diagnostics, not configurations anyone trains). Without a GPU: the tiny model on CPU (a dry
# run).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/host_spread.sh OUT_DIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
GPUS=$(PYTHONPATH=src "$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 1 ]; then
  CONFIGS=("ddp gpt2-124m 1 1024" "ddp 1.3b 1 512")
else
  CONFIGS=("ddp tiny 1 64")
fi
status=0
for i in $(seq "${REPEATS:-3}"); do
  for c in "${CONFIGS[@]}"; do
    read -r strategy model mb seq <<< "$c"
    for s in "$seq" 32; do
      dir=full
      [ "$s" = "$seq" ] || dir=short
      RUNS="$strategy-$model-${mb}x$s-$i --strategy $strategy --model $model --micro-batch $mb --seq $s" \
        NPROC=1 bash scripts/gpu/runs.sh "$OUT/$dir" || status=$?
    done
  done
done
exit "$status"

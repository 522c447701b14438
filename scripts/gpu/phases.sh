#!/usr/bin/env bash
# Where the host-bound steps' time goes, by phase, one go: about 7 minutes on 1 H200.
#
#   scripts/gpu/phases.sh OUT_DIR
#
# Why: one-rank runs whose host alone takes longer than their GPU work measured between the two
# and their sum (the 1.3B, DDP, 1 x 512: 0.110 s a step, host alone 0.069 s, GPU work 0.036 s;
# the 8B, FSDP, 1 x 512: 0.396 and 0.482 s against 0.340 s of host), and others less than the
# host alone (GPT-2 1.5B, DDP, 2 x 1024: 0.115 s against 0.149 s). parlab train now records,
# per timed step, the host's time to issue each phase (data, forward, backward, optimizer,
# zero_grad) and the device's time between the same points (workload.phase_times).
#
# For each configuration below (STRATEGY:MODEL:MBxSEQ:RECOMPUTE, CONFIGS overrides): the host
# step probe at its own width on one sequence of 32 tokens (benchmarks/host_step_probe.py
# --tokens 32: the host's phases with the GPU's work a small part), then the run itself
# (parlab train --roofline results: each records the step the lab predicts before it starts).
# Documents under OUT_DIR/*/results, logs beside them. Without a GPU: one tiny configuration on
# CPU ranks (a dry run).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/phases.sh OUT_DIR}"
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
PY="${PYTHON:-python3}"
GPUS=$(PYTHONPATH=src "$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 1 ]; then
  DEFAULT="ddp:1.3b:1x512:none fsdp:1.3b:1x1024:none ddp:gpt2-1.5b:2x1024:none
    fsdp:8b:1x512:full fsdp:qwen2.5-7b:1x1024:full fsdp:gpt2-1.5b:8x1024:none
    ddp:gpt2-124m:1x1024:none ddp:1.3b:2x4096:none"
else
  DEFAULT="ddp:small:1x64:none"
fi
HS=() RUNS_ARG=()
for c in ${CONFIGS:-$DEFAULT}; do
  IFS=: read -r strategy model shape recompute <<< "$c"
  mb=${shape%x*} seq=${shape#*x}
  HS+=("$c")
  RUNS_ARG+=("$strategy-$model-$shape --strategy $strategy --model $model --micro-batch $mb --seq $seq --recompute $recompute")
done
status=0
RUNS="${HS[*]}" HEAD_DIMS='' TOKENS=32 bash scripts/gpu/host_step.sh "$OUT/host_step" || status=$?
joined=$(printf '%s;' "${RUNS_ARG[@]}")
RUNS="${joined%;}" NPROC=1 bash scripts/gpu/runs.sh "$OUT/runs" || status=$?
exit "$status"

#!/usr/bin/env bash
# Profiles of FSDP on one GPU (GPT-2 1.5B against the 1.3B), one go: about 2 minutes on 1 H200.
#
#   scripts/gpu/profile_one_gpu.sh OUT_DIR
#
# Why: on one H200, FSDP on one rank ran GPT-2 1.5B (micro-batch 8 x 1024) at 0.235-0.237 s a
# step where the planner says 0.207 s (-12 %), and the 1.3B (2 x 4096) at 0.172 s against
# 0.170 s (results/PAR-TRAINING-STATE/train-fsdp-*-20261201T03*). GPT-2 has twice the blocks
# (48), so twice FSDP2's per-block hooks a step: is the missing time the GPU idling while the
# host issues the step (parlab's "idle"), or kernels the roofline does not price?
#
# parlab profile run --nproc 1 -- parlab train --strategy fsdp ... for each model, the same
# knobs as those runs, and DDP on GPT-2 (no per-block hooks) beside them; 3 warm-up + 3 steps, the profiler's schedule 1 wait, 1 warm-up, 2 active.
# Documents (the profile's and the run's) under OUT_DIR/results, logs in OUT_DIR. Without a
# GPU the same commands run on the tiny model, one gloo rank (a dry run).
# RUNS ("strategy model micro-batch seq recompute;..."): other runs instead.
set -euo pipefail
OUT=${1:?usage: scripts/gpu/profile_one_gpu.sh OUT_DIR}
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
TR=$(mktemp -d /tmp/parlab-profile-XXXXXX)
trap 'rm -rf "$TR"' EXIT
NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ -n "${RUNS:-}" ]; then
  IFS=';' read -r -a RUNS <<< "$RUNS"
  DT=bf16-compute
  [ "$NGPU" -ge 1 ] || DT=fp32
elif [ "$NGPU" -ge 1 ]; then
  RUNS=("fsdp gpt2-1.5b 8 1024" "fsdp 1.3b 2 4096" "ddp gpt2-1.5b 8 1024") DT=bf16-compute
else
  echo "no GPU here: dry run on the tiny model, one gloo CPU rank"
  RUNS=("fsdp tiny 8 64" "fsdp tiny 2 128" "ddp tiny 8 64") DT=fp32
fi
for r in "${RUNS[@]}"; do
  read -r strategy model mb seq recompute <<< "$r"
  "$PY" -m parlab profile run --nproc 1 --schedule 1,1,2 --trace-dir "$TR/$strategy-$model-$mb" \
    --results "$OUT/results" --project PAR-TRAINING-STATE -- \
    parlab train --strategy "$strategy" --nproc 1 --model "$model" --micro-batch "$mb" --seq "$seq" \
    --dtype "$DT" --recompute "${recompute:-none}" --warmup 3 --steps 3 --timeout 90 \
    --results "$OUT/results" \
    2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears events" | tee "$OUT/profile-$strategy-$model-$mb.log"
done

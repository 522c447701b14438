#!/usr/bin/env bash
# The per-parameter work's bandwidth on one GPU (fused AdamW, autocast's casts, zero_grad, DDP's
# bucket passes), one go: under a minute on 1 H200 (torch import and CUDA start-up ~10 s, each
# probe a few seconds).
#
#   scripts/gpu/param_work.sh OUT_DIR
#
# benchmarks/param_work_probe.py twice: 2 billion float32 parameters as 4096 x 4096 tensors (a
# 7B's projections) and 1.3 billion as 2048 x 2048 (the 1.3B's). Documents under
# OUT_DIR/results/PAR-TRAINING-STATE/param-work-*.json, the log in OUT_DIR. Without a GPU the
# same probe runs on the CPU at 4 million parameters (a dry run; its document is cpu-mechanism).
# SIZES ("params shape;..."): other sizes instead, e.g. a sweep of the footprint
# ("0.5e9 4096x4096;2e9 4096x4096;6.7e9 4096x4096": 6.7 billion float32 parameters with their
# gradients and AdamW states fill 107 GB, a 7B's).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/param_work.sh OUT_DIR}"
mkdir -p "$OUT/results"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "param_work.sh: $GPUS GPU(s), output $OUT" | tee "$OUT/param-work.log"
if [ -n "${SIZES:-}" ] && [ "$GPUS" -ge 1 ]; then
  IFS=';' read -r -a RUNS <<< "$SIZES"
elif [ "$GPUS" -ge 1 ]; then
  RUNS=("2e9 4096x4096" "1.3e9 2048x2048")
else
  RUNS=("4e6 512x512")
fi
status=0
for r in "${RUNS[@]}"; do
  read -r params shape <<< "$r"
  CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout -k 5 120 "$PY" \
    benchmarks/param_work_probe.py "$OUT/results" --params "$params" --shape "$shape" 2>&1 \
    | tee -a "$OUT/param-work.log" || status=$?
done
exit "$status"

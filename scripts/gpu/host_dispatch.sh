#!/usr/bin/env bash
# Host-dispatch calibration of torch's DTensor TP (the planner's host term), one go: under 60 s
# on 2xH200 (torchrun and NCCL start-up ~15 s, the op counts on 1, 2 and 24 layers a few
# seconds, 2 x 13 steps at ~0.3 s).
#
#   scripts/gpu/host_dispatch.sh OUT_DIR
#
# benchmarks/host_dispatch_probe.py on 2 ranks: the tp2-dtensor runs' step (1.3B structure:
# 24 layers, 16 heads, vocabulary 32000; micro-batch 2, bf16, parallelize_module without SP)
# at hidden 128 and 256, sequence 256, where the GPU idles: the ops it dispatches per step
# (counted under a TorchDispatchMode, as fixed + per-layer per window) and its step time,
# giving host seconds per op. The document goes to OUT_DIR/results/PAR-MODEL-INTERNAL/
# host-dispatch-*.json (commit it under results/PAR-MODEL-INTERNAL/: benchmarks/plan_accuracy.py
# then predicts the DTensor TP runs as max(roofline, host)); the log to OUT_DIR.
# Without 2 GPUs it runs on 2 gloo CPU ranks at 4 layers, vocabulary 512 (a dry run, ~7 s; its
# document is cpu-mechanism, which the planner does not use).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/host_dispatch.sh OUT_DIR}"
mkdir -p "$OUT/results"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "host_dispatch.sh: $GPUS GPU(s), output $OUT" | tee "$OUT/host-dispatch.log"
if [ "$GPUS" -ge 2 ]; then
  ARGS=(--hidden 128,256 --seq 256 --steps 10 --warmup 3)
else  # CPU dry run: 4 layers, vocabulary 512, sequence 32 (the full model takes ~35 s a width)
  ARGS=(--hidden 128 --layers 4 --vocab 512 --seq 32 --steps 3 --warmup 1)
fi
status=0
timeout -k 5 55 "$PY" benchmarks/host_dispatch_probe.py "$OUT/results" --model 1.3b "${ARGS[@]}" \
  2>&1 | tee -a "$OUT/host-dispatch.log" || status=$?
echo "probe exited with status $status" | tee -a "$OUT/host-dispatch.log"
exit "$status"

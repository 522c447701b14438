#!/usr/bin/env bash
# GEMM-shape calibration (the planner's measured shape factor, parlab.plan.shapes), one go:
# under 60 s on one H200 (torch import and CUDA start-up ~10-15 s; ~40 distinct GEMMs, each
# 5 warm-up + 10 x 3 timed calls of at most a few ms).
#
#   scripts/gpu/gemm_shapes.sh OUT_DIR
#
# benchmarks/gemm_shapes_probe.py on GPU 0: every GEMM of one layer and of the output layer
# (forward, dgrad, wgrad; bf16) of the models the runs under results/ use, at their tokens per
# micro-batch (micro-batch x sequence, tp 1): gpt2-1.5b 8 x 1024; 1.3b 1 x 4096 and 2 x 4096
# (the reference: the roofline's GEMM efficiency is the 1.3B's width); 8b 1 x 4096 (its runs)
# and 2 x 4096. The document goes to OUT_DIR/results/PAR-TRAINING-STATE/gemm-shapes-*.json
# (commit it under results/PAR-TRAINING-STATE/: benchmarks/plan_accuracy.py then replaces the
# width law by the measured factor for the runs it covers); the log to OUT_DIR.
# MODELS ("name:tokens,tokens ..."): other models and tokens instead (the planner reads the
# newest document alone: keep every model the runs use). TIMEOUT (55): the probe's limit.
# Without a GPU it runs the same models with every dimension divided by 16 (a dry run, ~2 s;
# its document is cpu-mechanism and shrunk, which the planner does not use).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/gemm_shapes.sh OUT_DIR}"
mkdir -p "$OUT/results"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "gemm_shapes.sh: $GPUS GPU(s), output $OUT" | tee "$OUT/gemm-shapes.log"
if [ "$GPUS" -ge 1 ]; then
  ARGS=(--warmup 5 --repeats 10 --inner 3)
else  # CPU dry run: shapes divided by 16
  ARGS=(--shrink 16 --warmup 1 --repeats 2 --inner 1)
fi
status=0
MODEL_ARGS=()
for m in ${MODELS:-gpt2-1.5b:8192 1.3b:4096,8192 8b:4096,8192}; do MODEL_ARGS+=(--model "$m"); done
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout -k 5 "${TIMEOUT:-55}" "$PY" \
  benchmarks/gemm_shapes_probe.py "$OUT/results" "${MODEL_ARGS[@]}" "${ARGS[@]}" 2>&1 | tee -a "$OUT/gemm-shapes.log" || status=$?
echo "probe exited with status $status" | tee -a "$OUT/gemm-shapes.log"
exit "$status"

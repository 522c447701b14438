#!/usr/bin/env bash
# GEMM-shape and attention-core calibration (the planner's measured shape factors,
# parlab.plan.fit.shapes), one go: under a minute on one H200 (torch import and CUDA start-up
# ~10-15 s; ~190 distinct GEMM, bias-gradient and attention shapes, each 5 warm-up + 10 x 3
# timed calls: ~8 s of GEMM kernels at the v1 probes' measured times, ~2 s of attention at 0.3
# of peak, the longest call the 1.3B's attention at 1 x 32768, ~45 ms).
#
#   scripts/gpu/gemm_shapes.sh OUT_DIR
#
# benchmarks/gemm_shapes_probe.py on GPU 0 (format parlab-gemm-shapes/v2): every GEMM of one
# layer and of the output layer (forward, dgrad, wgrad, and the bias gradient of each biased
# linear; bf16) at each model's tokens per micro-batch, and one layer's causal attention core
# (SDPA forward + backward) at each micro-batch x sequence, for the batches the one-rank-shaped
# runs under results/ use (tp 1, cp 1):
#   gpt2-1.5b 8 x 1024; gpt2-124m 1, 8 and 32 x 1024; 8b 1 x 4096 (and 2 x 4096, the GEMMs at
#   8,192 tokens of the earlier probes); llama3.1-8b, llama2-7b and qwen2.5-7b 1 x 1024;
#   and the reference, the 1.3B (the roofline's GEMM width), at all of those batches and at its
#   own: 1 x 4096, 2 x 4096, 1 x 8192, 1 x 32768.
# The document goes to OUT_DIR/results/PAR-TRAINING-STATE/gemm-shapes-*.json (commit it under
# results/PAR-TRAINING-STATE/: benchmarks/plan_accuracy.py then applies the measured factors to
# the runs it covers); the log to OUT_DIR.
# MODELS ("name:item,item ...", item MBxSEQ or tokens T): other models and batches instead (the
# planner averages every probe of a device, v2 alone for biased models' GEMMs). TIMEOUT (120):
# the probe's limit.
# Without a GPU it runs the same models with every dimension divided by 16 (a dry run, ~12
# seconds; its document is cpu-mechanism and shrunk, which the planner does not use).
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
DEFAULT_MODELS="gpt2-1.5b:8x1024 gpt2-124m:1x1024,8x1024,32x1024 \
1.3b:1x1024,8x1024,32x1024,1x4096,2x4096,1x8192,1x32768 8b:1x4096,2x4096 \
llama3.1-8b:1x1024 llama2-7b:1x1024 qwen2.5-7b:1x1024"
status=0
MODEL_ARGS=()
for m in ${MODELS:-$DEFAULT_MODELS}; do MODEL_ARGS+=(--model "$m"); done
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" timeout -k 5 "${TIMEOUT:-120}" "$PY" \
  benchmarks/gemm_shapes_probe.py "$OUT/results" "${MODEL_ARGS[@]}" "${ARGS[@]}" 2>&1 | tee -a "$OUT/gemm-shapes.log" || status=$?
echo "probe exited with status $status" | tee -a "$OUT/gemm-shapes.log"
exit "$status"

#!/usr/bin/env bash
# The reference replica's engine alone on one GPU: prefill and decode-step times of the 1.3B
# model (bf16) at decode batches 1, 8 and 32 over 1024-token prompts, with cuDNN attention
# excluded (the engine's default) and allowed, to show what cuDNN's per-shape plans cost a
# serving loop whose shapes change every step. About 25 s per run on an H200.
#
#   scripts/gpu/serve_engine.sh OUT_DIR
#       -> OUT_DIR/serve_engine_step-{default,eager-prefill,cudnn,eager}.txt
#
# default: decode and prefill as CUDA graphs (the engine's default on CUDA); eager-prefill:
# decode as graphs, prefill eager; eager: neither.
#
# Without a GPU it runs the tiny model on the CPU (a dry run).
set -uo pipefail
OUT=${1:?usage: scripts/gpu/serve_engine.sh OUT_DIR}
mkdir -p "$OUT"
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH}
PY=${PYTHON:-python3}
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  ARGS=(--model 1.3b --dtype bfloat16 --batch 1,8,32 --prompt-len 1024)
else
  ARGS=(--model tiny --batch 1,8 --prompt-len 128 --steps 4)
fi
rc=0
timeout 60 $PY benchmarks/serve_engine_step.py "${ARGS[@]}" 2>&1 \
  | tee "$OUT/serve_engine_step-default.txt" || rc=1
timeout 60 $PY benchmarks/serve_engine_step.py "${ARGS[@]}" --no-prefill-graphs 2>&1 \
  | tee "$OUT/serve_engine_step-eager-prefill.txt" || rc=1
timeout 60 $PY benchmarks/serve_engine_step.py "${ARGS[@]}" --cudnn-attention --no-cuda-graphs \
  2>&1 | tee "$OUT/serve_engine_step-cudnn.txt" || rc=1
timeout 60 $PY benchmarks/serve_engine_step.py "${ARGS[@]}" --no-cuda-graphs 2>&1 \
  | tee "$OUT/serve_engine_step-eager.txt" || rc=1
exit $rc

#!/usr/bin/env bash
# The host's time per training step (the planner's host term for eager runs), one go: about
# 5 minutes on 1 H200 (18 short parlab train runs of ~15 s, most of it start-up).
#
#   scripts/gpu/host_step.sh OUT_DIR
#
# benchmarks/host_step_probe.py: parlab train on one rank of each measured one-GPU configuration
# below, with every layer, head, parameter tensor and the vocabulary kept and the width cut to
# 16 and 32 elements per head, so the step's time is the host's: FSDP and DDP of the 7B/8B
# models at 1 x 1024 with full recompute (0.29-0.43 s a step against 0.21-0.24 s of GPU work by
# the roofline), GPT-2 1.5B (8 x 1024), GPT-2 124M (1 x 1024: 22 ms a step over 9.7 ms of
# kernels; 8 x 1024) and the 1.3B (2 x 4096). One document,
# OUT_DIR/results/PAR-TRAINING-STATE/host-step-*.json, the log in OUT_DIR.
# RUNS ("STRATEGY:MODEL:MBxSEQ:RECOMPUTE ..."): other runs instead. HEAD_DIMS (16,32): the widths
# per head; 0 adds the model's own width, a real run of the configuration on the same machine
# (its document beside the calibration), e.g. HEAD_DIMS=16,0; empty: none. TOKENS (e.g. 32): the
# model at its own width on one sequence of that many tokens, the host's step with every
# parameter's host work in it (not written as a training run). Without a GPU: one gloo CPU
# rank on the small model (a dry run, ~1 minute).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/host_step.sh OUT_DIR}"
mkdir -p "$OUT/results"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "host_step.sh: $GPUS GPU(s), output $OUT" | tee "$OUT/host-step.log"
if [ "$GPUS" -ge 1 ]; then
  DEFAULT="fsdp:llama3.1-8b:1x1024:full fsdp:qwen2.5-7b:1x1024:full ddp:llama2-7b:1x1024:full
    fsdp:gpt2-1.5b:8x1024:none ddp:gpt2-1.5b:8x1024:none ddp:gpt2-124m:1x1024:none
    ddp:gpt2-124m:8x1024:none fsdp:1.3b:2x4096:none ddp:1.3b:2x4096:none"
  ARGS=(--steps 8 --warmup 3)
else
  DEFAULT="ddp:small:1x64:none"
  ARGS=(--steps 2 --warmup 1)
fi
RUN_ARGS=()
for r in ${RUNS:-$DEFAULT}; do RUN_ARGS+=(--run "$r"); done
CUDA_VISIBLE_DEVICES="${CUDA_VISIBLE_DEVICES:-0}" "$PY" benchmarks/host_step_probe.py \
  "$OUT/results" "${RUN_ARGS[@]}" "${ARGS[@]}" --head-dims "${HEAD_DIMS-16,32}" \
  --tokens "${TOKENS:-}" 2>&1 | tee -a "$OUT/host-step.log"

#!/usr/bin/env bash
# Training runs near the edge of one GPU's memory, to test the ledger's "can it fit" where it
# matters (benchmarks/plan_accuracy.py, benchmarks/ledger_state_accuracy.py), one go: about
# 4 minutes on 1 H200 (139.8 GiB).
#
#   scripts/gpu/fit_edge.sh OUT_DIR
#
# parlab train --nproc 1, bf16, micro-batch 1 x 1024, full recompute, 2 warm-up and 5 timed
# steps, AdamW: 16 B of states per parameter. The ledger's peaks (GiB) before the runs:
#
# - Llama-3.1 8B under FSDP on one rank: 119.7 (its DDP run, 135.4 with DDP's buckets,
#   ran out of memory: results/PAR-TRAINING-STATE/train-ddp-llama3.1-8b-20261201T032027-*);
# - Llama-2 7B (MHA, vocabulary 32000) under DDP: 113.6;
# - Qwen2.5 7B (GQA, biases on q/k/v, vocabulary 151936) under DDP: 128.5, and under FSDP:
#   113.5.
#
# RUNS ("strategy model [PYTORCH_CUDA_ALLOC_CONF];..."): other runs instead, each model name as
# on the GPU (the dry run maps every one to the small model), e.g.
# RUNS="fsdp llama3.1-8b;fsdp llama3.1-8b expandable_segments:True" to compare the caching
# allocator's default segments with expandable ones at the edge (the documents record
# alloc_retries, the allocator's cudaFree-and-retry count over the timed steps).
#
# Without a GPU the same commands run on the small model, one gloo rank (a dry run).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/fit_edge.sh OUT_DIR}"
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 1 ]; then
  L8=llama3.1-8b L7=llama2-7b Q7=qwen2.5-7b DT=bf16-compute SEQ=1024
else
  L8=small L7=small Q7=small DT=fp32 SEQ=64
fi
LOG="$OUT/fit-edge.log"
echo "fit_edge.sh: $GPUS GPU(s), models $L8 $L7 $Q7" | tee "$LOG"
status=0
train() {  # STRATEGY MODEL [ALLOC_CONF]: one run, its last lines in the log
  echo "== parlab train --strategy $1 --model $2 ${3:+(PYTORCH_CUDA_ALLOC_CONF=$3)}" | tee -a "$LOG"
  PYTORCH_CUDA_ALLOC_CONF="${3:-${PYTORCH_CUDA_ALLOC_CONF:-}}" timeout 200 "$PY" -m parlab train --nproc 1 --strategy "$1" --model "$2" --dtype "$DT" \
    --micro-batch 1 --seq "$SEQ" --recompute full --warmup 2 --steps 5 --timeout 150 \
    --results "$OUT/results" 2>&1 | grep -E "peak_memory|alloc_retries|peak_reserved|steps:|failed|ledger predicted|document" \
    | tee -a "$LOG" || status=$?
  if command -v nvidia-smi > /dev/null; then
    nvidia-smi --query-gpu=memory.used,memory.total --format=csv,noheader | tee -a "$LOG"
  fi
}
if [ -n "${RUNS:-}" ]; then
  IFS=';' read -r -a SPECS <<< "$RUNS"
  for r in "${SPECS[@]}"; do
    read -r strategy model conf <<< "$r"
    [ "$GPUS" -ge 1 ] || model=small
    train "$strategy" "$model" "${conf:-}"
  done
  exit "$status"
fi
train fsdp "$L8"
train ddp "$L7"
train ddp "$Q7"
train fsdp "$Q7"
exit "$status"

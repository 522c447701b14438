#!/usr/bin/env bash
# GPU evidence for PAR-TRAINING-STATE (issue 5): DDP, ZeRO-1/2/3, FSDP on the 1.3B model.
#
#   scripts/gpu/training.sh OUT_DIR
#
# Writes contract documents under OUT_DIR/results/PAR-TRAINING-STATE, the report
# (Markdown + PNG) beside them, and the log at OUT_DIR/training.log.
#
# On 2 GPUs (219 s on 2xH200 with the GPT-2 runs: results/logs/gpu-20261130T1542-run_all/summary.txt):
# torch DDP, parlab's ZeRO-1/2/3, FSDP2 on the 1.3B
# Llama-style model (hidden 2048, 24 layers, seq 4096, micro-batch 2, bf16 compute,
# fp32 params/grads/AdamW states, fused AdamW), 3 warm-up + 5 timed steps each; FSDP2
# with torch.compile if time allows; FSDP2 on the 8B model (micro-batch 1) as the
# second size for the ledger's peak-memory check; FSDP2 without reshard and with
# selective / full recompute while time is left; then the report.
# Without GPUs the same runs use the tiny model on 2 gloo CPU ranks (a dry run).
set -uo pipefail
OUT=${1:?usage: scripts/gpu/training.sh OUT_DIR}
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
LOG="$OUT/training.log"
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$NGPU" -ge 2 ]; then
  BIG=(--model 1.3b --nproc 2 --micro-batch 2 --seq 4096 --dtype bf16-compute --warmup 3 --steps 5 --timeout 90)
  SECOND=(--model 8b --nproc 2 --micro-batch 1 --seq 4096 --dtype bf16-compute --warmup 3 --steps 5 --timeout 90)
  THIRD=(--model gpt2-1.5b --nproc 2 --micro-batch 8 --seq 1024 --dtype bf16-compute --warmup 3 --steps 5 --timeout 90)
else
  echo "no 2 GPUs here: dry run on the tiny model, 2 gloo CPU ranks" | tee -a "$LOG"
  BIG=(--model tiny --nproc 2 --micro-batch 2 --seq 64 --warmup 1 --steps 2 --timeout 60)
  SECOND=(--model small --nproc 2 --micro-batch 1 --seq 64 --warmup 1 --steps 2 --timeout 60)
  THIRD=(--model gpt2-124m --nproc 2 --micro-batch 1 --seq 64 --warmup 1 --steps 2 --timeout 60)
fi

parlab() {
  echo "+ parlab $*" | tee -a "$LOG"
  local t0=$SECONDS
  $PY -m parlab "$@" --results "$OUT/results" 2>&1 | tee -a "$LOG"
  echo "  ($((SECONDS - t0)) s; total $SECONDS s)" | tee -a "$LOG"
}

# TRAIN_STRATEGIES: the 1.3B runs (default all five); TRAIN_SIZES=0 skips the other sizes,
# TRAIN_8B=0 the 8B run, TRAIN_THIRD the strategies at GPT-2 1.5B (default: ddp fsdp)
for s in ${TRAIN_STRATEGIES:-ddp zero1 zero2 zero3 fsdp}; do
  parlab train --strategy "$s" "${BIG[@]}"
done
# TRAIN_MASTER="zero1 zero2": those ZeRO stages again with --dtype bf16-params (bf16 params and
# grads, fp32 master shards: DeepSpeed's bf16 recipe), the same shape
for s in ${TRAIN_MASTER:-}; do
  parlab train --strategy "$s" "${BIG[@]/bf16-compute/bf16-params}"
done
# TRAIN_DEEPSPEED="1 2 3": DeepSpeed's ZeRO stages (--strategy deepspeed-zeroK, bf16 params with
# fp32 master partitions) at the same shape, where DeepSpeed imports (carried as wheels: .whl/)
if [ -n "${TRAIN_DEEPSPEED:-}" ]; then
  if $PY -c "import deepspeed" >/dev/null 2>&1; then
    for k in $TRAIN_DEEPSPEED; do
      parlab train --strategy "deepspeed-zero$k" "${BIG[@]}"
    done
  else
    echo "skipped deepspeed-zero $TRAIN_DEEPSPEED: deepspeed does not import here" | tee -a "$LOG"
  fi
fi
if [ "${TRAIN_SIZES:-1}" = 1 ]; then
  if [ "${TRAIN_8B:-1}" = 1 ]; then
    parlab train --strategy fsdp "${SECOND[@]}"
  fi
  # a second size (and architecture: GPT-2 style, LayerNorm + GeLU) for DDP's and FSDP's peaks
  for s in ${TRAIN_THIRD:-ddp fsdp}; do
    parlab train --strategy "$s" "${THIRD[@]}"
  done
fi
if [ "$SECONDS" -lt "${COMPILE_UNTIL:-200}" ]; then
  parlab train --strategy fsdp --compile "${BIG[@]}" --timeout 120
else
  echo "skipped fsdp --compile: $SECONDS s already spent" | tee -a "$LOG"
fi
# FSDP's knobs, each only while time is left (about 30 s a run on GPUs).
for knobs in "--no-reshard" "--recompute selective" "--recompute full"; do
  if [ "$SECONDS" -lt "${EXTRAS_UNTIL:-240}" ]; then
    # shellcheck disable=SC2086
    parlab train --strategy fsdp "${BIG[@]}" $knobs
  else
    echo "skipped fsdp $knobs: $SECONDS s already spent" | tee -a "$LOG"
  fi
done
parlab project training-state --report-only
echo "done in $SECONDS s; report: $OUT/results/PAR-TRAINING-STATE/training-state.md" | tee -a "$LOG"

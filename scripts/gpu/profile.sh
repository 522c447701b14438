#!/usr/bin/env bash
# T5 (issue 9) GPU evidence: torch.profiler on both ranks of real training runs of the 1.3B
# reference model, analysed into overlap, exposed communication, idle, hotspots, stragglers.
#
#   scripts/gpu/profile.sh OUT_DIR
#
# Run from the repository root. With 2+ GPUs (bf16, seq 4096, micro-batch 2 per rank; each
# configuration: 1 wait + 1 warm-up + 2 profiled steps; about 2 min on 2xH200 in all):
#   1. DDP bucket sweep, bucket_cap_mb 1, 25 (torch's default: the plain DDP run), 250;
#   2. FSDP2 per block: with/without explicit prefetch x reshard_after_forward on/off;
#   3. TP over both GPUs without and with sequence parallelism (seq 2048, last: optional).
# Without GPUs: the same commands on the tiny model on 2 gloo CPU ranks (a dry run).
# Documents, merged traces (gzip), timeline and sweep PNGs and hotspot texts go to
# OUT_DIR/results; logs to OUT_DIR. The raw per-rank traces go to a temporary folder and are
# deleted at the end (KEEP_TRACES=1 keeps them under OUT_DIR/traces).
set -euo pipefail
OUT=${1:?usage: scripts/gpu/profile.sh OUT_DIR}
mkdir -p "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RES="$OUT/results"
PARLAB=("$PY" -m parlab)
if [ "${KEEP_TRACES:-0}" = 1 ]; then TR="$OUT/traces"; else TR=$(mktemp -d /tmp/parlab-profile-XXXXXX); fi
trap '[ "${KEEP_TRACES:-0}" = 1 ] || rm -rf "$TR"' EXIT

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -ge 2 ]; then
  BIG=(--model 1.3b --micro-batch 2 --seq 4096 --nproc 2 --backend nccl)
  TP=(--model 1.3b --micro-batch 2 --seq 2048 --nproc 2 --backend nccl)
  TRAIN=(--model 1.3b --nproc 2 --micro-batch 2 --seq 4096 --dtype bf16-compute --warmup 3 --steps 3 --timeout 90)
  BUCKETS=1,25,250
else
  echo "no 2 GPUs here: dry run on the tiny model, 2 gloo CPU ranks"
  BIG=(--model tiny --micro-batch 2 --seq 64 --nproc 2 --backend gloo)
  TP=(--model tiny --micro-batch 2 --seq 64 --nproc 2 --backend gloo)
  TRAIN=(--model tiny --nproc 2 --micro-batch 2 --seq 64 --warmup 3 --steps 3 --timeout 60)
  BUCKETS=0.01,0.1,1
fi

t0=$(date +%s)
# 1. DDP: exposed all-reduce against bucket_cap_mb (25 MB is the plain DDP run)
if [ "${SKIP_DDP:-0}" != 1 ]; then
  "${PARLAB[@]}" profile ddp-buckets --buckets "$BUCKETS" "${BIG[@]}" --trace-dir "$TR/ddp" \
    --results "$RES" 2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears events" | tee "$OUT/profile-ddp.log"
  echo "ddp sweep done after $(( $(date +%s) - t0 )) s"
fi

# 2. FSDP2: prefetch and reshard_after_forward (skipped when SKIP_FSDP=1)
if [ "${SKIP_FSDP:-0}" != 1 ]; then
  "${PARLAB[@]}" profile fsdp "${BIG[@]}" --trace-dir "$TR/fsdp" --results "$RES" \
    2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears events" | tee "$OUT/profile-fsdp.log"
  echo "fsdp done after $(( $(date +%s) - t0 )) s"
fi

# 2b. PROFILE_TRAIN="fsdp ddp ...": parlab train's own loop (the runs of PAR-TRAINING-STATE,
# 1.3B, micro-batch 2 x 4096, bf16) under parlab profile run, steps 2-3 of 3 warm-up + 3
for s in ${PROFILE_TRAIN:-}; do
  "${PARLAB[@]}" profile run --nproc "${TRAIN_NPROC:-2}" --schedule 1,1,2 --trace-dir "$TR/train-$s" \
    --results "$RES" --project PAR-TRAINING-STATE -- \
    parlab train --strategy "$s" "${TRAIN[@]}" --results "$RES" \
    2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears events" | tee "$OUT/profile-train-$s.log"
  echo "train $s done after $(( $(date +%s) - t0 )) s"
done

# 3. TP without and with sequence parallelism (skipped when SKIP_TP=1)
if [ "${SKIP_TP:-0}" != 1 ]; then
  "${PARLAB[@]}" profile tp "${TP[@]}" --trace-dir "$TR/tp" --results "$RES" \
    2>&1 | grep -v -e USDT -e _warn_once -e "Profiler clears events" | tee "$OUT/profile-tp.log"
  echo "tp done after $(( $(date +%s) - t0 )) s"
fi

"${PARLAB[@]}" results "$RES" --project PAR-TRAINING-STATE 2>&1 | tail -n 30 | tee "$OUT/profile-results.log"
echo "profile.sh finished in $(( $(date +%s) - t0 )) s"

#!/usr/bin/env bash
# PAR-MOE-EXPERT (issue 7) GPU evidence: EP2 all-to-all dispatch/combine against a plain
# all_to_all at the same payload, uniform and Zipf-skewed routing, overflow sweep, learned routing.
#
#   scripts/gpu/moe.sh OUT_DIR
#
# Run from the repository root. With 2+ GPUs: hidden 4096, bf16, 16 and 64 experts, top-2,
# 16384 tokens per rank (~1.5 min on 2xH200). Without GPUs: the same commands at tiny sizes on
# gloo CPU ranks (a dry run). Documents go to OUT_DIR/results, logs to OUT_DIR.
set -euo pipefail
OUT=${1:?usage: scripts/gpu/moe.sh OUT_DIR}
mkdir -p "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RES="$OUT/results"

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -ge 2 ]; then
  SIZE=(--hidden 4096 --ffn-hidden 2048 --tokens 16384 --warmup 3 --iters 10)
  TRAIN=(--train-steps 10)
  CAL=(-b 4MiB -e 512MiB -f 2 -d bf16 -w 5 -n 20)
else
  echo "no 2 GPUs here: dry run at tiny sizes on gloo CPU ranks"
  SIZE=(--hidden 64 --ffn-hidden 128 --tokens 256 --warmup 1 --iters 2)
  TRAIN=(--train-steps 3)
  CAL=(-b 16KiB -e 256KiB -f 4 -w 1 -n 3)
fi

t0=$(date +%s)
FAILED=0
step() {  # step LOG COMMAND...: run, keep the log, go on after a failure
  local log="$1"; shift
  echo "+ $*"
  if ! "$@" 2>&1 | tee "$OUT/$log"; then
    echo "moe.sh: step failed: $*" | tee -a "$OUT/moe-failures.log"
    FAILED=1
  fi
}

# 1. the collective calibration: all_to_all busbw as `parlab collectives` measures it
step moe-collectives.log $PY -m parlab collectives --op all_to_all "${CAL[@]}" --nproc 2 \
  --results "$RES"

SWEEP=$(ls -t "$RES"/PAR-COLLECTIVES/collectives-*.json 2>/dev/null | grep -v calibration | head -1 || true)
if [ -n "$SWEEP" ]; then  # its alpha-beta fit: a prediction of the dispatch time
  step moe-collectives-fit.log $PY -m parlab collectives --fit "$SWEEP" --results "$RES"
fi

# 2. 16 experts, top-2, capacity 1.25 by position: uniform and Zipf 1.2 (hot experts on rank 0),
#    the naive all-gather path beside, the overflow sweep, learned routing (none / aux / bias)
step moe-e16.log $PY -m parlab project moe --ep 2 --experts 16 --topk 2 --capacity-factor 1.25 \
  --drop position --skew zipf:1.2 "${SIZE[@]}" "${TRAIN[@]}" --results "$RES"

# 3. 64 experts, top-2, dropless: how skew alone moves the slowest rank and the exchange
step moe-e64.log $PY -m parlab project moe --ep 2 --experts 64 --topk 2 --drop none \
  --skew zipf:0.8,zipf:1.5 "${SIZE[@]}" --train-steps 0 --no-naive --results "$RES"

step moe-results.log $PY -m parlab results "$RES" --project PAR-MOE-EXPERT
grep -h "^Target" "$RES"/PAR-MOE-EXPERT/*-report.md 2>/dev/null | tee "$OUT/moe-targets.log" || true
echo "moe.sh done in $(( $(date +%s) - t0 )) s; reports: $RES/PAR-MOE-EXPERT/*-report.md"
exit $FAILED

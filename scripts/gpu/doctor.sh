#!/usr/bin/env bash
# parlab doctor (issue 12) GPU evidence: every reproduction beside its healthy twin, on NCCL.
#
#   scripts/gpu/doctor.sh OUT_DIR
#
# Run from the repository root. With 2+ GPUs (~4 min on 2xH200 for all six; DOCTOR_CASES=
# "slow-link collective-timeout pp-bubble" ~2 min):
#   - slow-link: `parlab collectives` all_reduce/all_gather 1 MiB-1 GiB with NCCL_P2P_DISABLE=1
#     against the same sweep without it (the GPU-only case);
#   - ddp-small-buckets, pp-bubble, moe-skew, oom-activations at GPU sizes;
#   - collective-timeout with the NCCL flight recorder on (TORCH_FR_BUFFER_SIZE), its
#     dumps kept in OUT_DIR/flight-recorder and read with torch's fr_trace where it exists;
#   - `parlab doctor` over every folder written.
# Without GPUs: the CPU reproductions at tiny sizes on gloo ranks (a dry run; slow-link is
# refused with exit 2, as it must be). Documents go to OUT_DIR/results/<case>/{case,healthy},
# logs to OUT_DIR.
set -euo pipefail
OUT=${1:?usage: scripts/gpu/doctor.sh OUT_DIR}
mkdir -p "$OUT/results" "$OUT/flight-recorder"
OUT=$(cd "$OUT" && pwd)
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RES="$OUT/results"

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
[ "$NGPU" -ge 2 ] || echo "no 2 GPUs here: dry run of the CPU reproductions on gloo CPU ranks"

t0=$(date +%s)
FAILED=0
step() {  # step LOG COMMAND...: run, keep the log, go on after a failure
  local log="$1"; shift
  echo "+ $*"
  set +e
  "$@" 2>&1 | tee "$OUT/$log"
  local rc=${PIPESTATUS[0]}
  set -e
  echo "rc=$rc" | tee -a "$OUT/$log"
  if [ "$rc" -ne 0 ]; then
    echo "doctor.sh: step rc=$rc: $*" | tee -a "$OUT/doctor-failures.log"
    FAILED=1
  fi
}

# Reproductions in order of value (set DOCTOR_CASES to run fewer): the GPU-only case, the
# hang with the flight recorder, then the ones that also run on CPU, at GPU sizes here.
CASES=${DOCTOR_CASES:-slow-link collective-timeout pp-bubble ddp-small-buckets moe-skew oom-activations}
for case in $CASES; do
  if [ "$case" = slow-link ] && [ "$NGPU" -lt 2 ]; then
    set +e; $PY -m parlab doctor --reproduce slow-link --out "$RES/slow-link" \
      > "$OUT/doctor-slow-link.log" 2>&1; rc=$?; set -e
    echo "slow-link on CPU: rc=$rc (2 expected): $(tail -1 "$OUT/doctor-slow-link.log")"
  elif [ "$case" = collective-timeout ]; then
    # rank 1 skips an all-reduce, rank 0 waits; each rank dumps its flight recorder
    TORCH_FR_BUFFER_SIZE=2000 TORCH_NCCL_DUMP_ON_TIMEOUT=1 \
    TORCH_NCCL_DEBUG_INFO_TEMP_FILE="$OUT/flight-recorder/nccl_trace_rank_" \
      step doctor-collective-timeout.log $PY -m parlab doctor --reproduce collective-timeout \
      --out "$RES/collective-timeout"
    ls -la "$OUT/flight-recorder" | tee "$OUT/flight-recorder.log"
    if ls "$OUT"/flight-recorder/nccl_trace_rank_* >/dev/null 2>&1; then
      set +e
      timeout 60 $PY -m torch.distributed.flight_recorder.fr_trace "$OUT/flight-recorder" \
        -p nccl_trace_rank_ >> "$OUT/flight-recorder.log" 2>&1
      echo "fr_trace rc=$?" | tee -a "$OUT/flight-recorder.log"
      set -e
    fi
  else
    step "doctor-$case.log" $PY -m parlab doctor --reproduce "$case" --out "$RES/$case"
  fi
done

# the doctor over everything written (one folder per reproduction and twin)
for d in "$RES"/*/case "$RES"/*/healthy; do
  [ -d "$d" ] && step "doctor-$(basename "$(dirname "$d")")-$(basename "$d").log" \
    $PY -m parlab doctor "$d" --json > /dev/null
done
echo "doctor.sh done in $(( $(date +%s) - t0 )) s; documents under $RES"
exit $FAILED

#!/usr/bin/env bash
# PAR-COLLECTIVES (issue 4, T1) GPU evidence: env precheck, the full sweep of every op,
# the small-message all_reduce sweep with and without CUDA graphs, the same small sweep and
# the 64 MiB - 1 GiB all_reduce issued by NCCL called directly (--via nccl: no c10d), a bf16
# sweep, the alpha-beta fit (calibration), the T1 tables from it, and the comparison with
# nccl-tests (per path, with c10d's cost per call as the difference).
#
#   scripts/gpu/collectives.sh OUT_DIR
#
# Run from the repository root. With 2+ GPUs: every op 8 B - 8 GiB (x2), fp32, 5 warm-up +
# 20 timed iterations per size (nccl-tests' defaults); about 2-2.5 min on 2xH200 in all
# (each parlab command pays ~10 s of torchrun + NCCL start-up). Without GPUs: the same
# commands at tiny sizes on gloo CPU ranks (a dry run). A step that fails is reported and
# the rest still run; the script exits non-zero at the end if any failed.
# Documents (and the busbw plots beside them) go to OUT_DIR/results, logs to OUT_DIR.
#
#   COLLECTIVES_ONLY=small  only the small all_reduce sweeps (torch and direct, eager and
#                           graph, and the flight-recorder run) and the comparison: ~70 s
#   COLLECTIVES_VIA_NCCL=0  leave out the --via nccl steps (default 1: run them; each is
#                           bounded by a 60 s SIGINT, since the direct path has no watchdog)
set -uo pipefail
OUT=${1:?usage: scripts/gpu/collectives.sh OUT_DIR}
mkdir -p "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RES="$OUT/results"
FAILED=()

# run NAME CMD...: run one step, log it to OUT/collectives-NAME.log, remember a failure
run() {
  local name=$1
  shift
  echo "== $name: $*"
  "$@" 2>&1 | tee "$OUT/collectives-$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "== step $name failed (rc=$rc)"
    FAILED+=("$name")
  fi
}
newest() { ls -t "$RES"/PAR-COLLECTIVES/$1 2>/dev/null | head -1; }

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -ge 2 ]; then
  FULL=(-b 8 -e 8GiB -f 2 -w 5 -n 20)
  SMALL=(-b 8 -e 256KiB -f 2 -w 50 -n 500)
  BF16=(-b 1MiB -e 4GiB -f 4 -w 5 -n 20 -d bf16)
else
  echo "no 2 GPUs here: dry run at tiny sizes on gloo CPU ranks (no --graph)"
  FULL=(-b 8 -e 256KiB -f 8 -w 1 -n 3)
  SMALL=(-b 8 -e 4KiB -f 8 -w 1 -n 5)
  BF16=(-b 1KiB -e 64KiB -f 8 -w 1 -n 3 -d bf16)
fi
P=("$PY" -m parlab)

t0=$(date +%s)
# COLLECTIVES_ONLY=small: only step 3 and the comparison with the reference (about 40 s)
ONLY=${COLLECTIVES_ONLY:-all}
FULL_DOC=""
if [ "$ONLY" != small ]; then
  # 1. what the machine is: versions, GPUs, NVLink matrix (the link peak), a checked all-reduce
  run env "${P[@]}" env --results "$RES"

  # 2. every op, 8 B - 8 GiB, checked and timed (the busbw plot lands beside the document)
  run full "${P[@]}" collectives --op all "${FULL[@]}" --nproc 2 --results "$RES"
  FULL_DOC=$(newest 'collectives-2*.json')
  echo "== full sweep: ${FULL_DOC:-none} after $(( $(date +%s) - t0 )) s"
  # 2b. large all_reduce issued by NCCL directly: the busbw c10d reaches, against NCCL's own
  if [ "${COLLECTIVES_VIA_NCCL:-1}" = 1 ] && [ "$NGPU" -ge 2 ]; then
    run big-nccl timeout -s INT -k 15 60 "${P[@]}" collectives --op all_reduce -b 64MiB -e 1GiB \
      -f 2 -w 5 -n 20 --via nccl --nproc 2 --results "$RES"
  fi
fi

# 3. small all_reduce: host launch included (as nccl-tests without -G), then CUDA-graph replays.
#    parlab's sweeps run without torch's flight recorder (TORCH_FR_BUFFER_SIZE=0) and, under
#    --graph, without NCCL's graph mixing (NCCL_GRAPH_MIXING_SUPPORT=0); the small-fr run puts
#    the flight recorder back (torch's default buffer) to show what it costs per op.
run small "${P[@]}" collectives --op all_reduce "${SMALL[@]}" --nproc 2 --results "$RES"
if [ "$NGPU" -ge 2 ]; then
  run small-graph "${P[@]}" collectives --op all_reduce "${SMALL[@]}" --graph --nproc 2 \
    --results "$RES"
  run small-fr env TORCH_FR_BUFFER_SIZE=2000 "${P[@]}" collectives --op all_reduce "${SMALL[@]}" \
    --nproc 2 --results "$RES"
fi
# 3b. the same small all_reduce issued by NCCL called directly (ctypes, no c10d): NCCL's own
#     time per op, eager and in a CUDA graph; step 3 minus this is c10d's cost per call
VIA_NCCL=${COLLECTIVES_VIA_NCCL:-1}
DIRECT=(timeout -s INT -k 15 60)  # no c10d watchdog on this path: the shell bounds it
if [ "$VIA_NCCL" = 1 ] && [ "$NGPU" -ge 2 ]; then
  run small-nccl "${DIRECT[@]}" "${P[@]}" collectives --op all_reduce "${SMALL[@]}" --via nccl \
    --nproc 2 --results "$RES"
  run small-nccl-graph "${DIRECT[@]}" "${P[@]}" collectives --op all_reduce "${SMALL[@]}" \
    --via nccl --graph --nproc 2 --results "$RES"
elif [ "$VIA_NCCL" = 1 ]; then
  echo "== small-nccl: skipped (--via nccl calls NCCL directly: needs 2 GPUs; this is a CPU dry run)"
fi
if [ "$ONLY" = small ]; then
  run vs-reference "$PY" benchmarks/collectives_vs_nccl_tests.py "$RES"
  echo "== collectives.sh (small only) done in $(( $(date +%s) - t0 )) s; failed: ${FAILED[*]:-none}"
  [ "${#FAILED[@]}" -eq 0 ]
  exit
fi

# 4. bf16, the training dtype, for the collectives training uses
run bf16 "${P[@]}" collectives --op all_reduce,all_gather,reduce_scatter "${BF16[@]}" --nproc 2 \
  --results "$RES"

# 5. the alpha-beta fit of the full sweep: the calibration the planner loads
if [ -n "$FULL_DOC" ]; then
  run fit "${P[@]}" collectives --fit "$FULL_DOC" --results "$RES"
fi
CAL=$(newest 'collectives-calibration-*.json')

# 6. the T1 tables from that calibration (the catalog link bandwidth, labelled, without one)
CALOPT=()
[ -n "$CAL" ] && CALOPT=(--calibration "$CAL")
run t1-fsdp "${P[@]}" collectives --explain 1.3b --layout dp=2 --strategy fsdp --micro-batch 2 \
  --seq 4096 "${CALOPT[@]}" --gpus H200 --results "$RES"
run t1-tp "${P[@]}" collectives --explain 1.3b --layout tp=2 --micro-batch 2 --seq 4096 \
  "${CALOPT[@]}" --gpus H200 --results "$RES"
echo "== parlab evidence done after $(( $(date +%s) - t0 )) s"

# 7. the comparison with nccl-tests: first against the external reference figures, then (where
#    nccl-tests is installed here) against nccl-tests run on this machine with NVLS off
run vs-reference "$PY" benchmarks/collectives_vs_nccl_tests.py "$RES"
NT_LOGS=()
left() { echo $(( 210 - ($(date +%s) - t0) )); }  # seconds left of the 3.5-minute budget
if [ "$NGPU" -ge 2 ]; then
  for b in all_reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf broadcast_perf \
           reduce_perf sendrecv_perf; do
    if command -v "$b" >/dev/null 2>&1 && [ "$(left)" -gt 20 ]; then
      timeout 15 "$b" -b 64M -e 4G -f 2 -g "$NGPU" > "$OUT/nccl-tests-$b.log" 2>&1
      NT_LOGS+=("$OUT/nccl-tests-$b.log")
    fi
  done
  if command -v all_reduce_perf >/dev/null 2>&1 && [ "$(left)" -gt 35 ]; then
    timeout 15 all_reduce_perf -b 8 -e 256K -f 2 -g "$NGPU" -w 50 -n 500 \
      > "$OUT/nccl-tests-all_reduce_perf-small.log" 2>&1
    timeout 15 all_reduce_perf -b 8 -e 256K -f 2 -g "$NGPU" -w 50 -n 500 -G 1 \
      > "$OUT/nccl-tests-all_reduce_perf-small-graph.log" 2>&1
    NT_LOGS+=("$OUT/nccl-tests-all_reduce_perf-small.log")
    NT_LOGS+=("$OUT/nccl-tests-all_reduce_perf-small-graph.log")
  fi
fi
if [ "${#NT_LOGS[@]}" -gt 0 ]; then
  run vs-nccl-tests "$PY" benchmarks/collectives_vs_nccl_tests.py "$RES" --nccl-tests "${NT_LOGS[@]}"
else
  echo "== nccl-tests is not installed here: compared with the external reference only"
fi

"${P[@]}" results "$RES" --project PAR-COLLECTIVES
echo "== collectives.sh done in $(( $(date +%s) - t0 )) s; failed steps: ${FAILED[*]:-none}"
[ "${#FAILED[@]}" -eq 0 ]

#!/usr/bin/env bash
# PAR-COLLECTIVES (issue 4, T1) GPU evidence: env precheck, the full sweep of every op,
# the small-message all_reduce sweep with and without CUDA graphs, a bf16 sweep, the
# alpha-beta fit (calibration), the T1 tables from it, and the comparison with nccl-tests.
#
#   scripts/gpu/collectives.sh OUT_DIR
#
# Run from the repository root. With 2+ GPUs: every op 8 B - 8 GiB (x2), fp32, 5 warm-up +
# 20 timed iterations per size (nccl-tests' defaults); about 1.5-2 min on 2xH200 in all.
# Without GPUs: the same commands at tiny sizes on gloo CPU ranks (a dry run).
# Documents (and the busbw plots beside them) go to OUT_DIR/results, logs to OUT_DIR.
set -euo pipefail
OUT=${1:?usage: scripts/gpu/collectives.sh OUT_DIR}
mkdir -p "$OUT/results"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
RES="$OUT/results"
PARLAB=("$PY" -m parlab)

NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -ge 2 ]; then
  FULL=(-b 8 -e 8GiB -f 2 -w 5 -n 20)
  SMALL=(-b 8 -e 256KiB -f 2 -w 50 -n 500)
  BF16=(-b 1MiB -e 4GiB -f 4 -w 5 -n 20 -d bfloat16)
  NP=2
else
  echo "no 2 GPUs here: dry run at tiny sizes on gloo CPU ranks (no --graph)"
  FULL=(-b 8 -e 256KiB -f 8 -w 1 -n 3)
  SMALL=(-b 8 -e 4KiB -f 8 -w 1 -n 5)
  BF16=(-b 1KiB -e 64KiB -f 8 -w 1 -n 3 -d bfloat16)
  NP=2
fi
newest() { ls -t "$RES"/PAR-COLLECTIVES/collectives-2*.json | head -1; }

t0=$(date +%s)
# 1. what the machine is: versions, GPUs, NVLink matrix (the link peak), a checked all-reduce
"${PARLAB[@]}" env --results "$RES" 2>&1 | tee "$OUT/collectives-env.log"

# 2. every op, 8 B - 8 GiB, checked and timed (the busbw plot lands beside the document)
"${PARLAB[@]}" collectives --op all "${FULL[@]}" --nproc "$NP" --results "$RES" \
  2>&1 | tee "$OUT/collectives-full.log"
FULL_DOC=$(newest)
echo "full sweep: $FULL_DOC after $(( $(date +%s) - t0 )) s"

# 3. small all_reduce: host launch included (as nccl-tests without -G), then CUDA-graph replays
"${PARLAB[@]}" collectives --op all_reduce "${SMALL[@]}" --nproc "$NP" --results "$RES" \
  2>&1 | tee "$OUT/collectives-small.log"
if [ "$NGPU" -ge 2 ]; then
  "${PARLAB[@]}" collectives --op all_reduce "${SMALL[@]}" --graph --nproc "$NP" --results "$RES" \
    2>&1 | tee "$OUT/collectives-small-graph.log"
fi

# 4. bf16, the training dtype, for the collectives training uses
"${PARLAB[@]}" collectives --op all_reduce,all_gather,reduce_scatter "${BF16[@]}" --nproc "$NP" \
  --results "$RES" 2>&1 | tee "$OUT/collectives-bf16.log"

# 5. the alpha-beta fit of the full sweep: the calibration the planner loads
"${PARLAB[@]}" collectives --fit "$FULL_DOC" --results "$RES" 2>&1 | tee "$OUT/collectives-fit.log"
CAL=$(ls -t "$RES"/PAR-COLLECTIVES/collectives-calibration-*.json | head -1)

# 6. the T1 tables from that calibration
"${PARLAB[@]}" collectives --explain 1.3b --layout dp=2 --strategy fsdp --micro-batch 2 --seq 4096 \
  --calibration "$CAL" --results "$RES" 2>&1 | tee "$OUT/collectives-t1-fsdp.log"
"${PARLAB[@]}" collectives --explain 1.3b --layout tp=2 --micro-batch 2 --seq 4096 \
  --calibration "$CAL" --results "$RES" 2>&1 | tee "$OUT/collectives-t1-tp.log"

# 7. nccl-tests on the same machine, where it is installed (NVLS off, as above), then the comparison
NT_LOGS=()
for b in all_reduce_perf all_gather_perf reduce_scatter_perf alltoall_perf broadcast_perf \
         reduce_perf sendrecv_perf; do
  if [ "$NGPU" -ge 2 ] && command -v "$b" >/dev/null 2>&1; then
    timeout 20 "$b" -b 64M -e 4G -f 2 -g "$NGPU" > "$OUT/nccl-tests-$b.log" 2>&1 || true
    NT_LOGS+=("$OUT/nccl-tests-$b.log")
  fi
done
if [ "$NGPU" -ge 2 ] && command -v all_reduce_perf >/dev/null 2>&1; then
  timeout 20 all_reduce_perf -b 8 -e 256K -f 2 -g "$NGPU" -w 50 -n 500 \
    > "$OUT/nccl-tests-all_reduce_perf-small.log" 2>&1 || true
  timeout 20 all_reduce_perf -b 8 -e 256K -f 2 -g "$NGPU" -w 50 -n 500 -G 1 \
    > "$OUT/nccl-tests-all_reduce_perf-small-graph.log" 2>&1 || true
  NT_LOGS+=("$OUT/nccl-tests-all_reduce_perf-small.log" "$OUT/nccl-tests-all_reduce_perf-small-graph.log")
fi
$PY benchmarks/collectives_vs_nccl_tests.py "$RES" ${NT_LOGS[@]+--nccl-tests "${NT_LOGS[@]}"} \
  2>&1 | tee "$OUT/collectives-vs-nccl-tests.log"

"${PARLAB[@]}" results "$RES" --project PAR-COLLECTIVES 2>&1 | tee "$OUT/collectives-results.log"
echo "collectives.sh done in $(( $(date +%s) - t0 )) s"

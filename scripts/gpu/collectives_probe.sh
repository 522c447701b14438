#!/usr/bin/env bash
# Small-message all_reduce latency probe (issue 4 follow-up): which way of issuing a small
# all_reduce closes the gap to nccl-tests (parlab eager ~26 us vs ~21; --graph ~41 us vs 5.5-8).
#
#   scripts/gpu/collectives_probe.sh OUT_DIR
#
# Run from the repository root. Three torchrun runs of benchmarks/collectives_small_probe.py
# on 2 ranks (NCCL on 2 GPUs; gloo CPU ranks at the same sizes when there are no 2 GPUs, where
# the graph variants are listed as skipped):
#   1. default environment, every variant (eager and graph);
#   2. NCCL_GRAPH_MIXING_SUPPORT=0, graph variants only;
#   3. NCCL_GRAPH_REGISTER=0, graph variants only.
# The NCCL variables are read once per process, so each environment is a fresh process.
# About 35-50 s on 2xH200 (each run pays ~10 s of torchrun + NCCL start-up); the runs are
# capped at 30, 20 and 20 s (a hung capture costs at most 70 s in all; the rows measured
# before it are kept, the JSON is rewritten after every row). Tables: OUT_DIR/collectives_small_probe-<tag>.json, logs:
# OUT_DIR/collectives-probe-<tag>.log. A failed run is reported and the rest still run; the
# script exits non-zero at the end if any failed.
set -uo pipefail
OUT=${1:?usage: scripts/gpu/collectives_probe.sh OUT_DIR}
mkdir -p "$OUT"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY=${PYTHON:-python3}
FAILED=()

# probe TAG ONLY LIMIT_S [VAR=VALUE ...]: one fresh torchrun of the probe in that environment
probe() {
  local tag=$1 only=$2 limit=$3
  shift 3
  echo "== probe $tag ($only) ${*:-default environment}"
  env "$@" timeout -k 5 "$limit" "$PY" -m torch.distributed.run --standalone --nproc-per-node=2 \
    benchmarks/collectives_small_probe.py --out "$OUT" --tag "$tag" --only "$only" 2>&1 \
    | tee "$OUT/collectives-probe-$tag.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    echo "== probe $tag failed (rc=$rc)"
    FAILED+=("$tag")
  fi
}

t0=$(date +%s)
probe default all 30
NGPU=$($PY -c "import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)")
if [ "$NGPU" -ge 2 ]; then
  probe no-graph-mixing graph 20 NCCL_GRAPH_MIXING_SUPPORT=0
  probe no-graph-register graph 20 NCCL_GRAPH_REGISTER=0
else
  echo "== no 2 GPUs here: the graph-only environment runs are skipped (graphs need CUDA)"
fi
echo "== collectives_probe.sh done in $(( $(date +%s) - t0 )) s; failed: ${FAILED[*]:-none}"
[ "${#FAILED[@]}" -eq 0 ]

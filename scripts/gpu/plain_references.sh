#!/usr/bin/env bash
# The plain torch baselines of issues 5 and 6, measured on this machine: an estimated 2-4
# minutes on 2 GPUs (not timed yet: six torchrun launches, the compiled one the longest, each
# capped at 150 s; 40-65 s for the CPU dry run).
#
#   scripts/gpu/plain_references.sh OUT_DIR
#
# benchmarks/plain_references.py on the 1.3B Llama-style model (hidden 2048, 24 layers,
# 16 heads, seq 4096), 3 warm-up + 10 timed steps each:
#   fsdp            FSDP2, fp32 params, bf16 param_dtype / fp32 reduce_dtype, micro-batch 2
#   fsdp-compile    the same with torch.compile on each block
#   ddp             DDP, fp32 params, bf16 autocast, micro-batch 2
#   pp-1f1b         torch.distributed.pipelining PP2 Schedule1F1B, bf16 params,
#                   8 micro-batches of 1 x 4096
#   pp-gpipe        the same with ScheduleGPipe
#   pp-interleaved  ScheduleInterleaved1F1B, 2 stages per rank
# Each writes OUT_DIR/plain-<name>.json and OUT_DIR/plain-<name>.log; a failed or timed-out
# run is noted and the next one runs. Then a summary table (also OUT_DIR/plain-summary.txt).
# With fewer than 2 GPUs the same runs use the tiny model on 2 gloo CPU ranks (a dry run).
set -uo pipefail
OUT=${1:?usage: scripts/gpu/plain_references.sh OUT_DIR}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONPATH=src
PY=${PYTHON:-python3}
if [ -z "${PYTHON:-}" ] && [ -x .venv/bin/python ]; then PY=.venv/bin/python; fi
NGPU=$($PY -c "import torch; print(torch.cuda.device_count())" 2>/dev/null || echo 0)
if [ "$NGPU" -ge 2 ]; then
  COMMON=(--warmup 3 --steps 10)
else
  echo "no 2 GPUs here: dry run on the tiny model, 2 gloo CPU ranks"
  export OMP_NUM_THREADS=1
  COMMON=(--model tiny --seq 64 --warmup 1 --steps 2)
fi

plain() {
  local name=$1
  shift
  echo "+ torchrun --nproc-per-node 2 benchmarks/plain_references.py $* ${COMMON[*]}"
  local t0=$SECONDS
  timeout 150 $PY -m torch.distributed.run --nproc-per-node 2 benchmarks/plain_references.py \
    "$@" "${COMMON[@]}" --json "$OUT/plain-$name.json" > "$OUT/plain-$name.log" 2>&1
  local rc=$?
  if [ "$rc" -ne 0 ]; then
    local why=""
    if [ "$rc" -eq 124 ]; then why=", timed out after 150 s"; fi
    echo "  $name FAILED (exit $rc$why): see $OUT/plain-$name.log"
    rm -f "$OUT/plain-$name.json"
  fi
  echo "  ($((SECONDS - t0)) s; total $SECONDS s)"
}

plain fsdp --mode fsdp
plain fsdp-compile --mode fsdp --compile
plain ddp --mode ddp
plain pp-1f1b --mode pp --schedule 1f1b
plain pp-gpipe --mode pp --schedule gpipe
plain pp-interleaved --mode pp --schedule interleaved

$PY - "$OUT" <<'EOF' | tee "$OUT/plain-summary.txt"
import json, sys
from pathlib import Path

out = Path(sys.argv[1])
names = ["fsdp", "fsdp-compile", "ddp", "pp-1f1b", "pp-gpipe", "pp-interleaved"]
print(f"{'run':<16} {'step ms':>9} {'median':>9} {'tok/s/GPU':>11} {'MFU':>6} {'peak GiB':>9}  device")
for n in names:
    f = out / f"plain-{n}.json"
    if not f.exists():
        print(f"{n:<16} failed: see plain-{n}.log")
        continue
    r = json.loads(f.read_text())
    mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
    pk = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.1f}"
    print(f"{n:<16} {r['step_s'] * 1e3:>9.1f} {r['step_s_median'] * 1e3:>9.1f} "
          f"{r['tokens_per_s_per_gpu']:>11,.0f} {mfu:>6} {pk:>9}  {r['device']}, "
          f"torch {r['torch']}, NCCL {r['nccl']}")
EOF
echo "done in $SECONDS s: $OUT/plain-*.json"

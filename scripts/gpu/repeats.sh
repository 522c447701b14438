#!/usr/bin/env bash
# Repeats of the GPU runs the planner misses, to tell the machine's spread from the model's
# error (benchmarks/results/plan_accuracy.txt):
#
# - TP2 + sequence parallel (PAR-MODEL-INTERNAL, 1.3B, micro-batch 2 x 4096): four earlier sets
#   measured 0.153, 0.153, 0.120 and 0.146 s on the same knobs, each over 3 steps. Here
#   REPEATS (4) repeats of STEPS (10) steps, each run's every step kept in its document
#   (workload.step_times), with its one-GPU baseline;
# - FSDP on GPT-2 1.5B (micro-batch 8 x 1024): one run at 0.308 s (planner 0.227 s), while a
#   profiled run of the same command measured 0.235 s. Two plain repeats;
# - FSDP on the 1.3B with the runtime's op-level selective recompute: one run, of an older
#   implementation, 0.317 s (planner 0.261 s). Two repeats on the current code.
#
#   scripts/gpu/repeats.sh OUT_DIR
#
# REPEATS (4) and STEPS (10): the TP2 + SP repeats and their steps; FSDP_REPEATS (2) and
# TRAIN_STEPS (5): the FSDP repeats and theirs (their documents keep every step as well);
# NUMA_REPEATS (0): the two FSDP runs again with each rank bound near its GPU; GC_REPEATS (0):
# again with Python's garbage collection by hand.
#
# The GPUs' clocks, temperature and power are logged before each run. With fewer than
# 2 GPUs the same commands run at CPU size (tiny model, gloo ranks) as a dry run.
set -euo pipefail
OUT="${1:?usage: scripts/gpu/repeats.sh OUT_DIR}"
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 2 ]; then
  PRESET=gpu GPT2=gpt2-1.5b M13=1.3b DT=bf16-compute SEQ=4096 SEQ2=1024 MB2=8
else
  PRESET=cpu GPT2=tiny M13=tiny DT=fp32 SEQ=64 SEQ2=64 MB2=2
fi
LOG="$OUT/repeats.log"
echo "repeats.sh: $GPUS GPU(s), preset $PRESET, ${REPEATS:-4} SP repeats of ${STEPS:-10} steps" | tee "$LOG"
gpus() {
  if command -v nvidia-smi > /dev/null; then
    echo "$1, GPUs before (index, SM clock, memory clock, temperature, power): $(nvidia-smi \
      --query-gpu=index,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader \
      | tr '\n' ';')" | tee -a "$LOG"
  fi
}
status=0
for i in $(seq 1 "${REPEATS:-4}"); do
  gpus "tp2-sp repeat $i"
  timeout 150 "$PY" -m parlab project model-internal --preset "$PRESET" --results "$OUT/results" \
    --only tp2-sp --steps "${STEPS:-10}" --timeout 75 --budget 120 2>&1 | tee -a "$LOG" \
    || status=$?
done
TRAIN=(--strategy fsdp --nproc 2 --dtype "$DT" --warmup 3 --steps "${TRAIN_STEPS:-5}"
  --timeout 90 --results "$OUT/results")
for i in $(seq "${FSDP_REPEATS:-2}"); do
  gpus "fsdp $GPT2 repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$GPT2" --micro-batch "$MB2" \
    --seq "$SEQ2" 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
done
for i in $(seq "${FSDP_REPEATS:-2}"); do
  gpus "fsdp $M13 --recompute selective repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$M13" --micro-batch 2 --seq "$SEQ" \
    --recompute selective 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
done
# the same FSDP runs with each rank bound to the CPUs near its GPU (torchrun --numa-binding
# node): do the host's placement and speed set the spread? (GPU only: CPU ranks are not bound)
if [ "$PRESET" = gpu ] && [ "${NUMA_REPEATS:-0}" -gt 0 ]; then
  { nvidia-smi topo -m; lscpu | grep -i numa; } 2>&1 | tee -a "$LOG" || true
fi
for i in $(seq 1 "${NUMA_REPEATS:-0}"); do
  [ "$PRESET" = gpu ] || break
  gpus "fsdp $GPT2 --numa-binding node repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$GPT2" --micro-batch "$MB2" \
    --seq "$SEQ2" --numa-binding node 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
  gpus "fsdp $M13 --recompute selective --numa-binding node repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$M13" --micro-batch 2 --seq "$SEQ" \
    --recompute selective --numa-binding node 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
done
# the same FSDP runs with Python's garbage collection by hand (torchtitan's default interval,
# 50 steps: none in these runs): does a collection's pause set the slow steps?
for i in $(seq 1 "${GC_REPEATS:-0}"); do
  gpus "fsdp $GPT2 --manual-gc 50 repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$GPT2" --micro-batch "$MB2" \
    --seq "$SEQ2" --manual-gc 50 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
  gpus "fsdp $M13 --recompute selective --manual-gc 50 repeat $i"
  timeout 120 "$PY" -m parlab train "${TRAIN[@]}" --model "$M13" --micro-batch 2 --seq "$SEQ" \
    --recompute selective --manual-gc 50 2>&1 | tail -n 3 | tee -a "$LOG" || status=$?
done
# the spread, read back from the documents
"$PY" - "$OUT/results" <<'PY' | tee -a "$LOG"
import sys
from pathlib import Path
from parlab.contract import read_document
for p in sorted(Path(sys.argv[1]).glob("PAR-*/*.json")):
    d = read_document(p)
    if d.role not in ("baseline", "candidate") or not d.metric("step_time"):
        continue
    ts = d.workload.get("step_times") or []
    spread = f"  min {min(ts):.4f}  max {max(ts):.4f}  steps: {' '.join(f'{t:.4f}' for t in ts)}" if ts else ""
    k = (d.layout or {}).get("knobs") or {}
    how = "".join(f"  {n} {k[n]}" for n in ("recompute", "numa_binding", "manual_gc") if k.get(n))
    print(f"{d.run_id:<48} step {d.metric('step_time'):.4f} s{spread}{how}")
PY
exit "$status"

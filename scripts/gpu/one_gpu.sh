#!/usr/bin/env bash
# Training runs on one GPU with shapes and knobs no earlier GPU run measured, to test the
# planner out of sample (benchmarks/plan_accuracy.py), one go: about 6 minutes on 1 H200.
#
#   scripts/gpu/one_gpu.sh OUT_DIR
#
# parlab train --nproc 1, bf16, 3 warm-up and STEPS (10) timed steps, every step kept
# (workload.step_times):
#
# - the 1.3B model (hidden 2048, 24 layers): micro-batch 2 x 4096 without recompute, with full
#   recompute and with the runtime's op-level selective recompute; 1 x 8192 and 8 x 1024
#   (attention's share of the step up and down); FSDP on one rank (its hooks, no traffic);
# - GPT-2 1.5B (hidden 1600, 48 layers), 8 x 1024: FSDP on one rank twice (do the two modes of
#   its 2-GPU runs show without a second rank?), and DDP with full recompute;
# - GPT-2 124M (hidden 768, 12 layers), 1, 8 and 32 x 1024: a small model, where the host's
#   dispatch may set the step rather than the GPU's work;
# - Llama-3.1 8B, 1 x 1024 with full recompute: its states alone (16 B per parameter with
#   AdamW) exceed one H200, so the run must end as an out-of-memory failure document.
#
# The GPU's SM clock, power, temperature and throttle reasons are sampled every 500 ms into
# OUT_DIR/telemetry.csv. Without a GPU the same commands run at CPU size (tiny model, one gloo
# rank) as a dry run.
#
# Chosen runs instead: scripts/gpu/runs.sh (RUNS, NPROC=1).
set -euo pipefail
OUT="${1:?usage: scripts/gpu/one_gpu.sh OUT_DIR}"
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 1 ]; then
  M13=1.3b GPT2=gpt2-1.5b SMALL=gpt2-124m BIG=llama3.1-8b DT=bf16-compute S=4096 S2=8192 S1=1024
else
  M13=tiny GPT2=tiny SMALL=tiny BIG=small DT=fp32 S=64 S2=128 S1=32
fi
LOG="$OUT/one-gpu.log"
echo "one_gpu.sh: $GPUS GPU(s), models $M13 $GPT2 $SMALL $BIG, dtype $DT" | tee "$LOG"
TELEMETRY=
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
  nvidia-smi --query-gpu=timestamp,index,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu,clocks_throttle_reasons.active \
    --format=csv -lms 500 > "$OUT/telemetry.csv" 2>&1 &
  TELEMETRY=$!
fi
status=0
train() {  # NAME ARGS...: one run, its last lines in the log
  local name=$1
  shift
  echo "== $name: parlab train $*" | tee -a "$LOG"
  timeout 150 "$PY" -m parlab train --nproc 1 --dtype "$DT" --warmup 3 --steps "${STEPS:-10}" \
    --timeout 90 --results "$OUT/results" "$@" 2>&1 | tail -n 4 | tee -a "$LOG" || status=$?
}
train 1.3b-ddp --strategy ddp --model "$M13" --micro-batch 2 --seq "$S"
train 1.3b-ddp-full --strategy ddp --model "$M13" --micro-batch 2 --seq "$S" --recompute full
train 1.3b-ddp-selective --strategy ddp --model "$M13" --micro-batch 2 --seq "$S" \
  --recompute selective
train 1.3b-ddp-long --strategy ddp --model "$M13" --micro-batch 1 --seq "$S2"
train 1.3b-ddp-short --strategy ddp --model "$M13" --micro-batch 8 --seq "$S1"
train 1.3b-fsdp --strategy fsdp --model "$M13" --micro-batch 2 --seq "$S"
train gpt2-fsdp-1 --strategy fsdp --model "$GPT2" --micro-batch 8 --seq "$S1"
train gpt2-fsdp-2 --strategy fsdp --model "$GPT2" --micro-batch 8 --seq "$S1"
train gpt2-ddp-full --strategy ddp --model "$GPT2" --micro-batch 8 --seq "$S1" --recompute full
for mb in 1 8 32; do
  train "small-ddp-mb$mb" --strategy ddp --model "$SMALL" --micro-batch "$mb" --seq "$S1"
done
# expected to fail: out of memory (exit 1 with a failure document; not counted against status)
echo "== big-oom: parlab train --strategy ddp --model $BIG --recompute full (out of memory expected)" \
  | tee -a "$LOG"
big_cap=()
[ "$GPUS" -ge 1 ] || big_cap=(--memory-cap 64MiB)
timeout 150 "$PY" -m parlab train --nproc 1 --dtype "$DT" --warmup 1 --steps 2 --timeout 90 \
  --results "$OUT/results" --strategy ddp --model "$BIG" --micro-batch 1 --seq "$S1" \
  --recompute full "${big_cap[@]}" 2>&1 | tail -n 4 | tee -a "$LOG" || true
[ -z "$TELEMETRY" ] || kill "$TELEMETRY" 2> /dev/null || true
# the runs, read back from the documents
"$PY" - "$OUT/results" <<'PY' | tee -a "$LOG"
import sys
from pathlib import Path
from parlab.contract import read_document
for p in sorted(Path(sys.argv[1]).glob("PAR-*/*.json")):
    d = read_document(p)
    k = (d.layout or {}).get("knobs") or {}
    w = d.workload
    what = f"mb {w.get('micro_batch')} x {w.get('seq_len') or w.get('seq')}"
    what += "".join(f" {n} {k[n]}" for n in ("recompute",) if k.get(n) not in (None, "none"))
    if d.role == "failure":
        print(f"{d.run_id:<48} {what}: failure {d.failure.kind if d.failure else ''}")
        continue
    if not d.metric("step_time"):
        continue
    ts = w.get("step_times") or []
    span = f"  steps {min(ts):.4f}-{max(ts):.4f}" if ts else ""
    peak = d.metric("peak_memory")
    print(f"{d.run_id:<48} {what}: step {d.metric('step_time'):.4f} s{span}  peak {peak}")
PY
exit "$status"

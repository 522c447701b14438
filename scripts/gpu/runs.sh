#!/usr/bin/env bash
# Chosen parlab train runs in one go, for a GPU call that tests the planner on configurations no
# fixed script covers (benchmarks/plan_accuracy.py reads their documents).
#
#   RUNS="NAME ARGS...;..." scripts/gpu/runs.sh OUT_DIR
#
# Each entry is one `parlab train` run: its NAME for the log, then its arguments, where the
# words M13 (the 1.3B), M7 (Llama-2 7B), M8 (the 8B), Q7 (Qwen2.5 7B), GPT2 (GPT-2 1.5B), SMALL
# (GPT-2 124M),
# S (4096), S1 (1024) and S2 (8192) stand for the preset's models and lengths. Every run: bf16,
# NPROC ranks (default: every GPU here), 3 warm-up and STEPS (5) timed steps, every step kept
# (workload.step_times). E.g.
#
#   RUNS="7b-fsdp --strategy fsdp --model M7 --micro-batch 1 --seq S" scripts/gpu/runs.sh OUT
#
# Without a GPU the same commands run at CPU size (tiny and small models, lengths 64/32/128,
# fp32, 2 gloo ranks unless NPROC says otherwise) as a dry run. Each run records the step time
# the lab predicts from ROOFLINE (default: the committed results/; empty: none) before it starts
# (parlab train --roofline).
set -euo pipefail
OUT="${1:?usage: RUNS=... scripts/gpu/runs.sh OUT_DIR}"
: "${RUNS:?set RUNS=\"NAME ARGS...;...\"}"
mkdir -p "$OUT/results"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
if [ "$GPUS" -ge 1 ]; then
  M13=1.3b M7=llama2-7b M8=8b Q7=qwen2.5-7b GPT2=gpt2-1.5b SMALL=gpt2-124m DT=bf16-compute
  S=4096 S1=1024 S2=8192
  NP="${NPROC:-$GPUS}"
else
  M13=tiny M7=small M8=small Q7=small GPT2=tiny SMALL=tiny DT=fp32 S=64 S1=32 S2=128
  NP="${NPROC:-2}"
fi
LOG="$OUT/runs.log"
echo "runs.sh: $GPUS GPU(s), $NP rank(s), dtype $DT" | tee -a "$LOG"
if command -v nvidia-smi > /dev/null; then
  nvidia-smi --query-gpu=index,name,clocks.max.sm,power.limit --format=csv | tee -a "$LOG"
fi
status=0
IFS=';' read -r -a SPECS <<< "$RUNS"
for spec in "${SPECS[@]}"; do
  read -r -a words <<< "$spec"
  args=()
  for w in "${words[@]:1}"; do
    case "$w" in
      M13) args+=("$M13") ;; M7) args+=("$M7") ;; M8) args+=("$M8") ;; Q7) args+=("$Q7") ;;
      GPT2) args+=("$GPT2") ;; SMALL) args+=("$SMALL") ;;
      S) args+=("$S") ;; S1) args+=("$S1") ;; S2) args+=("$S2") ;;
      *) args+=("$w") ;;
    esac
  done
  ROOF="${ROOFLINE-results}"
  if [ -n "$ROOF" ]; then args+=(--roofline "$ROOF"); fi
  echo "== ${words[0]}: parlab train --nproc $NP ${args[*]}" | tee -a "$LOG"
  timeout 240 "$PY" -m parlab train --nproc "$NP" --dtype "$DT" --warmup 3 --steps "${STEPS:-5}" \
    --timeout 150 --results "$OUT/results" "${args[@]}" 2>&1 | tail -n 4 | tee -a "$LOG" \
    || status=$?
done
exit "$status"

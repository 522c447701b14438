#!/usr/bin/env bash
# PAR-DISTRIBUTED-INFERENCE GPU evidence, in one go (115 s on 2xH200 with the batched engine:
# results/logs/gpu-20261130T1600-run_all/summary.txt):
#   - one reference replica (1.3B Llama-style, bf16, random weights) per GPU, behind parlab's
#     router under each routing policy, with a seeded shared-prefix workload (serving-benchmark);
#   - the replica's prefill/decode profile and the simulator's prediction for each run;
#   - KV-cache transfer GPU0 -> GPU1 over NCCL send/recv against request length (real-nccl);
#   - colocated vs prefill/decode split in the simulator, from those measurements (analytic);
#   - the router's own overhead against stub replicas (serving-benchmark);
#   - a tensor-parallel replica (TP=2 over both GPUs) under a short load (serving-benchmark);
#     SERVING_TP=0 skips it.
# Without two GPUs it runs the same at CPU size (tiny model, gloo). Each part has its own
# limit: the project SERVING_PROJECT_LIMIT (default 200 s), router overhead 40 s, the TP
# replica serves for 30 s. The engine before it was batched spent 188 ms per decode step and
# the first GPU run passed the project limit before failover (results/logs/gpu-20261130T1527-*).
#   scripts/gpu/serving.sh OUT_DIR     -> OUT_DIR/results/<project>/*.json, OUT_DIR/*.log
set -u -o pipefail
OUT=${1:?usage: scripts/gpu/serving.sh OUT_DIR}
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
mkdir -p "$OUT/results"
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)"; then
  PRESET=gpu
else
  PRESET=cpu
fi
echo "preset: $PRESET"
rc=0
timeout --kill-after=10 "${SERVING_PROJECT_LIMIT:-200}" $PY -m parlab serve project --preset "$PRESET" \
  --results "$OUT/results" 2>&1 | tee "$OUT/project.log" || rc=1
# router overhead: two stub replicas, 500 req/s direct and through the router
timeout --kill-after=10 40 $PY benchmarks/serve_router.py --rate 500 --requests 2000 \
  --results "$OUT/results" 2>&1 | tee "$OUT/router_overhead.log" || rc=1
if [ "${SERVING_TP:-1}" = 1 ]; then
  if [ "$PRESET" = gpu ]; then
    TPARGS="--model 1.3b --tensor-dtype bf16 --max-batch 32 --max-len 4096"; N=32; RATE=8; IN=1024; OUTL=64
  else
    TPARGS="--model tiny"; N=8; RATE=4; IN=64; OUTL=8
  fi
  $PY -m parlab serve replica --tp 2 --port 0 --duration 30 $TPARGS > "$OUT/tp_replica.log" 2>&1 &
  TPPID=$!
  URL=""
  for _ in $(seq 1 60); do
    URL=$(grep -o "listening on http://[0-9.:]*" "$OUT/tp_replica.log" | head -1 | cut -d' ' -f3)
    [ -n "$URL" ] && break
    sleep 0.5
  done
  if [ -n "$URL" ]; then
    timeout --kill-after=5 25 $PY -m parlab bench serve --base-url "$URL" --dataset-name random \
      --num-prompts $N --input-len $IN --output-len $OUTL --request-rate $RATE --no-progress \
      --max-duration 20 --results "$OUT/results" --layout world_size=2 --layout tp=2 \
      --layout strategy=tensor-parallel-replica --note "one replica, tensor-parallel over 2 ranks" \
      2>&1 | tee "$OUT/tp_bench.log" || rc=1
  else
    echo "tensor-parallel replica did not start (see tp_replica.log)"; rc=1
  fi
  wait $TPPID || rc=1
fi
exit $rc

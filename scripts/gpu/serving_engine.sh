#!/usr/bin/env bash
# The serving engine's GPU evidence, in one go, on one GPU (without one, the same at CPU size:
# the tiny model; the transformers parts run only where transformers imports):
#   tests     the engine's GPU tests: Triton kernels and CUDA graphs against the torch path;
#   engine    benchmarks/serve_engine_step.py: the decode step at batch 1, 32, 128 over
#             1,024-token prompts against transformers' static-cache generate and the memory
#             roofline; the offline load 128 x 1,024 + 128;
#   profile   (with engine) one mixed step of that load under torch.profiler: its kernels;
#   kernels   the kernel benchmarks: benchmarks/serve_fused_kernels.py (norm, SwiGLU,
#             rope_store) and benchmarks/serve_decode_kernel.py over the decode kernel's
#             configurations (GPU only);
#   serving   two transformers-server replicas (its own OpenAI server, continuous batching)
#             behind parlab's router, then two reference replicas on the same load (chat API,
#             the same weights and tokenizer: hf_export), each with parlab bench serve;
#   clients   benchmarks/serve_clients.py: vLLM's and SGLang's own benchmark clients beside
#             parlab bench serve on one load through the router (two reference replicas);
#   failover  the serving project with two reference replicas on the GPU: round robin and
#             cache-aware, one replica killed under load, restarted, rejoining.
#
#   scripts/gpu/serving_engine.sh OUT_DIR [PARTS]   (PARTS: tests,kernels,engine,profile,serving,clients,failover)
#       -> OUT_DIR/results/<project>/*.json, OUT_DIR/*.txt, OUT_DIR/*.log
set -u -o pipefail
OUT=${1:?usage: scripts/gpu/serving_engine.sh OUT_DIR [PARTS]}
PARTS=${2:-tests,engine,serving,failover}
cd "$(dirname "$0")/../.."
export PYTHONPATH=src${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PYTHON:-python3}
mkdir -p "$OUT/results"
RES="$OUT/results"
if $PY -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  MODEL=1.3b DTYPE=bfloat16 DEV=cuda:0 BATCH=1,32,128 PLEN=1024 STEPS=32 OFFLINE=128,1024,128
  N=64 IN=512 OUTL=64 RATE=8 PRESET=gpu DEVICES=cuda:0,cuda:0
else
  MODEL=tiny DTYPE=float32 DEV=cpu BATCH=1,4 PLEN=64 STEPS=8 OFFLINE=8,64,16
  N=8 IN=32 OUTL=8 RATE=4 PRESET=cpu DEVICES=cpu,cpu
fi
HAVE_HF=0 HAVE_TF=0
$PY -c "import transformers, fastapi, uvicorn" 2>/dev/null && HAVE_HF=1
$PY -c "import transformers" 2>/dev/null && HAVE_TF=1
echo "device $DEV model $MODEL; transformers serving: $HAVE_HF; parts $PARTS"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>/dev/null
rc=0
has() { [[ ",$PARTS," == *",$1,"* ]]; }

if has tests; then
  timeout 300 $PY -m pytest -q -x -p no:cacheprovider tests/test_serve_engine.py 2>&1 \
    | tee "$OUT/tests.log" | tail -3 || rc=1
fi

if has kernels && [ "$DEV" != cpu ]; then
  timeout 120 $PY benchmarks/serve_fused_kernels.py --rows 128,8192 2>&1 | tee "$OUT/serve_fused_kernels.txt" || rc=1
  timeout 300 $PY benchmarks/serve_decode_kernel.py --batch 128,32,1 --tiles 32,64,128 \
    --stages 2,3 --warps 4,8 --per-sm 1,2,4,16,32 --seconds 240 --json "$OUT/decode_kernel.jsonl" 2>&1 | tee "$OUT/serve_decode_kernel.txt" || rc=1
fi

if has engine; then
  HF=""; [ $HAVE_TF = 1 ] && HF="--hf"
  has profile && HF="$HF --profile-prefill"
  timeout 420 $PY benchmarks/serve_engine_step.py --model $MODEL --dtype $DTYPE --device $DEV \
    --batch $BATCH --prompt-len $PLEN --steps $STEPS --offline $OFFLINE $HF --results "$RES" \
    2>&1 | grep -v "Loading weights" | tee "$OUT/serve_engine_step.txt" || rc=1
fi

# wait_record FILE PID: until a launch printed its record (one JSON line with "url")
wait_record() {
  for _ in $(seq 1 600); do
    grep -q '"url"' "$1" 2>/dev/null && return 0
    kill -0 "$2" 2>/dev/null || break
    sleep 0.5
  done
  echo "no record in $1:"; tail -3 "$1"; return 1
}

# pair ENGINE PORT1 PORT2 ARGS...: two launched replicas behind a router, one bench run
pair() {
  local engine=$1 p1=$2 p2=$3; shift 3
  local pids=()
  for p in $p1 $p2; do
    $PY -m parlab serve launch --engine $engine --port $p --device $DEV --duration 900 \
      --log "$OUT/$engine-$p.log" "$@" > "$OUT/$engine-$p.record" 2>&1 &
    pids+=($!)
  done
  local ok=1
  wait_record "$OUT/$engine-$p1.record" ${pids[0]} && wait_record "$OUT/$engine-$p2.record" ${pids[1]} || ok=0
  if [ $ok = 1 ]; then
    local rport=$((p1 - 1))
    $PY -m parlab serve router --replica http://127.0.0.1:$p1 --replica http://127.0.0.1:$p2 \
      --policy round_robin --port $rport --duration 300 > "$OUT/router-$engine.log" 2>&1 &
    local router=$!
    sleep 2
    if [ "${MEASURE:-bench}" = clients ]; then
      timeout 500 $PY benchmarks/serve_clients.py --base-url http://127.0.0.1:$rport --model $MODEL \
        --num-prompts $N --input-len $IN --output-len $OUTL --request-rate $RATE \
        --vllm-path $CLIENTS --sglang-path $CLIENTS --work "$OUT/clients" 2>&1 | tee "$OUT/serve_clients.txt" || rc=1
    else
    timeout 240 $PY -m parlab bench serve --base-url http://127.0.0.1:$rport --api chat \
      --num-prompts $N --random-input-len $IN --random-output-len $OUTL --request-rate $RATE \
      --no-progress --max-duration 200 --results "$RES" --layout engine=$engine \
      --layout replicas=2 --layout strategy=router:round_robin \
      --note "two $engine replicas on one device behind parlab's router" $BENCH_EXTRA \
      2>&1 | tee "$OUT/bench-$engine.txt" || rc=1
    fi
    kill $router 2>/dev/null; wait $router 2>/dev/null
  else
    rc=1
  fi
  for pid in "${pids[@]}"; do kill $pid 2>/dev/null; done
  for pid in "${pids[@]}"; do wait $pid 2>/dev/null; done
}

if has serving; then
  HFDIR=$(mktemp -d)/model
  if [ $HAVE_HF = 1 ]; then
    $PY -c "
import torch
from parlab.models.reference import build_model
from parlab.serve.hf_export import export_llama
from parlab.serve.replica import serving_spec
m = build_model(serving_spec('$MODEL'), device='$DEV', dtype=torch.$DTYPE, seed=0)
export_llama(m, '$HFDIR', eos=False)
print('exported', '$HFDIR')" || rc=1
    mkdir -p "${HF_HUB_CACHE:-$HOME/.cache/huggingface/hub}"  # its /v1/models scans it
    BENCH_EXTRA="--no-ignore-eos --model $HFDIR" pair transformers 8101 8102 --model "$HFDIR" --dtype $DTYPE \
      --extra=--continuous-batching
  fi
  BENCH_EXTRA="" pair parlab 8201 8202 --model $MODEL --dtype $DTYPE --max-len 2048 \
    --extra=--max-batch --extra=64 --extra=--max-step-tokens --extra=8192
fi

# vLLM's and SGLang's benchmark clients beside parlab bench serve, two reference replicas behind
# the router: their pure-Python parts and wheels travel in .clients/ (not in git)
# (echo /.clients/ >> .git/info/exclude; carry .clients). Built here from the packages' wheels:
#   .clients/vllm-<v>-py.tar.xz    vllm/**/*.py from vLLM's wheel (json configs and .so left out)
#   .clients/sglang-<v>-py.tar.xz  sglang/ from SGLang's wheel without test/, multimodal_gen/,
#                                  srt/models/, configs/ and .so (its kernel sources kept)
#   .clients/stubs/IPython         an empty IPython with display.HTML/display (SGLang imports it)
#   .clients/whl/*.whl             cp312 wheels the host lacks: pybase64 msgspec pydantic
#     pydantic_core annotated-types typing-inspection pyzmq cachetools cbor2 llguidance xgrammar
#     apache-tvm-ffi orjson starlette datasets dill multiprocess compressed-tensors loguru
# (SGLang's client still stops there at sgl_kernel, its compiled GPU kernels.)
if has clients; then
  CLIENTS=/tmp/parlab-clients
  mkdir -p $CLIENTS
  $PY -m pip install -q --no-index --no-deps --no-compile --target $CLIENTS .clients/whl/*.whl \
    && for t in .clients/*.tar.xz; do tar xJf "$t" -C $CLIENTS; done \
    && cp -r .clients/stubs/* $CLIENTS/ || rc=1
  N=$((N * 4)) MEASURE=clients BENCH_EXTRA="" pair parlab 8301 8302 --model $MODEL --dtype $DTYPE --max-len 2048 \
    --extra=--max-batch --extra=64 --extra=--max-step-tokens --extra=8192
fi

if has failover; then
  timeout 400 $PY -m parlab project serving --preset $PRESET --devices $DEVICES \
    --policies round_robin,cache_aware --no-kv-transfer --results "$RES" 2>&1 \
    | tee "$OUT/project.txt" || rc=1
fi
exit $rc

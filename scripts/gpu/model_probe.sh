#!/usr/bin/env bash
# Eager speed probe of the reference model (issue 5/6 follow-up), one go: under 90 s on one
# H200 (start-up and the 1.3b build ~15 s, the MHA probe ~30 s, the GQA block probe ~10 s).
#
#   scripts/gpu/model_probe.sh OUT_DIR
#
# 1. benchmarks/model_eager_probe.py on the 1.3b preset (micro-batch 2 x 4096, bf16):
#    forward+backward of norm, rope, the rope table, the SDPA core, the MLP, the loss, one
#    TransformerBlock (also captured in a CUDA graph) and the whole model, each current part
#    beside its equivalent alternatives (F.rms_norm, complex rope, cached tables, contiguous
#    q/k/v, forced SDPA backends, fused w13, bf16 loss), each first checked equal (output and
#    gradients) and only then timed with CUDA events (median, warm-up excluded);
# 2. the same block probe with GQA (4 K/V heads, no whole model) for enable_gqa=True vs
#    repeat_interleave.
# Tables go to OUT_DIR/model-probe-*.txt, rows as JSON to OUT_DIR/model-probe-*.json.
# Without a GPU it runs the tiny CPU probe instead, so it can be dry-run anywhere.
set -euo pipefail
OUT="${1:?usage: scripts/gpu/model_probe.sh OUT_DIR}"
mkdir -p "$OUT"
OUT="$(cd "$OUT" && pwd)"
cd "$(dirname "$0")/../.."
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
PY="${PYTHON:-python3}"
GPUS=$("$PY" -c 'import torch; print(torch.cuda.device_count() if torch.cuda.is_available() else 0)')
echo "model_probe.sh: $GPUS GPU(s), output $OUT" | tee "$OUT/model-probe.log"
status=0
# exit 1 from the probe means an alternative was refused as not equal: the table says which
timeout 60 "$PY" benchmarks/model_eager_probe.py --model 1.3b --json "$OUT/model-probe-1.3b.json" \
  2>&1 | tee "$OUT/model-probe-1.3b.txt" || status=$?
echo "1.3b probe exited with status $status" | tee -a "$OUT/model-probe.log"
s2=0
timeout 22 "$PY" benchmarks/model_eager_probe.py --model 1.3b --gqa-kv-heads 4 --no-model \
  --json "$OUT/model-probe-1.3b-gqa4.json" 2>&1 | tee "$OUT/model-probe-1.3b-gqa4.txt" || s2=$?
echo "gqa probe exited with status $s2" | tee -a "$OUT/model-probe.log"
if [ "$status" -eq 0 ]; then status=$s2; fi
exit "$status"

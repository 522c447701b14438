#!/usr/bin/env bash
# scripts/gpu/accuracy.sh OUT_DIR -- checks the ledger's `ddp_old_buckets` item on the GPUs.
#
# What it measures: the CUDA allocator's peak of each of the first 4 iterations of torch DDP
# (bf16 autocast over fp32 params, fused AdamW, gradient_as_bucket_view, 25 MiB buckets: the
# `parlab train --strategy ddp` runs of results/PAR-TRAINING-STATE) for each ACC_RUNS entry
# (default: GPT-2 1.5B at seq 1024 x micro-batch 8, then the 1.3B at 4096 x 2), in two variants:
#   default -- the loop as parlab train runs it;
#   flush   -- after iteration 1, wait 0.5 s and issue one small all-reduce and wait on it,
#              so ProcessGroupNCCL drops the tensors of iteration 1's bucket all-reduces
#              before DDP rebuilds its buckets.
# The ledger says: iteration 2's peak (default) exceeds iteration 3's by the gradient bytes
# (4 B per parameter: 5.08 GiB for the 1.3B), and the flush variant has no such excess. Each iteration's peak
# comes from torch.cuda.max_memory_allocated after reset_peak_memory_stats at its start.
# Output: OUT_DIR/accuracy/ddp-iteration-peaks-<model>-<variant>.json (rank 0), a summary, and
# OUT_DIR/logs/accuracy-*.log. On a machine without 2 GPUs it runs the tiny model on 2 gloo
# CPU ranks (mechanism only: no allocator peaks) -- the dry run.
# Expected time on 2 x H200: about 40 s per launch (start-up, 4 iterations); four launches.
set -euo pipefail
OUT=${1:?usage: scripts/gpu/accuracy.sh OUT_DIR}
mkdir -p "$OUT/accuracy" "$OUT/logs"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" OMP_NUM_THREADS=1
PY=${PYTHON:-python3}
# ACC_RUNS: MODEL:SEQ:MICRO_BATCH triples (default: the 1.3B run of parlab train, and the
# GPT-2 1.5B DDP run whose peak came out 8.3% under the ledger's)
if "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.device_count() >= 2 else 1)'; then
  RUNS=${ACC_RUNS:-"gpt2-1.5b:1024:8 1.3b:4096:2"}
else
  RUNS="tiny:64:2"
  echo "fewer than 2 GPUs: tiny model on gloo CPU ranks (dry run, no allocator peaks)"
fi
PROG="$OUT/accuracy/ddp_iteration_peaks.py"
cat > "$PROG" <<'EOF'
"""Per-iteration allocator peaks of torch DDP (see scripts/gpu/accuracy.sh)."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

from parlab.models import get_spec
from parlab.models.reference import build_model

local = int(os.environ["LOCAL_RANK"])
cuda = torch.cuda.is_available() and torch.cuda.device_count() >= 2
dev = torch.device("cuda", local) if cuda else torch.device("cpu")
if cuda:
    torch.cuda.set_device(dev)
dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
spec = get_spec(os.environ["MODEL"])
seq, mb, variant = int(os.environ["SEQ"]), int(os.environ["MB"]), os.environ["VARIANT"]
model = build_model(spec, device=dev, dtype=torch.float32, seed=0)
ddp = DistributedDataParallel(
    model, device_ids=[dev] if cuda else None, bucket_cap_mb=25.0, gradient_as_bucket_view=True
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.0, fused=cuda)
gen = torch.Generator().manual_seed(dist.get_rank())
grad_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
rows = []
for it in range(1, 5):
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    start = torch.cuda.memory_allocated(dev) if cuda else None
    tokens = torch.randint(0, spec.vocab_size, (mb, seq + 1), generator=gen).to(dev)
    with torch.autocast(dev.type, dtype=torch.bfloat16):
        logits = ddp(tokens[:, :-1])  # kept until the next iteration, as parlab train keeps it
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=False)  # the bucket views stay
    if cuda:
        torch.cuda.synchronize(dev)
    if it == 1 and variant == "flush":
        time.sleep(0.5)  # the watchdog sees iteration 1's all-reduces complete
        dist.all_reduce(torch.zeros(1, device=dev))  # a collective call drops what it held
    rows.append({
        "iteration": it,
        "start_bytes": start,
        "peak_bytes": int(torch.cuda.max_memory_allocated(dev)) if cuda else None,
        "end_bytes": int(torch.cuda.memory_allocated(dev)) if cuda else None,
        "loss": float(loss.detach()),
    })
if dist.get_rank() == 0:
    out = {
        "variant": variant, "model": spec.name, "seq": seq, "micro_batch": mb,
        "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
        "torch": torch.__version__, "grad_bytes": grad_bytes, "iterations": rows,
    }
    path = os.path.join(os.environ["OUT_ACC"], f"ddp-iteration-peaks-{spec.name}-{variant}.json")
    with open(path, "w") as f:
        json.dump(out, f, indent=1)
    for r in rows:
        pk = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f} GiB"
        print(f"{variant:<8} iteration {r['iteration']}: peak {pk}", flush=True)
dist.destroy_process_group()
sys.exit(0)
EOF
export OUT_ACC="$OUT/accuracy"
for run in $RUNS; do
  IFS=: read -r MODEL SEQ MB <<< "$run"
  export MODEL SEQ MB
  for variant in default flush; do
    VARIANT=$variant timeout 200 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 \
      "$PROG" 2>&1 | tee "$OUT/logs/accuracy-$MODEL-$variant.log" \
      || echo "accuracy: $MODEL $variant failed"
  done
done
"$PY" - "$OUT/accuracy" <<'EOF' | tee "$OUT/accuracy/summary.txt"
import json, sys
from pathlib import Path
folder = Path(sys.argv[1])
for p in sorted(folder.glob("ddp-iteration-peaks-*.json")):
    v = p.stem.removeprefix("ddp-iteration-peaks-")
    d = json.loads(p.read_text())
    peaks = [r["peak_bytes"] for r in d["iterations"]]
    if None in peaks:
        print(f"{v}: {d['device']}: no allocator peaks (CPU dry run)")
        continue
    g = d["grad_bytes"]
    print(f"{v}: peaks per iteration (GiB) " + ", ".join(f"{x / 2**30:.2f}" for x in peaks)
          + f"; iteration 2 - iteration 3 = {(peaks[1] - peaks[2]) / 2**30:+.2f} GiB"
          + f" (gradient bytes {g / 2**30:.2f} GiB)")
EOF

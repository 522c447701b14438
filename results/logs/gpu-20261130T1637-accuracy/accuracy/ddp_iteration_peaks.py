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

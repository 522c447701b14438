"""FSDP2 wrapping variants of the reference model, timed side by side (issue 5's eager FSDP gap).

Why: parlab's FSDP run (``TorchFSDP``: one ``fully_shard`` unit per transformer block, then
the root -- embeddings, final norm and output projection -- kept unsharded after forward)
reached 44,664 tokens/s per GPU on the 1.3B model on 2xH200, against about 47,000 for a
plain FSDP2 script there. The profile of that run (``results/PAR-TRAINING-STATE/
profile-train-fsdp-*``) shows ~150 ms of GPU kernels in a 183 ms step: the rest is exposed
communication and host gaps. This probe times the wrapping choices that move those:

- ``baseline``: what ``TorchFSDP`` does;
- ``prefetch``: the same units with explicit prefetching (each block's forward issues the
  next block's all-gather, each block's backward the previous one's), so an all-gather
  does not wait for the host to reach the next block;
- ``unit2``: two blocks per ``fully_shard`` unit (half the collectives and hooks, each
  twice the size);
- ``split-root``: the embeddings and the output projection (with the final norm) each their
  own unit, so the output layer's gradient reduce-scatter overlaps the blocks' backward
  instead of running after it;
- ``prefetch+split-root``: both.

What crosses the wire is the same in every variant: per step, every parameter all-gathered
in bf16 for forward and again for backward (except units kept after forward), every
gradient reduce-scattered in fp32. Each variant: a fresh model (seed 0), FSDP2 with bf16
``param_dtype`` and fp32 ``reduce_dtype``, fused AdamW (CUDA), cross-entropy on fp32
logits, ``--warmup`` untimed then ``--steps`` timed steps; time = the slowest rank's wall
time over the timed steps after a device synchronise, divided by the steps. Tokens/s per
GPU = micro-batch x seq / step time. Rank 0 prints the table and writes ``--json``.

    torchrun --nproc-per-node 2 benchmarks/fsdp_variants_probe.py [--model 1.3b] [--json F]

With ``--nproc-per-node 1`` on one GPU the collectives move nothing: the times are FSDP2's
own cost (casts, copy-in/out, hooks) on the model. Without GPUs it runs on gloo CPU ranks
with the tiny model (a dry run: the times say nothing about the GPU). Variants run one after
another in one process; memory a finished variant leaves behind shows in the later peaks.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F

VARIANTS = ("baseline", "prefetch", "unit2", "split-root", "prefetch+split-root")


def wrap(model: Any, variant: str, mesh: Any) -> None:
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    blocks = list(model.layers)
    per = 2 if variant == "unit2" else 1
    units = []
    for i in range(0, len(blocks), per):
        group = blocks[i : i + per]
        fully_shard(group if per > 1 else group[0], mesh=mesh, mp_policy=mp)
        units.append(group[0])
    if "split-root" in variant:
        fully_shard(model.tok_embeddings, mesh=mesh, mp_policy=mp)
        fully_shard(
            [model.norm, model.output], mesh=mesh, mp_policy=mp, reshard_after_forward=False
        )
    fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=False)
    if "prefetch" in variant:
        for i, b in enumerate(units):
            if i + 1 < len(units):
                b.set_modules_to_forward_prefetch([units[i + 1]])
            if i > 0:
                b.set_modules_to_backward_prefetch([units[i - 1]])


def run_variant(variant: str, a: argparse.Namespace, dev: torch.device) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh

    from parlab.models import get_spec
    from parlab.models.reference import build_model

    spec = get_spec(a.model)
    model = build_model(spec, device=dev, dtype=torch.float32, seed=0)
    mesh = init_device_mesh(dev.type, (dist.get_world_size(),))
    wrap(model, variant, mesh)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=dev.type == "cuda")
    gen = torch.Generator().manual_seed(dist.get_rank())
    for step in range(a.warmup + a.steps):
        tokens = torch.randint(0, spec.vocab_size, (a.micro_batch, a.seq + 1), generator=gen)
        tokens = tokens.to(dev)
        if step == a.warmup:
            if dev.type == "cuda":
                torch.cuda.synchronize(dev)
            t0 = time.perf_counter()
        logits = model(tokens[:, :-1])
        loss = F.cross_entropy(logits.flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)
    t = torch.tensor([(time.perf_counter() - t0) / a.steps], dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)  # the slowest rank's step time
    step_s = float(t)
    peak = torch.cuda.max_memory_allocated(dev) if dev.type == "cuda" else None
    del model, opt
    if dev.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(dev)
    return {
        "variant": variant,
        "step_s": step_s,
        "tokens_per_s_per_gpu": a.micro_batch * a.seq / step_s,
        "peak_bytes": peak,
        "loss_last": float(loss.detach()),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default=None)
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=None)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    a.model = a.model or ("1.3b" if cuda else "tiny")
    a.seq = a.seq or (4096 if cuda else 64)
    rows = []
    for v in a.variants.split(","):
        if v not in VARIANTS:
            raise SystemExit(f"unknown variant {v!r}: use some of {', '.join(VARIANTS)}")
        rows.append(run_variant(v, a, dev))
        if dist.get_rank() == 0:
            r = rows[-1]
            pk = "-" if r["peak_bytes"] is None else f"{r['peak_bytes'] / 2**30:.2f} GiB"
            print(
                f"{v:<22} step {r['step_s'] * 1e3:8.1f} ms  {r['tokens_per_s_per_gpu']:>9,.0f} "
                f"tok/s/GPU  peak {pk}  loss {r['loss_last']:.3f}",
                flush=True,
            )
    if dist.get_rank() == 0 and a.json:
        meta = {
            "model": a.model, "micro_batch": a.micro_batch, "seq": a.seq, "warmup": a.warmup,
            "steps": a.steps, "torch": torch.__version__,
            "device": torch.cuda.get_device_name(dev) if cuda else "cpu",
            "world_size": dist.get_world_size(),
        }  # fmt: skip
        with open(a.json, "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

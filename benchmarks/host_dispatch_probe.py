"""Host seconds per dispatched op of torch's DTensor tensor parallelism: the planner's host term.

Why: the DTensor TP runs of PAR-MODEL-INTERNAL (``tp2-dtensor``: the 1.3B model, micro-batch
2 x 4096, one micro-batch, bf16) take 0.27-0.33 s a step where the roofline predicts the GPU's
work at 0.12-0.15 s. Python dispatches every op on a DTensor (sharding propagation, redistribute,
local op), and the host falls behind the GPU. The planner prices that as
``host = ops per step x host seconds per op`` and predicts ``max(roofline, host)``
(``parlab.plan.host``). This probe measures both factors.

What runs: on 2 ranks, the step of those runs (``parlab.projects.model_internal``, impl
``torch``: ``apply_torch_tensor_parallel``'s ``parallelize_module`` -- ColwiseParallel wq/wk/wv/w1/w3,
RowwiseParallel wo/w2, no sequence parallel, embeddings and output whole, the logits replicated;
``F.cross_entropy`` on fp32 logits; ``make_optimizer``'s AdamW, fused over plain parameters and
foreach over DTensor ones; the loss read back each step) on the same model with the same
layers, heads and vocabulary, but hidden ``--hidden`` (default 128) and sequence ``--seq``
(default 256): the GPU idles most of the step, so the step's time is the host's.

1. **Count**: one step under a ``TorchDispatchMode`` that counts every aten op dispatched at the
   top level (an op on DTensors counts once; the local ops DTensor runs inside it are not seen
   again), in two windows: the micro-batch (batch to the device, forward, loss, backward, loss
   read back) and the optimizer (AdamW step, zero_grad). Each window is also counted on models
   of 1 and 2 layers, giving ``ops = fixed + per_layer x layers``, checked against the count at
   the full layer count.
2. **Time**: ``--warmup`` untimed steps, then ``--steps`` steps timed as the runs time theirs
   (``parlab.runtime.meters.StepTimer``: CUDA events on GPU, ``perf_counter`` on CPU) without
   the counting mode; the step time is the median, the slowest rank's. Host seconds per op =
   step time / ops per step. With a second ``--hidden`` (``128,256``) the step is timed at both
   widths: equal times say the GPU's work is not what sets it.

What crosses the wire per step: the RowwiseParallel outputs' all-reduce (wo and w2 in forward,
the ColwiseParallel inputs' gradients in backward; tiny at this width), 2 per layer each way.

Output: a ``distributed-benchmark/v1`` document under ``RESULTS_DIR/PAR-MODEL-INTERNAL/``
(``host-dispatch-<stamp>.json``, task T6, role baseline, evidence ``real-training`` on NCCL and
``cpu-mechanism`` on gloo) whose ``workload.calibration`` the planner reads
(``parlab.plan.host.load_host_dispatch``); it records no ``step_time`` metric, so it is never
taken for a training run. The environment line (torch, CUDA, NCCL, devices) is printed first.

    python3 benchmarks/host_dispatch_probe.py RESULTS_DIR [--model 1.3b] [--hidden 128,256]
    scripts/gpu/host_dispatch.sh OUT_DIR      # the GPU run

It re-launches itself under torchrun (2 ranks) when not started by it; without 2 GPUs the
ranks are gloo CPU ranks (a dry run: CPU op counts differ -- ``F.rms_norm`` decomposes -- and
the times say nothing about the GPU machine). Ctrl-C prints what was measured.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

from parlab.runtime.context import RankContext

FORMAT = "parlab-host-dispatch/v1"
KIND = "host-dispatch-calibration"
WINDOWS = ("microbatch", "optimizer")


class OpCounter(TorchDispatchMode):
    """Counts the aten ops dispatched at the top level, and how many of them touch a DTensor."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0
        self.dtensor_ops = 0

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        from torch.distributed.tensor import DTensor

        self.ops += 1
        if any(issubclass(t, DTensor) for t in types):
            self.dtensor_ops += 1
        return func(*args, **(kwargs or {}))


def probe_spec(model: str, hidden: int, layers: int | None = None, vocab: int | None = None) -> Any:
    """``model``'s spec at width ``hidden`` (FFN in proportion, rounded to 64; heads kept, so
    the head dim shrinks), optionally with another layer count or vocabulary."""
    from parlab.models import get_spec
    from parlab.plan.host import at_width

    s = get_spec(model)
    if hidden % (2 * s.heads):
        raise ValueError(f"--hidden {hidden} must be a multiple of 2 x {s.heads} heads")
    return at_width(model, hidden, name=f"{s.name}-w{hidden}", layers=layers, vocab=vocab)


class DTensorStep:
    """The ``tp2-dtensor`` run's model, optimizer and step (``model_internal.mi_rank``, impl
    ``torch``, one micro-batch) on ``spec``."""

    def __init__(
        self, spec: Any, mesh: Any, dev: torch.device, dtype: torch.dtype, mb: int, seq: int
    ):
        from parlab.data import SyntheticTokens
        from parlab.models.reference import build_model
        from parlab.parallel.tensor import apply_torch_tensor_parallel
        from parlab.projects.model_internal import make_optimizer

        self.model = build_model(spec, device=dev, dtype=dtype, seed=0)
        apply_torch_tensor_parallel(self.model, mesh["tp"])
        self.opt = make_optimizer([p for p in self.model.parameters() if p.requires_grad], dev)
        self.data = SyntheticTokens(vocab_size=spec.vocab_size, seq=seq, seed=0)
        self.dev, self.mb = dev, mb

    def microbatch(self, i: int) -> float:
        b = self.data.global_batch(i, self.mb)
        x, y = b.inputs.to(self.dev), b.labels.to(self.dev)
        out = self.model(x)
        lt = F.cross_entropy(out.flatten(0, 1).float(), y.reshape(-1))
        lt.backward()
        return float(lt.detach())

    def optimizer(self) -> None:
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)

    def step(self, i: int) -> float:
        loss = self.microbatch(i)
        self.optimizer()
        return loss

    def count(self, i: int) -> dict[str, dict[str, int]]:
        """Ops of one step by window: {window: {"ops": n, "dtensor_ops": k}}."""
        out = {}
        for w in WINDOWS:
            with OpCounter() as c:
                self.microbatch(i) if w == "microbatch" else self.optimizer()
            out[w] = {"ops": c.ops, "dtensor_ops": c.dtensor_ops}
        return out


def probe_rank(
    ctx: RankContext,
    *,
    model: str = "1.3b",
    hidden: str = "128",
    layers: int | None = None,
    vocab: int | None = None,
    micro_batch: int = 2,
    seq: int = 256,
    steps: int = 10,
    warmup: int = 3,
) -> dict[str, Any]:
    """Rank function: the op counts (at 1, 2 and the full layers) and the timed steps at each
    width of ``hidden`` (comma-separated)."""
    from parlab.models.reference import norm_kernel
    from parlab.runtime import meters
    from parlab.topology import Topology

    dev = ctx.device
    dtype = torch.bfloat16 if ctx.is_cuda else torch.float32
    mesh = Topology(world_size=ctx.world_size, tp=ctx.world_size).build_mesh(dev.type)
    widths = [int(h) for h in str(hidden).split(",")]
    full = probe_spec(model, widths[0], layers, vocab)
    counts: dict[str, Any] = {}
    for n in sorted({1, 2, full.layers}):
        s = DTensorStep(dataclasses.replace(full, layers=n), mesh, dev, dtype, micro_batch, seq)
        s.step(0)  # the first step builds the optimizer states and caches
        counts[str(n)] = s.count(1)
        del s
    law = {}
    for w in WINDOWS:
        one, two = counts["1"][w]["ops"], counts["2"][w]["ops"]
        law[w] = {"fixed": 2 * one - two, "per_layer": two - one}
    timed = []
    for h in widths:
        s = DTensorStep(probe_spec(model, h, layers, vocab), mesh, dev, dtype, micro_batch, seq)
        losses = [s.step(i) for i in range(warmup)]
        ctx.sync()
        timer = meters.StepTimer(dev)
        timer.mark()
        for i in range(steps):
            losses.append(s.step(warmup + i))
            timer.mark()
        times = timer.step_times()
        timed.append({"hidden": h, "step_s": meters.median(times), "step_times": times})
        del s
    return {
        "spec": {"model": model, "layers": full.layers, "heads": full.heads,
                 "vocab_size": full.vocab_size, "ffn_hidden": full.ffn_hidden},
        "counts": counts,
        "law": law,
        "timed": timed,
        "device": meters.device_name(dev),
        "backend": ctx.backend,
        "norm_kernel": norm_kernel(dev.type),
        "losses_finite": all(x == x for x in losses),
    }  # fmt: skip


def calibration(per_rank: list[dict[str, Any]], *, micro_batch: int, seq: int) -> dict[str, Any]:
    """The ``workload.calibration`` body from every rank's ``probe_rank`` result: the slowest
    rank's step time at the narrowest width over that rank's ops per step."""
    r0 = per_rank[0]
    full = str(r0["spec"]["layers"])
    ops = sum(r0["counts"][full][w]["ops"] for w in WINDOWS)
    dt_ops = sum(r0["counts"][full][w]["dtensor_ops"] for w in WINDOWS)
    step_s = max(r["timed"][0]["step_s"] for r in per_rank)
    law_ok = all(
        r0["law"][w]["fixed"] + r0["law"][w]["per_layer"] * int(full)
        == r0["counts"][full][w]["ops"]
        for w in WINDOWS
    )
    return {
        "format": FORMAT,
        "model": r0["spec"]["model"],
        "layers": int(full),
        "micro_batch": micro_batch,
        "microbatches": 1,
        "seq": seq,
        "hidden": [t["hidden"] for t in r0["timed"]],
        "step_s_by_hidden": [max(r["timed"][i]["step_s"] for r in per_rank)
                             for i in range(len(r0["timed"]))],
        "device": r0["device"],
        "backend": r0["backend"],
        "norm_kernel": r0["norm_kernel"],
        "ops": {w: dict(r0["law"][w]) for w in WINDOWS},
        "ops_law_matches_full_count": law_ok,
        "ops_per_step": ops,
        "dtensor_ops_per_step": dt_ops,
        "counts": r0["counts"],
        "step_s": step_s,
        "host_s_per_op": step_s / ops,
    }  # fmt: skip


def document(body: dict[str, Any], *, command: str, environment: dict[str, Any]) -> Any:
    """The contract document holding ``body`` (see the module docstring)."""
    from parlab.contract import Metric
    from parlab.plan.probes import probe_document

    return probe_document(
        prefix="host-dispatch",
        project="PAR-MODEL-INTERNAL",
        kind=KIND,
        body=body,
        gpu=body["backend"] == "nccl",
        command=command,
        environment=environment,
        layout={
            "world_size": 2,
            "mesh": {"tp": 2},
            "strategy": "tp2-dtensor-host-probe",
            "implementation": "torch",
            "sequence_parallel": False,
            "backend": body["backend"],
            "norm_kernel": body["norm_kernel"],
        },
        metrics={
            "host_s_per_op": Metric(value=body["host_s_per_op"], unit="s"),
            "ops_per_step": Metric(value=float(body["ops_per_step"]), unit="count"),
            "probe_step_s": Metric(value=body["step_s"], unit="s"),
        },
        notes=[
            f"{body['model']} at hidden {body['hidden'][0]} (layers, heads, vocabulary kept), "
            f"micro-batch {body['micro_batch']} x {body['seq']}: the step time is the host's; "
            "ops: top-level aten ops under a TorchDispatchMode (an op on DTensors counts once)",
        ],
    )


def summary(body: dict[str, Any]) -> list[str]:
    lines = [
        f"ops per step: {body['ops_per_step']} ({body['dtensor_ops_per_step']} on DTensors) = "
        + " + ".join(
            f"{w} {body['ops'][w]['fixed']} + {body['ops'][w]['per_layer']} x {body['layers']}"
            for w in WINDOWS
        )
        + ("" if body["ops_law_matches_full_count"] else " (law does NOT match the full count)"),
    ]
    for h, s in zip(body["hidden"], body["step_s_by_hidden"], strict=True):
        lines.append(f"hidden {h}: step {s * 1e3:.2f} ms")
    lines.append(f"host seconds per op: {body['host_s_per_op'] * 1e6:.2f} us")
    return lines


def _torchrun_main(a: argparse.Namespace) -> int:
    cuda = torch.cuda.is_available() and torch.cuda.device_count() >= int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda:
        torch.cuda.set_device(local)
    else:
        torch.set_num_threads(1)
    backend = "nccl" if cuda else "gloo"
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    kw: dict[str, Any] = {"device_id": dev} if cuda else {}
    dist.init_process_group(backend, timeout=_dt.timedelta(seconds=120), **kw)
    ctx = RankContext(
        rank=dist.get_rank(),
        world_size=dist.get_world_size(),
        local_rank=local,
        local_world_size=int(os.environ.get("LOCAL_WORLD_SIZE", "1")),
        backend=backend,
        device=dev,
        timeout_s=120.0,
    )
    try:
        if ctx.rank == 0:
            from parlab.hardware.env import snapshot

            env = snapshot(probe_links=False)
            sw = env.get("software") or {}
            devs = [g["name"] for g in (env.get("hardware") or {}).get("gpus") or []] or ["cpu"]
            print(
                f"torch {sw.get('torch')}, CUDA {sw.get('cuda')}, NCCL {sw.get('nccl')}; "
                f"{backend} on {ctx.world_size} ranks; devices {', '.join(devs)}",
                flush=True,
            )
        res = probe_rank(
            ctx,
            model=a.model,
            hidden=a.hidden,
            layers=a.layers,
            vocab=a.vocab,
            micro_batch=a.micro_batch,
            seq=a.seq,
            steps=a.steps,
            warmup=a.warmup,
        )
        gathered: list[Any] = [None] * ctx.world_size
        dist.all_gather_object(gathered, res)
        if ctx.rank == 0:
            from parlab.contract import write_result

            body = calibration(gathered, micro_batch=a.micro_batch, seq=a.seq)
            print("\n".join(summary(body)))
            doc = document(body, command=" ".join(["python3", *sys.argv]), environment=env)
            print(f"written {write_result(doc, a.results)}")
        dist.barrier()
    except KeyboardInterrupt:
        if ctx.rank == 0:
            print("interrupted: nothing written (the probe writes its document at the end)")
        return 130
    finally:
        dist.destroy_process_group()
    return 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder (the document goes to PAR-MODEL-INTERNAL/)")
    ap.add_argument("--model", default="1.3b", help="the runs' model (its layers, heads, vocab)")
    ap.add_argument("--hidden", default="128", help="probe width(s), comma-separated")
    ap.add_argument("--layers", type=int, default=None, help="override the model's layers")
    ap.add_argument("--vocab", type=int, default=None, help="override the model's vocabulary")
    ap.add_argument("--micro-batch", type=int, default=2)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    if "RANK" in os.environ:
        return _torchrun_main(a)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2"]
    return subprocess.call([*cmd, __file__, *sys.argv[1:]])


if __name__ == "__main__":
    sys.exit(main())

"""``parlab doctor --reproduce CASE``: a small experiment that shows a case, beside its
healthy twin, through the existing commands' functions.

Each reproduction writes two results folders under ``out``: ``case/`` (the
documents that show the case) and ``healthy/`` (the twin that does not), then
the doctor is run on both. What crosses the wire is whatever the reused
command sends:

- ``ddp-small-buckets``: ``parlab profile ddp-buckets`` (torch DDP all-reduces,
  0.01 MB vs 25 MB buckets) on the tiny model, 2 ranks.
- ``pp-bubble``: PP2 1F1B (send/recv of activations and their gradients per
  micro-batch) with 2 against 16 micro-batches, ``parlab project
  model-internal``'s runner.
- ``moe-skew``: ``parlab project moe`` (two all-to-alls per layer) with Zipf 1.5
  routing (hot experts on rank 0) against uniform routing.
- ``oom-activations``: ``parlab train`` DDP under a memory cap below the ledger's
  peak, against full recompute under the same cap.
- ``collective-timeout``: one all-reduce that rank 1 skips (rank 0 waits out a
  3 s process-group timeout), against both ranks joining.
- ``slow-link`` (GPUs only): ``parlab collectives`` all_reduce/all_gather
  1 MiB-1 GiB with ``NCCL_P2P_DISABLE=1`` against the same sweep without it.

CPU reproductions run on gloo CPU ranks (evidence ``cpu-mechanism``); on GPUs
the same code runs on NCCL.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from parlab.contract import Document, Metric, new_run_id, now_iso, write_result
from parlab.doctor.cases import BY_ID
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.profile.sweep import run_sweep
from parlab.projects.model_internal import RunConfig, document, launch_set
from parlab.projects.moe import MoERunConfig, run_moe_project
from parlab.projects.training_state import (
    TrainConfig,
    ledger_predictions,
    run_training,
    train_command,
)
from parlab.runtime.launch import LaunchConfig, launch

PROJECT_TIMEOUT = "PAR-COLLECTIVES"
PG_TIMEOUT_S = 3.0
"""Process-group timeout of the hang reproduction (the waiting rank fails after it)."""


@dataclass(frozen=True, kw_only=True)
class Reproduction:
    """One case's reproduction."""

    case: str
    """The case id it shows."""
    needs_gpu: bool
    """True: needs 2 CUDA GPUs (refused on CPU with a usage error)."""
    run: Callable[[Path], tuple[Path, Path]]
    """``out`` -> (case folder, healthy folder)."""


def _gpu2() -> bool:
    return torch.cuda.is_available() and torch.cuda.device_count() >= 2


def _move(paths: list[Path], src_root: Path, dst_root: Path) -> None:
    """Move documents (and nothing else) from one results folder to another."""
    for p in paths:
        dst = dst_root / p.relative_to(src_root)
        dst.parent.mkdir(parents=True, exist_ok=True)
        p.replace(dst)


# ----- ddp-small-buckets --------------------------------------------------------------------


def ddp_small_buckets(out: Path) -> tuple[Path, Path]:
    case, healthy = out / "case", out / "healthy"
    gpu = _gpu2()
    model, seq = ("small", 256) if gpu else ("tiny", 64)
    buckets = [0.01, 25.0]
    res = run_sweep(
        "ddp-buckets",
        {"model": model, "batch": 2, "seq": seq, "buckets_mb": buckets},
        nproc=2,
        backend="auto",
        timeout=120.0,
        results=case,
        trace_dir=None,
        schedule="1,1,2",
        project="PAR-TRAINING-STATE",
        command=f"parlab profile ddp-buckets --buckets 0.01,25 --model {model} --seq {seq} "
        f"--nproc 2 --results {case}",
        plot=("DDP: exposed communication vs bucket_cap_mb", "bucket_cap_mb"),
    )
    if res.failure is not None:
        raise RuntimeError(f"ddp-buckets sweep failed ({res.failure.kind}): {res.failure.message}")
    # the healthy twin: the 25 MB setting of the same sweep (a copy; the case keeps both)
    for o in res.outcomes:
        if o.doc.layout.get("bucket_cap_mb") == 25.0:
            dst = healthy / o.path.relative_to(case)
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(o.path, dst)
    return case, healthy


# ----- pp-bubble ----------------------------------------------------------------------------


def pp_bubble(out: Path) -> tuple[Path, Path]:
    gpu = _gpu2()
    model, seq = ("small", 512) if gpu else ("tiny", 64)
    configs = [
        RunConfig(name=f"pp2-1f1b-m{m}", model=model, nproc=2, pp=2, schedule="1f1b",
                  micro_batch=1, microbatches=m, seq=seq, steps=3, warmup=1,
                  dtype="bf16" if gpu else "fp32", timeout_s=120.0)
        for m in (2, 16)
    ]  # fmt: skip
    outs, fails, backend = launch_set(configs, gpu=gpu, timeout_s=120.0)
    env = snapshot(probe_links=gpu)
    dirs = (out / "case", out / "healthy")
    for cfg, res, fail, folder in zip(configs, outs, fails, dirs, strict=True):
        doc = document(
            cfg, res, fail, environment=env, backend=backend,
            command=f"parlab doctor --reproduce pp-bubble  # {cfg.name}: {cfg.microbatches} "
            "micro-batches on 2 stages",
        )  # fmt: skip
        write_result(doc, folder)
        if fail is not None:
            raise RuntimeError(f"{cfg.name} failed ({fail.kind}): {fail.message}")
    return dirs


# ----- moe-skew -----------------------------------------------------------------------------


def moe_skew(out: Path) -> tuple[Path, Path]:
    case, healthy = out / "case", out / "healthy"
    gpu = _gpu2()
    hidden, ffn, tokens = (1024, 2048, 8192) if gpu else (128, 256, 1024)
    cfg = MoERunConfig(
        ep=2, experts=8, topk=2, capacity_factor=None, drop="none", skews=(1.5,),
        hidden=hidden, ffn_hidden=ffn, tokens=tokens, train_steps=0, warmup=1, iters=3,
        naive=False,
    )  # fmt: skip
    args = (f"--ep 2 --experts 8 --topk 2 --drop none --skew zipf:1.5 --hidden {hidden} "
            f"--ffn-hidden {ffn} --tokens {tokens} --train-steps 0 --warmup 1 --iters 3 "
            "--no-naive")  # fmt: skip
    res = run_moe_project(cfg, results=case, command=f"parlab project moe {args} --results {case}")
    if not res.ok:
        f = res.documents[0].failure
        raise RuntimeError(f"moe run failed: {f.message if f else '?'}")
    # the healthy twin: the uniform-routing workload of the same launch
    uniform = [p for p, d in zip(res.paths, res.documents, strict=True)
               if d.workload.get("kind") == "uniform"]  # fmt: skip
    _move(uniform, case, healthy)
    return case, healthy


# ----- oom-activations ----------------------------------------------------------------------


def oom_activations(out: Path) -> tuple[Path, Path]:
    gpu = _gpu2()
    model, seq, mb = ("small", 1024, 4) if gpu else ("tiny", 256, 8)
    base = TrainConfig(strategy="ddp", model=model, nproc=2, seq=seq, micro_batch=mb, steps=1,
                       warmup=1, timeout_s=120.0)  # fmt: skip
    backend = "nccl" if gpu else "gloo"
    peak_none = ledger_predictions(base, backend)[0]["peak_memory"].value
    full = TrainConfig(**{**base.to_json(), "recompute": "full"})
    peak_full = ledger_predictions(full, backend)[0]["peak_memory"].value
    assert peak_none and peak_full and peak_full < peak_none
    cap = int((peak_none + peak_full) / 2)  # between the two predicted peaks
    dirs = (out / "case", out / "healthy")
    for rc, folder in zip(("none", "full"), dirs, strict=True):
        cfg = TrainConfig(**{**base.to_json(), "recompute": rc, "memory_cap": cap})
        doc = run_training(cfg, command=train_command(cfg))
        write_result(doc, folder)
    return dirs


# ----- collective-timeout -------------------------------------------------------------------


def collective_timeout(out: Path) -> tuple[Path, Path]:
    gpu = _gpu2()
    dirs = (out / "case", out / "healthy")
    for skip, folder in zip((1, None), dirs, strict=True):
        lc = LaunchConfig(nproc=2, backend="auto", timeout_s=PG_TIMEOUT_S, deadline_s=60.0)
        res = launch("parlab.doctor.timeout_rank:timeout_rank", {"skip_rank": skip, "nbytes": 4096},
                     lc)  # fmt: skip
        metrics: dict[str, Metric] = {}
        if res.ok:
            metrics["all_reduce_time"] = Metric(
                value=max(r["time_s"] for r in res.results), unit="s",
                per_rank=[r["time_s"] for r in res.results],
            )  # fmt: skip
        doc = Document(
            run_id=new_run_id("doctor-timeout" if skip is not None else "doctor-join"),
            created=now_iso(),
            project=PROJECT_TIMEOUT,
            task="T1",
            role="failure" if not res.ok else "baseline",
            evidence_level="real-nccl" if gpu else "cpu-mechanism",
            command="parlab doctor --reproduce collective-timeout",
            environment=snapshot(probe_links=gpu),
            workload={
                "kind": "doctor-reproduction",
                "case": "collective-timeout",
                "collective": "all_reduce",
                "bytes": 4096,
                "skipped_by_rank": skip,
            },
            layout={
                "world_size": 2,
                "mesh": {"world": 2},
                "backend": lc.resolved_backend(),
                "pg_timeout_s": PG_TIMEOUT_S,
            },
            metrics=metrics,
            status="ok" if res.ok else "failed",
            failure=res.failure,
            notes=[
                "rank 1 skips the all-reduce; rank 0 waits in it until the process-group timeout"
                if skip is not None
                else "both ranks join the all-reduce"
            ],
        )
        write_result(doc, folder)
    return dirs


# ----- slow-link (GPU) ----------------------------------------------------------------------


def slow_link(out: Path) -> tuple[Path, Path]:
    if not _gpu2():
        raise UsageError(
            "reproduction slow-link needs 2 CUDA GPUs (NCCL_P2P_DISABLE acts on NCCL only): run "
            "it on a GPU machine; on CPU try ddp-small-buckets, pp-bubble, moe-skew, "
            "oom-activations or collective-timeout"
        )
    dirs = (out / "case", out / "healthy")
    for p2p_off, folder in zip((True, False), dirs, strict=True):
        env = {k: v for k, v in os.environ.items() if k != "NCCL_P2P_DISABLE"}
        if p2p_off:
            env["NCCL_P2P_DISABLE"] = "1"
        src = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = src + os.pathsep + env.get("PYTHONPATH", "")
        cmd = [sys.executable, "-m", "parlab", "collectives", "--op", "all_reduce,all_gather",
               "-b", "1MiB", "-e", "1GiB", "-f", "4", "-w", "3", "-n", "10", "--nproc", "2",
               "--results", str(folder)]  # fmt: skip
        subprocess.run(cmd, env=env, check=True, timeout=300)
    return dirs


REPRODUCTIONS: dict[str, Reproduction] = {
    r.case: r
    for r in (
        Reproduction(case="ddp-small-buckets", needs_gpu=False, run=ddp_small_buckets),
        Reproduction(case="pp-bubble", needs_gpu=False, run=pp_bubble),
        Reproduction(case="moe-skew", needs_gpu=False, run=moe_skew),
        Reproduction(case="oom-activations", needs_gpu=False, run=oom_activations),
        Reproduction(case="collective-timeout", needs_gpu=False, run=collective_timeout),
        Reproduction(case="slow-link", needs_gpu=True, run=slow_link),
    )
}


def get(case: str) -> Reproduction:
    """The reproduction of ``case``; ``UsageError`` naming the ones that exist."""
    if case in REPRODUCTIONS:
        return REPRODUCTIONS[case]
    have = ", ".join(REPRODUCTIONS)
    if case in BY_ID:
        raise UsageError(f"case {case!r} has no reproduction ({BY_ID[case].reproduce_note}): "
                         f"reproducible cases are {have}")  # fmt: skip
    raise UsageError(f"unknown case {case!r}: use one of {have} (parlab doctor --list)")

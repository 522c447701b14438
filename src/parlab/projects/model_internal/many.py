"""Several model-internal runs in one launch (``mi_many``): each isolated, its failure kept,
the ranks agreeing before each run whether it fits the set's time budget."""

from __future__ import annotations

import dataclasses
import gc
import json
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from parlab.projects.model_internal.rank import mi_rank
from parlab.runtime import meters
from parlab.runtime.context import RankContext
from parlab.runtime.failures import classify, one_line


def _work(r: dict[str, Any]) -> float:
    """Rough cost of a run (tokens per step, attention's quadratic term, per rank)."""
    seq = r["seq"]
    return r["micro_batch"] * r["microbatches"] * seq * (1 + seq / 16384) / r["nproc"]


def _free(ctx: RankContext) -> None:
    """Give back what the last run held before the next one is built."""
    gc.collect()
    if ctx.is_cuda:
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(ctx.device)


def _agree(ctx: RankContext, value: float, op: Any) -> float:
    """One scalar reduced over every rank (MAX or MIN), on the rank's device."""
    t = torch.tensor([value], dtype=torch.float64 if not ctx.is_cuda else torch.float32)
    t = t.to(ctx.device)
    dist.all_reduce(t, op=op)
    return float(t)


def _isolated(ctx: RankContext, r: dict[str, Any]) -> dict[str, Any] | None:
    """One run of ``mi_many`` on the ranks it needs (a one-rank baseline: rank 0 alone), its
    failure (out of memory included) kept as ``{"failure": ...}``; then every rank agrees
    whether any failed, so a rank whose peer failed marks the run failed too."""
    res: dict[str, Any] | None = None
    mine = r["nproc"] > ctx.rank
    try:
        if r["nproc"] == 1 and ctx.world_size > 1:  # a baseline: rank 0 alone
            if ctx.rank == 0:
                res = mi_rank(dataclasses.replace(ctx, world_size=1, local_world_size=1), **r)
        elif mine:
            res = mi_rank(ctx, **r)
    except Exception as exc:
        res = {"failure": {"kind": classify(exc), "message": one_line(exc), "rank": ctx.rank}}
        del exc
    _free(ctx)
    failed = res is not None and "failure" in res
    # every rank takes part in this all-reduce, whatever happened to it
    peer_failed = ctx.world_size > 1 and _agree(ctx, float(failed), dist.ReduceOp.MAX)
    if peer_failed and not failed and mine:
        res = {
            "failure": {"kind": "crash", "message": "another rank of this run failed", "peer": True}
        }
    return res


def mi_many(
    ctx: RankContext,
    runs: list[dict[str, Any]],
    partial_dir: str | None = None,
    deadline: float | None = None,
) -> list[dict[str, Any] | None]:
    """Rank function: several runs in one launch (one start-up), each isolated (``_isolated``).

    Before a run the ranks agree (all-reduce MIN) whether it fits before ``deadline``
    (epoch seconds; rank 0 estimates it from the slowest step time per token so far and
    the last run's time outside its steps); memory is freed before the next. A one-rank
    baseline runs on rank 0 while the others wait in the failure all-reduce. With
    ``partial_dir`` every rank writes each run's outcome there at once
    (``run<i>.rank<r>.json``), so a launch that dies keeps the runs it finished."""
    out: list[dict[str, Any] | None] = []
    rate = 0.0  # seconds of one step per unit of ``_work``, the slowest run so far
    overhead = 0.0  # seconds of the last run outside its steps (build, replays)
    for i, r in enumerate(runs):
        n_steps = r["warmup"] + 1 + r["steps"]
        go = 1.0
        if deadline is not None and ctx.rank == 0 and rate > 0:
            need = 1.3 * (overhead + n_steps * rate * _work(r)) + 3
            go = float(need < deadline - time.time())
        if ctx.world_size > 1:
            go = _agree(ctx, go, dist.ReduceOp.MIN)
        res: dict[str, Any] | None
        if not go:
            res = {
                "failure": {
                    "kind": "timeout",
                    "message": "not run: it would not finish "
                    "within the set's time budget (--budget)",
                }
            }
        else:
            t0 = time.monotonic()
            res = _isolated(ctx, r)
            if res is not None and "failure" not in res and res.get("step_times"):
                step = meters.median(res["step_times"])
                rate = max(rate, step / max(_work(r), 1.0))
                overhead = max(0.0, time.monotonic() - t0 - n_steps * step)
        out.append(res)
        if partial_dir is not None:
            path = Path(partial_dir) / f"run{i}.rank{ctx.rank}.json"
            tmp = path.with_suffix(".tmp")
            tmp.write_text(json.dumps({"result": res}))
            tmp.replace(path)
    return out

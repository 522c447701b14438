"""The process torchrun starts on every rank.

It reads a JSON spec (entry point ``module:function`` and its keyword
arguments), joins the process group (NCCL on GPUs, gloo on CPU) with the
run's timeout, calls ``function(ctx, **kwargs)``, gathers every rank's return
value to rank 0 (on several nodes: to every node's local rank 0), which writes them to
``<out_dir>/result.json``. A rank
that raises writes ``<out_dir>/error-rank<R>.json`` (kind, one-line message,
traceback) and exits non-zero at once, so torchrun stops the others.

Usage (what ``parlab.runtime.launch`` runs): ``python -m parlab.runtime.worker SPEC.json``
"""

from __future__ import annotations

import datetime as _dt
import faulthandler
import importlib
import json
import os
import sys
import time
import traceback
from typing import Any

import torch
import torch.distributed as dist

from parlab.contract import atomic_write_text, json_default
from parlab.runtime.context import RankContext, limit_cpu_threads
from parlab.runtime.failures import classify, one_line


def resolve(entry: str) -> Any:
    module, _, name = entry.partition(":")
    if not module or not name:
        raise ValueError(f"entry point {entry!r} is not 'module:function'")
    return getattr(importlib.import_module(module), name)


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    out_dir = spec["out_dir"]
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    local_world = int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    backend = spec["backend"]
    timeout_s = float(spec["timeout_s"])
    # A rank killed by a signal (SIGSEGV in a kernel library, say) leaves its Python
    # stack here, so the launcher can name the rank and where it died.
    fault_log = open(os.path.join(out_dir, f"fault-rank{rank}.log"), "w")  # noqa: SIM115
    faulthandler.enable(file=fault_log, all_threads=True)
    try:
        if backend == "nccl":
            torch.cuda.set_device(local_rank)
            device = torch.device("cuda", local_rank)
        else:
            limit_cpu_threads(local_world)
            device = torch.device("cpu")
        init: dict[str, Any] = {"backend": backend, "timeout": _dt.timedelta(seconds=timeout_s)}
        if backend == "nccl":
            init["device_id"] = device
        dist.init_process_group(**init)
        ctx = RankContext(
            rank=rank,
            world_size=world,
            local_rank=local_rank,
            local_world_size=local_world,
            backend=backend,
            device=device,
            timeout_s=timeout_s,
        )
        fn = resolve(spec["entry"])
        result = fn(ctx, **spec.get("kwargs", {}))
        # several nodes: each node's launcher writes its own document, so every node's
        # local rank 0 gets every rank's result
        multi_node = world > local_world
        gathered: list[Any] | None = [None] * world if rank == 0 or multi_node else None
        if multi_node:
            dist.all_gather_object(gathered, result)
        else:
            dist.gather_object(result, gathered, dst=0)
        if (local_rank if multi_node else rank) == 0:
            body = {"results": gathered, "group_rank": int(os.environ.get("GROUP_RANK", "0"))}
            atomic_write_text(
                os.path.join(out_dir, "result.json"), json.dumps(body, default=json_default)
            )
        dist.barrier()
        dist.destroy_process_group()
        return 0
    except BaseException as exc:
        error = {
            "rank": rank,
            "kind": classify(exc),
            "message": one_line(exc),
            "traceback": traceback.format_exc(),
            "time": time.time(),
        }
        atomic_write_text(os.path.join(out_dir, f"error-rank{rank}.json"), json.dumps(error))
        sys.stderr.write(f"[parlab rank {rank}] {error['message']}\n")
        sys.stderr.flush()
        # Leave at once: tearing down a process group whose peers are gone can block.
        os._exit(1)


if __name__ == "__main__":
    code = main(sys.argv[1])
    # Leave without running C++ static destructors: with the work done and the results
    # written, one of torch's (after a profiled gloo DDP run) sometimes calls
    # std::terminate at exit -- SIGABRT with no Python frame, about 1 CPU run in 50 --
    # and turns a finished rank into a crash.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)

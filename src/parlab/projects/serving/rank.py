"""What runs outside the project's own process: the replicas (child processes, one per
device, or running servers given by URL) and the two ranks of the KV-cache transfer.

What crosses the wire: HTTP to the replicas (``GET /version``, ``/v1/models``, the reset of
their prefix caches); for the KV transfer, one request's KV blocks rank 0 -> rank 1 over
``send``/``recv`` (NCCL on two GPUs, gloo on the CPU), ``kvxfer.rank_main``.
"""

from __future__ import annotations

import contextlib
from typing import Any

import aiohttp

from parlab.contract import Document
from parlab.dtypes import TENSOR_DTYPE_OF
from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.projects.serving import documents
from parlab.projects.serving.config import Preset
from parlab.runtime.launch import LaunchConfig, launch
from parlab.serve.procs import ReplicaProcess, spawn_replica, wait_replica

RESETS = ("/engine/reset", "/reset_prefix_cache", "/flush_cache")
"""Prefix-cache resets, tried in turn: parlab's, vLLM's, SGLang's."""


def start_replicas(p: Preset) -> list[ReplicaProcess]:
    """One reference replica per device of ``p``, started together, each on a free port."""
    args = ["--model", p.model, "--tensor-dtype", TENSOR_DTYPE_OF[p.dtype]]
    args += ["--max-batch", str(p.max_batch)]
    args += ["--max-len", str(p.max_len), "--cache-blocks", str(p.cache_blocks)]
    pending = [spawn_replica([*args, "--device", d], threads=1, duration_s=1800) for d in p.devices]
    try:
        return [wait_replica(x) for x in pending]
    except BaseException:
        for proc, _ in pending:
            if proc.poll() is None:
                proc.kill()
                proc.wait(5)
        raise


async def _get(s: aiohttp.ClientSession, url: str) -> Any:
    with contextlib.suppress(aiohttp.ClientError, TimeoutError, ValueError):
        async with s.get(url, timeout=aiohttp.ClientTimeout(total=10)) as r:
            if r.status == 200:
                return await r.json(content_type=None)
    return None


async def identify(url: str) -> dict[str, Any]:
    """What serves at ``url``: its model (``/v1/models``), engine and version (``/version``:
    parlab's replica and vLLM answer it; else the model card's ``owned_by``)."""
    async with aiohttp.ClientSession() as s:
        models = await _get(s, url + "/v1/models") or {}
        version = await _get(s, url + "/version") or {}
    card = (models.get("data") or [{}])[0] if isinstance(models, dict) else {}
    return {
        "url": url,
        "model": card.get("id"),
        "engine": version.get("engine") or card.get("owned_by") or "unknown",
        "version": version.get("version") or "unknown",
        "max_model_len": card.get("max_model_len"),
    }


async def reset_cache(url: str) -> str | None:
    """Empty the replica's prefix cache through the first reset it answers; the path used,
    or None where it has none."""
    async with aiohttp.ClientSession() as s:
        for path in RESETS:
            with contextlib.suppress(aiohttp.ClientError, TimeoutError):
                async with s.post(url + path, timeout=aiohttp.ClientTimeout(total=30)) as r:
                    if r.status == 200:
                        return path
    return None


def measure_kv(
    *, model: str, dtype: str, tokens: list[int], iters: int, timeout_s: float, command: str
) -> Document:
    """One request's KV blocks sent rank 0 -> rank 1 at each length of ``tokens``
    (``kvxfer.rank_main``, two ranks launched here), as a document with the fit."""
    from parlab.serve import kvxfer  # lazy: torch

    if dtype not in kvxfer.DTYPES:
        raise UsageError(f"--dtype {dtype!r} is not one of {', '.join(kvxfer.DTYPES)}")
    spec = get_spec(model)
    kwargs = {
        "tokens": tokens,
        "layers": spec.layers,
        "kv_heads": spec.n_kv_heads,
        "head_dim": spec.d_head,
        "dtype": dtype,
        "iters": iters,
    }
    cfg = LaunchConfig(nproc=2, backend="auto", timeout_s=timeout_s)
    res = launch("parlab.serve.kvxfer:rank_main", kwargs, cfg)
    per_tok = kvxfer.kv_bytes_per_token(spec.layers, spec.n_kv_heads, spec.d_head, dtype)
    rows = next(r for r in res.results if r["rank"] == 1)["rows"] if res.ok else None
    return documents.kv_transfer_document(
        rows,
        res.failure,
        workload={"model": model, "kv_bytes_per_token": per_tok, **kwargs},
        backend=cfg.resolved_backend(),
        command=command,
    )

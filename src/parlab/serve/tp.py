"""Tensor-parallel reference replica: one model sharded across ranks, one HTTP front.

Sharding (Megatron-style, the reference model's torchtitan names):
``attention.wq/wk/wv`` column-sharded by heads (each rank keeps
``heads / tp`` query heads and ``kv_heads / tp`` KV heads, so its KV cache
holds only its own heads), ``attention.wo`` row-sharded; the FFN's
``w1``/``w3`` column-sharded and ``w2`` row-sharded. Embedding, norms and the
output projection stay replicated, so every rank ends with the same logits.

What crosses the wire, per engine iteration:
- one ``broadcast_object_list`` from rank 0: the requests submitted and
  cancelled since the last step (prompt ids, max_tokens, sampling), so
  every rank runs the same deterministic scheduler (``Engine.step``) on the
  same inputs -- same rows, same pages, same prefix-cache hits, same batch;
- per layer, two ``all_reduce(SUM)`` of the ``[B, S, hidden]`` partial
  outputs of ``wo`` and ``w2`` (the paper's ``g``), in the model's dtype.
Rank 0 alone serves HTTP (the others sample the same token from the same logits -- the
sampler hashes each request's seed -- and throw it away). When idle, rank 0 sends an empty
iteration every second so the others never wait past the group's timeout; a
``None`` message stops them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from parlab.errors import UsageError
from parlab.models.reference import build_model
from parlab.runtime.context import RankContext
from parlab.serve import protocol
from parlab.serve.engine import Engine, EngineConfig
from parlab.serve.replica import ReplicaServer, serving_spec


class TPComm:
    """The tensor-parallel group's two operations."""

    def __init__(self, rank: int, world: int, group: Any = None) -> None:
        self.rank, self.world, self.group = rank, world, group

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_reduce(self, x: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(x, op=dist.ReduceOp.SUM, group=self.group)
        return x

    def broadcast_plan(self, obj: Any) -> Any:
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0, group=self.group)
        if box[0] is None:
            raise StopIteration
        return box[0]

    def stop(self) -> None:
        dist.broadcast_object_list([None], src=0, group=self.group)


def _shard(lin: nn.Linear, dim: int, rank: int, world: int) -> None:
    w = lin.weight.data
    if w.shape[dim] % world:
        raise UsageError(f"a {tuple(w.shape)} weight does not split {world} ways on dim {dim}")
    lin.weight = nn.Parameter(w.chunk(world, dim=dim)[rank].contiguous(), requires_grad=False)
    if lin.bias is not None:
        if dim == 0:
            lin.bias = nn.Parameter(lin.bias.data.chunk(world)[rank].contiguous())
        elif rank != 0:
            lin.bias = nn.Parameter(torch.zeros_like(lin.bias.data))  # added once after the sum


def shard_model(model: nn.Module, rank: int, world: int) -> nn.Module:
    """Shard a reference model in place for tensor parallelism (see the module docstring)."""
    spec = model.spec
    if spec.mla is not None or spec.moe is not None:
        raise UsageError(f"tensor-parallel replica: {spec.name} has MLA/MoE; use a dense model")
    if spec.n_kv_heads % world or spec.heads % world:
        raise UsageError(
            f"--tp {world} must divide heads ({spec.heads}) and kv_heads ({spec.n_kv_heads})"
        )
    for layer in model.layers:
        a, f = layer.attention, layer.feed_forward
        for lin in (a.wq, a.wk, a.wv):
            _shard(lin, 0, rank, world)
        _shard(a.wo, 1, rank, world)
        _shard(f.w1, 0, rank, world)
        if f.w3 is not None:
            _shard(f.w3, 0, rank, world)
        _shard(f.w2, 1, rank, world)
    return model


def build_tp_engine(ctx: RankContext, *, model: str, dtype: str, seed: int, config: Any) -> Any:
    """Every rank builds the same seeded model, keeps its shard, and wraps it in an Engine."""
    dtypes = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
    m = build_model(serving_spec(model), device=ctx.device, dtype=dtypes[dtype], seed=seed)
    shard_model(m, ctx.rank, ctx.world_size)
    return Engine(m, config, tp=TPComm(ctx.rank, ctx.world_size))


def worker_loop(engine: Any) -> None:
    """Non-zero ranks: step in lockstep with rank 0 until it says stop."""
    try:
        while True:
            engine.step()
    except StopIteration:
        return


def replica_main(
    ctx: RankContext,
    *,
    model: str = "tiny",
    dtype: str = "float32",
    seed: int = 0,
    host: str = "127.0.0.1",
    port: int = 0,
    duration_s: float = 600.0,
    max_batch: int = 16,
    max_len: int = 2048,
    cache_blocks: int = 4096,
    prefix_cache: bool = True,
) -> dict[str, Any]:
    """Rank function (``parlab.runtime.launch``): a TP replica serving for ``duration_s``."""
    cfg = EngineConfig(
        max_batch=max_batch, max_len=max_len, cache_blocks=cache_blocks, prefix_cache=prefix_cache
    )
    eng = build_tp_engine(ctx, model=model, dtype=dtype, seed=seed, config=cfg)
    if not ctx.is_main:
        worker_loop(eng)
        return {"rank": ctx.rank}

    async def main() -> dict[str, Any]:
        server = ReplicaServer(eng, name=f"parlab-{model}-tp{ctx.world_size}", heartbeat_s=1.0)
        await protocol.serve_until(server, host, port, duration_s)
        return server.stats()

    try:
        stats = asyncio.run(main())
    finally:
        eng.tp.stop()
    return {"rank": 0, **stats}

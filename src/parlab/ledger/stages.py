"""One pipeline stage's element counts under a data-parallel strategy (``stage_numbers``,
cached), the layout checks (``check_layout``), and the stage's layers and widths."""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

from parlab.errors import UsageError
from parlab.ledger.sharding import (
    check_ep,
    check_pp,
    check_tp,
    dim0_chunk_numel,
    flat_shard_numel,
    holding,
    stage_layers,
    unit_dim0_numel,
)
from parlab.models.spec import ModelSpec
from parlab.topology import Topology

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp", "fsdp-hybrid")
"""Data-parallel strategies (``fsdp`` is FSDP2 full shard; zero3 the flat-unit form)."""

OFFLOADS = ("none", "optimizer", "params")


def check_positive(**values: int) -> None:
    """``UsageError`` naming the first of ``values`` that is not a whole number >= 1."""
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise UsageError(f"{name} = {v!r}: give a whole number of at least 1")


def check_layout(
    spec: ModelSpec,
    topology: Topology,
    *,
    strategy: str,
    shard_size: int | None = None,
    virtual_stages: int = 1,
    kv_replicate: bool = True,
) -> int:
    """Validate a layout for ``spec``; return the shard count N. ``UsageError`` names the field."""
    if strategy not in STRATEGIES:
        raise UsageError(f"strategy = {strategy!r}: use one of {', '.join(STRATEGIES)}")
    check_tp(spec, topology.tp, kv_replicate=kv_replicate)
    check_pp(spec, topology.pp, virtual_stages)
    check_ep(spec, topology.ep)
    n = topology.dp
    if strategy == "fsdp-hybrid":
        if shard_size is None:
            raise UsageError("fsdp-hybrid needs shard_size (ranks of one shard group)")
        check_positive(shard_size=shard_size)
        if topology.dp % shard_size:
            raise UsageError(f"shard_size = {shard_size} does not divide dp = {topology.dp}")
        n = shard_size
    if strategy == "zero3" and spec.tied_embeddings:
        raise UsageError(
            "zero3 gathers per unit and cannot shard tied embeddings: use fsdp or an untied model"
        )
    return n


@dataclass(frozen=True)
class StageNumbers:
    """Element counts of one stage's rank: what it holds, shards, gathers and reduces."""

    params: int
    grads: int
    optim: int
    largest_unit: int
    largest_block: int
    root: int
    held: int
    matmul: int
    head: int
    chunks: tuple[int, ...] | None
    unsharded: int = 0
    block_matmul: int = 0
    """Matmul elements of this stage's largest block (what autocast casts for one block)."""
    blocks_matmul: int = 0
    """Matmul elements of every block of this stage (the weights full recompute re-casts)."""


@lru_cache(maxsize=65536)
def stage_numbers(
    spec: ModelSpec,
    tp: int,
    pp: int,
    ep: int,
    stage: int,
    virtual: int,
    strategy: str,
    n: int,
    vocab_parallel: bool = True,
    v_shape: bool = False,
) -> StageNumbers:
    """Element counts of one stage's rank under a strategy (cached: fit calls this a lot)."""
    h = holding(
        spec, tp=tp, pp=pp, ep=ep, stage=stage, virtual=virtual, vocab_parallel=vocab_parallel,
        v_shape=v_shape,
    )  # fmt: skip
    held = h.numel
    matmul = h.matmul_numel
    head = sum(u.numel for u in h.sizes if u.name == "head")
    block_mm = [u.matmul for u in h.sizes if u.name not in ("embeddings", "head")]
    mm = {"block_matmul": max(block_mm, default=0), "blocks_matmul": sum(block_mm)}
    ne = max(1, n // ep)
    if strategy == "ddp":
        return StageNumbers(
            params=held, grads=held, optim=held, largest_unit=max(h.unit_numels()),
            largest_block=0, root=0, held=held, matmul=matmul, head=head, chunks=None, **mm,
        )  # fmt: skip
    if strategy in ("zero1", "zero2", "zero3"):
        dense, exp = h.unit_numels(experts=False), h.unit_numels(experts=True)
        shard = sum(flat_shard_numel(u, n) for u in dense) + sum(
            flat_shard_numel(u, ne) for u in exp
        )
        padded = sum(flat_shard_numel(u, n) * n for u in dense) + sum(
            flat_shard_numel(u, ne) * ne for u in exp
        )
        largest = math.ceil(max(h.unit_numels()) / n) * n
        blocks = [u.numel for u in h.sizes if u.name not in ("embeddings", "head")]
        block = math.ceil(max(blocks, default=0) / n) * n
        return StageNumbers(
            params=shard if strategy == "zero3" else padded,
            grads=padded if strategy == "zero1" else shard,
            optim=shard, largest_unit=largest, largest_block=block, root=0, held=held,
            matmul=matmul, head=head,
            chunks=None, **mm,
        )  # fmt: skip
    # fsdp / fsdp-hybrid: dim-0 shards of every parameter (identical shapes counted once)
    shard = 0
    root = 0
    largest = 0
    unsharded = 0
    for us in h.sizes:
        group = ne if us.expert else n
        u = unit_dim0_numel(us.shapes, group)
        shard += u
        unsharded += u * group
        if us.name in ("embeddings", "head"):
            root += u * group
        else:
            largest = max(largest, u * group)
    chunks = None
    if n <= 64 and ep == 1:
        all_counts = h.shape_counts()
        chunks = tuple(
            sum(c * dim0_chunk_numel(s, n, i) for s, c in all_counts.items()) for i in range(n)
        )
    return StageNumbers(
        params=shard, grads=shard, optim=shard, largest_unit=max(largest, root),
        largest_block=largest, root=root, unsharded=unsharded, held=held,
        matmul=matmul, head=head, chunks=chunks, **mm,
    )  # fmt: skip


@lru_cache(maxsize=65536)
def layer_kinds(spec: ModelSpec, layer_ids: tuple[int, ...]) -> tuple[tuple[int, int], ...]:
    """(a representative layer, how many) of each kind of block (dense, MoE) in ``layer_ids``:
    blocks of one kind keep the same bytes."""
    groups: dict[bool, list[int]] = {}
    for i in layer_ids:
        groups.setdefault(spec.is_moe_layer(i), []).append(i)
    return tuple((ids[0], len(ids)) for ids in groups.values())


def offloaded(offload: str) -> set[str]:
    """The items ``offload`` moves to the host."""
    if offload == "optimizer":
        return {"optimizer", "master_params", "master_grads", "optimizer_temporaries"}
    if offload == "params":
        return {
            "params", "grads", "optimizer", "master_params", "master_grads",
            "optimizer_temporaries",
        }  # fmt: skip
    return set()


def stage_layer_ids(
    spec: ModelSpec, pp: int, stage: int, virtual: int, v_shape: bool = False
) -> list[int]:
    """The layers a rank of ``stage`` holds (``sharding.stage_layers``)."""
    return stage_layers(spec.layers, pp, stage, virtual, v_shape=v_shape)


def ffn_width(spec: ModelSpec, layer_ids: list[int]) -> int:
    """The widest FFN of the first and last of ``layer_ids`` (MoE: top-k experts + shared)."""
    width = 0
    for i in layer_ids[:1] + layer_ids[-1:]:
        if spec.is_moe_layer(i):
            m = spec.moe
            assert m is not None
            width = max(width, m.top_k * m.expert_ffn_hidden + m.shared_hidden)
        else:
            width = max(width, spec.ffn_hidden)
    return width

"""ZeRO's units: the model's parameters grouped (``default_units``), each group flattened into
a ``FlatUnit``, and the buffers each stage keeps of it (``shard_buffers``)."""

from __future__ import annotations

import torch
from torch import nn

from parlab.errors import UsageError
from parlab.parallel.data import unique_params
from parlab.parallel.data_comm import FlatUnit
from parlab.runtime.meters import resize_storage


def default_units(model: nn.Module) -> list[tuple[str, list[nn.Module]]]:
    """Units in forward order: ``tok_embeddings``, each of ``layers``, ``norm`` + ``output``.

    Models without those names: each direct child that holds parameters.
    """
    if hasattr(model, "layers") and hasattr(model, "tok_embeddings"):
        units: list[tuple[str, list[nn.Module]]] = []
        first = [m for m in (model.tok_embeddings, getattr(model, "pos_embeddings", None)) if m]
        units.append(("embeddings", first))
        units += [(f"layers.{i}", [layer]) for i, layer in enumerate(model.layers)]
        last = [m for m in (model.norm, model.output) if m is not None]
        if last:
            units.append(("head", last))
        return units
    return [(n, [c]) for n, c in model.named_children() if any(True for _ in c.parameters())]


def flat_units(
    model: nn.Module,
    units: list[tuple[str, list[nn.Module]]],
    *,
    stage: int,
    world: int,
    rank: int,
) -> list[FlatUnit]:
    """One ``FlatUnit`` per unit that holds parameters; a parameter shared by two units goes to
    the first (ZeRO-3: bad input, it gathers per unit); every parameter must be in one."""
    out: list[FlatUnit] = []
    owner: dict[int, str] = {}
    for name, modules in units:
        params = []
        for m in modules:
            for p in unique_params(m):
                if id(p) in owner:
                    if stage == 3:
                        raise UsageError(
                            f"parameter shared by units {owner[id(p)]} and {name} (tied "
                            "embeddings?): ZeRO-3 gathers per unit; use an untied model or fsdp"
                        )
                    continue
                owner[id(p)] = name
                params.append(p)
        if params:
            out.append(FlatUnit(name, params, world, rank))
    if len(owner) != len(unique_params(model)):
        raise UsageError("some parameters belong to no unit: give units covering the model")
    return out


def shard_buffers(
    units: list[FlatUnit],
    *,
    stage: int,
    gather_dtype: torch.dtype | None,
    param_dtype: torch.dtype | None,
) -> tuple[list[nn.Parameter], list[torch.Tensor | None]]:
    """Each unit's fp32 shard (what the optimizer steps) and its full buffer, the parameters
    bound as views of that buffer."""
    shards: list[nn.Parameter] = []
    full: list[torch.Tensor | None] = []
    for u in units:
        flat = u.flatten([p.detach() for p in u.params], dtype=torch.float32)
        if stage == 3:
            shards.append(nn.Parameter(flat[u.shard_slice()].clone()))
            # One gather buffer per unit, for good: the parameters are views of it, and so
            # are the tensors autograd saves. Releasing frees its storage (resized to 0)
            # and gathering fills it again, so saved views see the gathered values.
            buf = torch.empty(u.padded, dtype=gather_dtype or torch.float32, device=flat.device)
            u.bind(buf)
            resize_storage(buf, 0)
            full.append(buf)
        elif param_dtype is not None:
            # bf16-master: the optimizer steps an fp32 master copy of the shard; the model
            # computes with the unit's buffer in param_dtype (our chunk refreshed per step)
            buf = flat.to(param_dtype)
            shards.append(nn.Parameter(flat[u.shard_slice()].clone()))
            full.append(buf)
            u.bind(buf)
        else:
            # The shard is a view of the full buffer: the optimizer updates it in place and
            # the all-gather fills the other chunks around it.
            shards.append(nn.Parameter(flat[u.shard_slice()]))
            full.append(flat)
            u.bind(flat)
    return shards, full

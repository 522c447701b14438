"""Serving memory: the KV cache of a batch (``kv_cache_bytes``) and the per-rank ledger of an
inference layout (``predict_inference``: weights, KV cache, the prefill's transients)."""

from __future__ import annotations

from parlab.ledger.items import Ledger, LedgerItem
from parlab.ledger.sharding import check_ep, check_pp, check_tp, holding
from parlab.ledger.stages import check_positive, ffn_width
from parlab.models.spec import ModelSpec
from parlab.topology import Topology


def kv_cache_bytes(
    spec: ModelSpec, *, batch: int, seq_len: int, dtype_bytes: int = 2, tp: int = 1, pp: int = 1
) -> int:
    """KV cache of ``batch`` sequences of ``seq_len`` tokens on one rank.

    MHA/GQA: ``2 x layers/pp x batch x seq x kv_dim/tp x bytes`` (a KV head is never split:
    with fewer KV heads than TP ranks each rank keeps one). MLA: the latent
    ``kv_lora_rank + qk_rope_head_dim`` per token and layer, replicated over TP.
    """
    check_positive(batch=batch, seq_len=seq_len, tp=tp, pp=pp)
    layers = spec.layers // pp
    if spec.mla is not None:
        per_tok = spec.mla.kv_lora_rank + spec.mla.qk_rope_head_dim
    else:
        heads_local = max(1, spec.n_kv_heads // tp)
        per_tok = 2 * heads_local * spec.d_head
    return layers * batch * seq_len * per_tok * dtype_bytes


def predict_inference(
    spec: ModelSpec,
    *,
    topology: Topology | None = None,
    batch: int = 1,
    seq_len: int | None = None,
    dtype_bytes: int = 2,
    kv_dtype_bytes: int | None = None,
    overhead_bytes: int = 0,
) -> Ledger:
    """Per-rank memory of serving ``batch`` sequences of up to ``seq_len`` tokens (TP/PP only).

    Items: ``params`` (held weights in ``dtype_bytes``), ``kv_cache``, ``prefill_transient``
    (one block's intermediates for a whole ``seq_len`` prefill of one sequence, plus its
    last-position logits for the batch), ``allocator_overhead``.
    """
    topo = topology or Topology(world_size=1)
    seq_len = seq_len or spec.max_seq_len
    check_tp(spec, topo.tp)
    check_pp(spec, topo.pp)
    check_ep(spec, topo.ep)
    kvb = kv_dtype_bytes or dtype_bytes
    rows: dict[str, list[int]] = {
        "params": [],
        "kv_cache": [],
        "prefill_transient": [],
        "allocator_overhead": [],
    }
    for stage in range(topo.pp):
        h = holding(spec, tp=topo.tp, pp=topo.pp, ep=topo.ep, stage=stage)
        rows["params"].append(h.numel * dtype_bytes)
        rows["kv_cache"].append(
            kv_cache_bytes(
                spec, batch=batch, seq_len=seq_len, dtype_bytes=kvb, tp=topo.tp, pp=topo.pp
            )
        )
        ffn = ffn_width(spec, list(range(spec.layers)))
        trans = seq_len * (2 * ffn // topo.tp + 4 * spec.hidden) * dtype_bytes
        if stage == topo.pp - 1:
            trans += batch * spec.vocab_size * 4
        rows["prefill_transient"].append(trans)
        rows["allocator_overhead"].append(overhead_bytes)
    items = tuple(
        LedgerItem(
            name=k,
            per_stage=tuple(v),
            kind={"params": "state", "kv_cache": "state", "prefill_transient": "transient"}.get(
                k, "overhead"
            ),
            formula={
                "params": "held weights x dtype bytes",
                "kv_cache": "layers x batch x seq x (K+V per token) x bytes",
                "prefill_transient": "one block's intermediates for a seq_len prefill + logits",
                "allocator_overhead": "explicit, settable allocator/framework overhead",
            }[k],
        )
        for k, v in rows.items()
    )
    peaks = tuple(sum(v[s] for v in rows.values()) for s in range(topo.pp))
    return Ledger(
        model=spec.name,
        strategy="inference",
        topology=topo,
        knobs=dict(batch=batch, seq_len=seq_len, dtype_bytes=dtype_bytes, kv_dtype_bytes=kvb),
        items=items,
        peak_per_stage=peaks,
        peak_phase=("decode",) * topo.pp,
    )

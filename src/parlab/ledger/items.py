"""The ledger's result: ``Ledger`` (per-rank bytes of one layout as named ``LedgerItem``s per
pipeline stage, with the peak and its phase), and each item's kind and formula in words."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from parlab.topology import Topology


@dataclass(frozen=True, kw_only=True)
class LedgerItem:
    """One named entry of the ledger."""

    name: str
    """Stable item name (``params``, ``grads``, ``optimizer``, ``activations``, ...)."""
    per_stage: tuple[int, ...]
    """Bytes on a rank of each pipeline stage (length pp)."""
    kind: str
    """``state``, ``transient`` (forward/backward), ``optimizer-step``, ``buffer`` or ``overhead``."""
    formula: str
    """How it is computed, in words."""
    on_device: bool = True
    """False when offloaded to host memory (not in the device peak)."""

    @property
    def bytes(self) -> int:
        """The largest value over stages (the value of every rank when pp = 1)."""
        return max(self.per_stage)


@dataclass(frozen=True, kw_only=True)
class Ledger:
    """Per-rank memory of one layout."""

    model: str
    """Spec name."""
    strategy: str
    """Data-parallel strategy."""
    topology: Topology
    """The layout's degrees."""
    knobs: dict[str, Any]
    """Every other input (batch, sequence, dtype, optimizer, recompute, schedule, ...)."""
    items: tuple[LedgerItem, ...]
    """Named items in ledger order."""
    peak_per_stage: tuple[int, ...]
    """Predicted peak device bytes on a rank of each stage."""
    peak_phase: tuple[str, ...]
    """Where each stage's peak happens: ``forward-backward``, ``end-of-backward`` (FSDP),
    ``optimizer-step`` or ``ddp-bucket-rebuild``."""
    notes: tuple[str, ...] = field(default_factory=tuple)
    """Assumptions a reader needs."""
    shard_detail: dict[str, tuple[tuple[int, ...], ...]] = field(default_factory=dict)
    """Items that differ by shard index (FSDP's unpadded optimizer states): item -> per stage
    -> bytes per shard index 0..N-1. Filled when N <= 64."""
    shard_count: int = 1
    """N, the shard count of ``strategy`` (shard index of a rank = its dp coordinate mod N)."""

    def item(self, name: str) -> LedgerItem | None:
        for it in self.items:
            if it.name == name:
                return it
        return None

    def value(self, name: str, stage: int = 0) -> int:
        """Bytes of item ``name`` on a rank of ``stage`` (0 when absent)."""
        it = self.item(name)
        return 0 if it is None else it.per_stage[stage]

    @property
    def peak_bytes(self) -> int:
        """The largest per-rank peak over all ranks."""
        return max(self.peak_per_stage)

    def state_bytes(self, stage: int = 0) -> int:
        """Params + grads + optimizer + master on a rank of ``stage`` (device or host)."""
        return sum(self.value(n, stage) for n in ("params", "grads", "optimizer", "master_params"))

    def per_rank(self, name: str | None = None) -> list[int]:
        """Item ``name`` (or the peak, when None) on every rank 0..world-1."""
        topo = self.topology
        vals = (
            self.peak_per_stage if name is None else (self.item(name) or _zero(topo.pp)).per_stage
        )
        detail = self.shard_detail.get(name or "")
        out = []
        for r in range(topo.world_size):
            c = topo.coords(r)
            if detail is not None:
                out.append(detail[c["pp"]][c["dp"] % self.shard_count])
            else:
                out.append(vals[c["pp"]])
        return out

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "strategy": self.strategy,
            "topology": self.topology.to_json(),
            "knobs": dict(self.knobs),
            "items": [
                {
                    "name": it.name,
                    "bytes": it.bytes,
                    "per_stage": list(it.per_stage),
                    "kind": it.kind,
                    "on_device": it.on_device,
                    "formula": it.formula,
                }
                for it in self.items
            ],
            "peak_bytes": self.peak_bytes,
            "peak_per_stage": list(self.peak_per_stage),
            "peak_phase": list(self.peak_phase),
            "notes": list(self.notes),
            "shard_count": self.shard_count,
            "shard_detail": {k: [list(x) for x in v] for k, v in self.shard_detail.items()},
        }


def _zero(pp: int) -> LedgerItem:
    return LedgerItem(name="", per_stage=(0,) * pp, kind="state", formula="")


KIND = {
    "params": "state",
    "grads": "state",
    "optimizer": "state",
    "master_params": "state",
    "ddp_buckets": "buffer",
    "ddp_old_buckets": "buffer",
    "ddp_rebuild": "buffer",
    "activations": "transient",
    "recompute_buffer": "transient",
    "logits": "transient",
    "loss_buffers": "transient",
    "held_logits": "transient",
    "pending_loss_buffers": "transient",
    "backward_transient": "transient",
    "autocast_weight_copies": "transient",
    "gather_buffers": "buffer",
    "reduce_buffers": "buffer",
    "optimizer_temporaries": "optimizer-step",
    "master_grads": "optimizer-step",
    "allocator_overhead": "overhead",
}
"""Item -> its kind (``LedgerItem.kind``)."""

FORMULA = {
    "params": "held parameter elements x param bytes (ZeRO: padded flat units; FSDP: dim-0 shards)",
    "grads": "gradient elements x grad bytes (zero1: full flat; zero2/3, fsdp: shards)",
    "optimizer": "optimizer states per element x state bytes, on what the optimizer steps",
    "master_params": "fp32 master copy of what the optimizer steps (bf16-params)",
    "master_grads": "fp32 copy of the reduced gradient the master is stepped with (bf16-params)",
    "ddp_buckets": "DDP gradient buckets (dp > 1): a copy of every gradient (bucket_view=False)",
    "ddp_old_buckets": "torch DDP over NCCL: first-iteration buckets held by the process group "
    "through the second iteration's forward/backward (P x grad bytes)",
    "ddp_rebuild": "torch DDP's bucket rebuild before its second forward: new buckets beside "
    "the old (P x grad bytes, over the resident states alone)",
    "activations": "micro-batches in flight x sum over stage layers of bytes/token x tokens",
    "recompute_buffer": "full recompute: one layer's activations during its backward "
    "(op-selective: its recomputed, unsaved part)",
    "logits": "float32 logits for the loss (a cast copy under bf16), tokens x vocab x 4",
    "loss_buffers": "cross-entropy: float32 log-probs + their gradient, 2 x tokens x vocab x 4",
    "held_logits": "the model's output logits, kept by the training loop through backward",
    "pending_loss_buffers": "loss computed in each micro-batch's forward: the float32 log-probs "
    "(softmax) of the other micro-batches in flight on the last stage, (m - 1) x tokens x vocab x 4",
    "backward_transient": "one block's activation gradients: tokens x (2 f / tp + 2 h) x compute bytes",
    "autocast_weight_copies": "bf16 copies of fp32 matmul weights kept for backward (autocast)",
    "gather_buffers": "unsharded params in the gather dtype: the unit in use (FSDP: the kept root) + one prefetched block",
    "reduce_buffers": "one unit's unsharded gradients before their reduce-scatter (in backward)",
    "optimizer_temporaries": "foreach AdamW: one state-sized temporary (sqrt of exp_avg_sq)",
    "allocator_overhead": "explicit, settable allocator/framework overhead",
}
"""Item -> how it is computed, in words (``LedgerItem.formula``)."""

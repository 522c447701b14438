"""``fit``: does a model train on one GPU, and if not, which splits make it fit (T0).

``fit(spec, gpu=...)`` predicts the single-GPU ledger, then searches layouts:
world sizes 2, 4, 8, ... up to ``max_gpus`` (or exactly ``gpus``), and for each
every ``tp`` (dividing the world, at most one node, valid for the heads),
``pp`` (dividing the layers), ``cp`` (for sequences of 32K tokens or more),
``ep`` (MoE: 1 and the largest that divides dp and the experts) and
data-parallel strategy (``ddp``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``,
``fsdp-hybrid`` sharded within a node). TP always runs with sequence
parallelism; PP with 1F1B over ``2 x pp`` micro-batches. A layout fits when
its predicted peak plus the overhead item is at most the GPU's memory.

Each candidate carries its ledger and its wire table (``parlab.ledger.traffic``);
candidates are ranked by the bytes compute must wait for (blocking
collectives) per micro-batch, then by all bytes moved, then by peak memory --
a volume ranking; link speeds and overlap are the cost model's business. ``best_per_family``
keeps the best candidate of each family (strategy x which of tp/pp/cp/ep are
used), the short list ``parlab fit`` prints.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.hardware.catalog import GPUSpec
from parlab.ledger.implementation import Implementation
from parlab.ledger.items import Ledger
from parlab.ledger.predict import predict
from parlab.ledger.stages import STRATEGIES
from parlab.ledger.traffic import WireItem, sync_points, traffic
from parlab.models.spec import ModelSpec
from parlab.topology import Topology

FIT_IMPLEMENTATION = Implementation(ddp_old_buckets=True)
"""GPUs train over NCCL: a loop that does not release torch DDP's first-iteration buckets holds
them through the second iteration (no effect on one GPU or on the other strategies)."""


@dataclass(frozen=True, kw_only=True)
class FitLayout:
    """One layout that was evaluated."""

    name: str
    """Short label, e.g. ``tp4 sp + zero1 dp2``."""
    ledger: Ledger
    """Its per-rank memory."""
    fits: bool
    """Predicted peak + overhead within the GPU's memory."""
    wire: tuple[WireItem, ...]
    """What it puts on the wire per step (stage 0's ranks)."""

    @property
    def family(self) -> str:
        t = self.ledger.topology
        axes = "+".join(a for a in ("tp", "pp", "cp", "ep") if getattr(t, a) > 1) or "dp-only"
        return f"{self.ledger.strategy}/{axes}"

    @property
    def blocking_bytes(self) -> int:
        """Bytes per step of collectives compute waits for."""
        return sum(w.total_bytes for w in self.wire if w.blocking)

    @property
    def blocking_per_microbatch(self) -> float:
        """Blocking bytes per micro-batch (layouts with PP run more micro-batches per step)."""
        return self.blocking_bytes / self.ledger.knobs["microbatches"]

    @property
    def wire_bytes(self) -> int:
        """Bytes per step of every collective (nccl-tests sizes)."""
        return sum(w.total_bytes for w in self.wire)

    def sync_points(self) -> list[str]:
        return sync_points(list(self.wire))

    def to_json(self) -> dict:
        t = self.ledger.topology
        return {
            "name": self.name,
            "family": self.family,
            "fits": self.fits,
            "world_size": t.world_size,
            "mesh": {**t.degrees, "ep": t.ep},
            "strategy": self.ledger.strategy,
            "peak_bytes": self.ledger.peak_bytes,
            "state_bytes": self.ledger.state_bytes(),
            "activation_bytes": self.ledger.value("activations"),
            "blocking_bytes_per_step": self.blocking_bytes,
            "wire_bytes_per_step": self.wire_bytes,
            "wire": [w.to_json() for w in self.wire],
            "sync_points": self.sync_points(),
        }


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """The answer of ``fit``."""

    spec: ModelSpec
    """The model."""
    gpu: GPUSpec
    """The GPU (from the hardware catalog)."""
    capacity_bytes: int
    """Memory of one GPU."""
    overhead_bytes: int
    """The explicit overhead item added to every peak."""
    single: Ledger
    """The ledger on one GPU."""
    single_fits: bool
    """Whether one GPU holds it."""
    candidates: tuple[FitLayout, ...]
    """Fitting candidates, best first: at ``gpus`` when given, else at the smallest power-of-two
    world size where any fits (none searched when one GPU holds the model)."""
    considered: int
    """How many layouts were evaluated."""
    world_size: int | None
    """The world size the candidates are for (None: nothing fits up to the limit)."""

    def best_per_family(self, limit: int = 8) -> list[FitLayout]:
        seen: set[str] = set()
        out: list[FitLayout] = []
        for c in self.candidates:
            if c.family not in seen:
                seen.add(c.family)
                out.append(c)
            if len(out) == limit:
                break
        return out


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(
    spec: ModelSpec, world: int, *, seq_len: int, gpus_per_node: int = 8
) -> list[tuple[Topology, str, int | None]]:
    """Every (topology, strategy, shard_size) considered at ``world`` ranks."""
    out: list[tuple[Topology, str, int | None]] = []
    cps = [c for c in (1, 2, 4, 8) if seq_len >= 32768 or c == 1]
    for tp in _divisors(world):
        if tp > gpus_per_node or spec.heads % tp:
            continue
        for pp in _divisors(world // tp):
            if spec.layers % pp:
                continue
            for cp in cps:
                if (world // tp // pp) % cp or seq_len % cp:
                    continue
                dp = world // (tp * pp * cp)
                eps = [1]
                if spec.moe is not None:
                    g = math.gcd(dp, spec.moe.num_experts)
                    if g > 1:
                        eps.append(g)
                for ep in eps:
                    try:
                        topo = Topology(
                            world_size=world, dp=dp, tp=tp, pp=pp, cp=cp, ep=ep,
                            gpus_per_node=gpus_per_node,
                        )  # fmt: skip
                    except UsageError:
                        continue
                    strategies: list[tuple[str, int | None]] = [("ddp", None)]
                    if dp > 1:
                        strategies += [(s, None) for s in ("zero1", "zero2", "fsdp")]
                        if not spec.tied_embeddings:
                            strategies.append(("zero3", None))
                        node_shard = (
                            gpus_per_node // (tp * cp) if gpus_per_node % (tp * cp) == 0 else 0
                        )
                        if 1 < node_shard < dp and dp % node_shard == 0:
                            strategies.append(("fsdp-hybrid", node_shard))
                    for s, shard in strategies:
                        assert s in STRATEGIES
                        out.append((topo, s, shard))
    return out


def _name(topo: Topology, strategy: str, shard: int | None) -> str:
    parts = []
    if topo.tp > 1:
        parts.append(f"tp{topo.tp} sp")
    if topo.pp > 1:
        parts.append(f"pp{topo.pp} 1f1b")
    if topo.cp > 1:
        parts.append(f"cp{topo.cp}")
    if topo.ep > 1:
        parts.append(f"ep{topo.ep}")
    dp = f"{strategy} dp{topo.dp}" + (f" (shard {shard})" if shard else "")
    return " + ".join([*parts, dp]) if topo.dp > 1 or not parts else " + ".join(parts)


def fit(
    spec: ModelSpec,
    *,
    gpu: GPUSpec,
    gpus: int | None = None,
    max_gpus: int = 1024,
    micro_batch: int = 1,
    seq_len: int | None = None,
    dtype: str = "bf16-mixed",
    optimizer: str = "adamw",
    recompute: str = "none",
    overhead_bytes: int = 0,
    gpus_per_node: int = 8,
    capacity_bytes: int | None = None,
) -> FitResult:
    """Single-GPU ledger, and the layouts that fit (see the module docstring)."""
    seq_len = seq_len or min(spec.max_seq_len, 4096)
    if gpus is not None and (isinstance(gpus, bool) or gpus < 1):
        raise UsageError(f"gpus = {gpus}: give at least 1")
    if max_gpus < 1:
        raise UsageError(f"max_gpus = {max_gpus}: give at least 1")
    cap = capacity_bytes if capacity_bytes is not None else gpu.memory_bytes
    kw = dict(
        micro_batch=micro_batch, seq_len=seq_len, dtype=dtype, optimizer=optimizer,
        recompute=recompute, overhead_bytes=overhead_bytes, impl=FIT_IMPLEMENTATION,
    )  # fmt: skip
    single = predict(spec, **kw)  # type: ignore[arg-type]
    single_fits = single.peak_bytes <= cap
    worlds = [gpus] if gpus is not None else []
    if gpus is None and not single_fits:
        w = 2
        while w <= max_gpus:
            worlds.append(w)
            w *= 2
    considered = 0
    chosen: list[FitLayout] = []
    chosen_world: int | None = None
    for world in worlds:
        found: list[FitLayout] = []
        for topo, strategy, shard in layouts(
            spec, world, seq_len=seq_len, gpus_per_node=gpus_per_node
        ):
            considered += 1
            try:
                led = predict(
                    spec, strategy=strategy, topology=topo, shard_size=shard, sp=topo.tp > 1,
                    microbatches=2 * topo.pp if topo.pp > 1 else 1, **kw,  # type: ignore[arg-type]
                )  # fmt: skip
            except UsageError:
                continue
            if led.peak_bytes > cap:
                continue
            wire = traffic(
                spec, topo, strategy, micro_batch=micro_batch, seq_len=seq_len, dtype=dtype,
                microbatches=led.knobs["microbatches"], sp=topo.tp > 1, shard_size=shard,
            )  # fmt: skip
            found.append(
                FitLayout(
                    name=_name(topo, strategy, shard), ledger=led, fits=True, wire=tuple(wire)
                )
            )
        if found:
            found.sort(key=lambda c: (c.blocking_per_microbatch, c.wire_bytes, c.ledger.peak_bytes))
            chosen, chosen_world = found, world
            break
    return FitResult(
        spec=spec,
        gpu=gpu,
        capacity_bytes=cap,
        overhead_bytes=overhead_bytes,
        single=single,
        single_fits=single_fits,
        candidates=tuple(chosen),
        considered=considered,
        world_size=chosen_world,
    )


def fit_all(
    spec: ModelSpec,
    *,
    gpu: GPUSpec,
    max_gpus: int = 1024,
    micro_batch: int = 1,
    seq_len: int | None = None,
    dtype: str = "bf16-mixed",
    gpus_per_node: int = 8,
    overhead_bytes: int = 0,
) -> list[tuple[str, int, bool]]:
    """Every candidate layout at every world size 2..``max_gpus`` (powers of two):
    ``(name, peak_bytes, fits)`` -- the full search the speed benchmark times."""
    seq_len = seq_len or min(spec.max_seq_len, 4096)
    cap = gpu.memory_bytes
    out = []
    w = 1
    while w <= max_gpus:
        for topo, strategy, shard in layouts(spec, w, seq_len=seq_len, gpus_per_node=gpus_per_node):
            try:
                led = predict(
                    spec, strategy=strategy, topology=topo, shard_size=shard, sp=topo.tp > 1,
                    microbatches=2 * topo.pp if topo.pp > 1 else 1, micro_batch=micro_batch,
                    seq_len=seq_len, dtype=dtype, overhead_bytes=overhead_bytes,
                    impl=FIT_IMPLEMENTATION,
                )  # fmt: skip
            except UsageError:
                continue
            traffic(
                spec, topo, strategy, micro_batch=micro_batch, seq_len=seq_len, dtype=dtype,
                microbatches=led.knobs["microbatches"], sp=topo.tp > 1, shard_size=shard,
            )  # fmt: skip
            out.append((_name(topo, strategy, shard), led.peak_bytes, led.peak_bytes <= cap))
        w *= 2
    return out

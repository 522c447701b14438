"""The cluster and the candidate space of ``parlab plan`` (no process group, no torch).

A ``Cluster`` is GPUs of one catalog model, ``count`` of them, ``gpus_per_node``
to a node, with two link classes: inside a node (a collectives calibration's
fitted alpha-beta per op where one is given, else the catalog's per-direction
link bandwidth with an assumed 2 us latency per algorithm step) and between nodes (``inter_node_bw`` per
GPU, an assumption unless the user measured it). Every link says where its
numbers come from.

The candidate space (``candidates``) is every combination of

- degrees ``pp x dp x cp x tp = world`` (powers of the world's factors), ``ep``
  dividing ``dp`` and the expert count for MoE models (1 otherwise);
- data-parallel strategy: ``ddp``, ``zero1``, ``zero2``, ``zero3``, ``fsdp``;
- micro-batch size (sequences per rank per micro-batch; default 1, 2, 4, 8);
  the micro-batch count is ``global_batch / (dp x micro_batch)``: gradient
  accumulation steps, or the pipeline's micro-batches;
- activation recompute: ``none``, ``selective``, ``full``;
- pipeline schedule when pp > 1: ``1f1b``, ``gpipe``, ``interleaved`` (with the
  smallest virtual-stage count v > 1 that divides the layers); on request (not in
  ``DEFAULT_SCHEDULES``) ``zbv``, torch's zero-bubble V: v = 2, 2p stages, rank k
  holding stages k and 2p - 1 - k (the layout's constraint table asks 2p to divide the
  layers).

Sequence parallelism is on whenever tp > 1 (Megatron's pairing; it only saves
memory and moves the same bytes as all-gather + reduce-scatter). Whether a
candidate's degrees are legal is the layout's constraint table
(``parlab.layout.constraints``): the planner asks it rather than re-checking.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from parlab.comm.model import Link
from parlab.errors import UsageError
from parlab.hardware.catalog import GPUSpec, require
from parlab.ledger.sharding import chunk_sizes
from parlab.plan.compute import efficiency_table

STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved", "zbv")
DEFAULT_SCHEDULES = ("1f1b", "interleaved")
"""The schedules searched unless asked: GPipe has 1F1B's bubble and holds every micro-batch's
activations, so it never wins; ``zbv``'s one measured run (torch's, pp 2) is slower than its
1F1B, which the bubble model does not describe (``parlab.plan.estimate``)."""
DEFAULT_MICRO_BATCHES = (1, 2, 4, 8)
DEFAULT_INTER_NODE_BW = 50e9
"""Bytes/s per GPU between nodes when neither given nor in the catalog: one 400 Gb/s NIC per
GPU (assumed)."""
ASSUMED_ALPHA_INTRA = 2e-6
"""Latency per algorithm step inside a node without a calibration, seconds (assumed)."""
ASSUMED_ALPHA_INTER = 5e-6
"""Latency per algorithm step between nodes, seconds (assumed)."""


@dataclass(frozen=True, kw_only=True)
class Cluster:
    """The GPUs a plan is for."""

    gpu: GPUSpec
    """Catalog entry of the GPU model."""
    count: int
    """GPUs in all."""
    gpus_per_node: int
    """GPUs per node (TP stays within one)."""
    intra: Link
    """Link between GPUs of a node (catalog bandwidth, or a calibration per op)."""
    inter: Link
    """Link between nodes, per GPU."""
    calibration: Any = None
    """A ``parlab.comm.calibration.Calibration`` for intra-node ops, or None."""
    source: str = ""
    """Where the cluster description comes from."""

    def __post_init__(self) -> None:
        if self.count < 1 or self.gpus_per_node < 1:
            raise UsageError(f"{self.count} GPUs, {self.gpus_per_node} per node: give at least 1")
        if self.count > self.gpus_per_node and self.count % self.gpus_per_node:
            raise UsageError(
                f"{self.count} GPUs do not fill whole nodes of {self.gpus_per_node}: "
                "give a multiple of --gpus-per-node"
            )

    @property
    def nodes(self) -> int:
        return max(1, self.count // self.gpus_per_node)

    def intra_link(self, op: str) -> Link:
        """The intra-node link for ``op`` (``all_reduce``, ...): calibrated where fitted."""
        cal = self.calibration
        if cal is not None:
            fit = cal.ops.get(op)
            if fit is not None and fit.beta_s_per_byte:
                return Link(
                    alpha_s=fit.alpha_s, beta_s_per_byte=fit.beta_s_per_byte, source=cal.label
                )
        return self.intra

    def describe_links(self) -> str:
        """The two link classes and where their numbers come from, one line."""
        cal = f" (calibration {self.calibration.label} where fitted)" if self.calibration else ""
        return (
            f"{self.gpus_per_node} GPUs per NVLink domain (node); inside it {self.intra.source}"
            f"{cal}; between nodes {self.inter.source}, each GPU on its own rail; all-reduce "
            "across nodes as the faster of ring and tree"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "gpu": self.gpu.name,
            "count": self.count,
            "gpus_per_node": self.gpus_per_node,
            "nodes": self.nodes,
            "memory_bytes": self.gpu.memory_bytes,
            "intra_node_bw": self.intra.bandwidth,
            "intra_node_source": self.intra.source,
            "inter_node_bw": self.inter.bandwidth,
            "inter_node_source": self.inter.source,
            "calibration": None if self.calibration is None else self.calibration.run_id,
            "source": self.source,
        }


_GPUS_RE = re.compile(r"^\s*(\d+)\s*[xX*]\s*(.+?)\s*$")


def parse_gpus(text: str) -> tuple[int, GPUSpec]:
    """``64xH100`` -> (64, the H100 catalog entry); ``UsageError`` for anything else."""
    m = _GPUS_RE.match(text or "")
    if not m:
        raise UsageError(f"--gpus {text!r}: write COUNTxGPU, e.g. 64xH100")
    count = int(m.group(1))
    if count < 1:
        raise UsageError(f"--gpus {text!r}: give at least one GPU")
    return count, require(m.group(2))


def intra_link(spec: GPUSpec) -> Link:
    """The link inside a node: the catalog's per-direction bandwidth at the fraction an
    all-reduce reached where the lab measured one (``parlab.plan.compute``'s ``link``)."""
    fig = efficiency_table().get(spec.name)
    frac = fig.link if fig is not None and fig.link else 1.0
    how = (
        f"{frac:.2f} of it as the lab's NCCL all-reduce reached ({fig.rests_on.split(':')[0]})"
        if frac < 1.0 and fig is not None
        else "the catalog's figure (not measured)"
    )
    return Link.from_bandwidth(
        spec.link_bw * frac,
        ASSUMED_ALPHA_INTRA,
        f"catalog {spec.name} {spec.link} {spec.link_bw / 1e9:.0f} GB/s per direction, {how}, "
        f"assumed alpha {ASSUMED_ALPHA_INTRA * 1e6:g} us/step",
    )


def make_cluster(
    *,
    gpus: str | None = None,
    gpus_per_node: int | None = None,
    env_doc: Any = None,
    calibration: Any = None,
    inter_node_bw: float | None = None,
) -> Cluster:
    """A cluster from ``--gpus``, or from an environment snapshot document (``parlab env``)."""
    source = ""
    if gpus is not None:
        count, spec = parse_gpus(gpus)
        source = f"--gpus {gpus}"
        per_node = gpus_per_node or min(count, 8)
    elif env_doc is not None:
        hw = (env_doc.environment or {}).get("hardware") or {}
        listed = hw.get("gpus") or []
        if not listed:
            raise UsageError(f"{env_doc.run_id} lists no GPU: plan for --gpus COUNTxGPU instead")
        spec = require(str(listed[0]["name"]))
        hosts = int(hw.get("host_count") or 1)
        count = len(listed) * hosts
        per_node = gpus_per_node or len(listed)
        source = f"environment of {env_doc.run_id}"
    else:
        raise UsageError("give the cluster: --gpus COUNTxGPU (e.g. 64xH100) or --env ENV.json")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise UsageError(f"--gpus-per-node {gpus_per_node}: give at least 1")
    intra = intra_link(spec)
    if inter_node_bw:
        bw, how = inter_node_bw, f"--inter-node-bw {inter_node_bw / 1e9:g} GB/s per GPU"
    elif spec.nic_bw:
        bw, how = spec.nic_bw, f"catalog {spec.nic_bw / 1e9:g} GB/s per GPU ({spec.system})"
    else:
        bw = DEFAULT_INTER_NODE_BW
        how = f"assumed {bw / 1e9:g} GB/s per GPU (one 400 Gb/s NIC per GPU)"
    inter = Link.from_bandwidth(
        bw, ASSUMED_ALPHA_INTER, how + f", assumed alpha {ASSUMED_ALPHA_INTER * 1e6:g} us/step"
    )
    return Cluster(
        gpu=spec,
        count=count,
        gpus_per_node=per_node,
        intra=intra,
        inter=inter,
        calibration=calibration,
        source=source,
    )


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One point of the candidate space."""

    dp: int
    """Data-parallel degree."""
    tp: int
    """Tensor-parallel degree (with sequence parallelism when > 1)."""
    pp: int
    """Pipeline stages."""
    cp: int
    """Context-parallel degree."""
    ep: int
    """Expert-parallel degree (splits dp)."""
    strategy: str
    """``ddp``, ``zero1``, ``zero2``, ``zero3`` or ``fsdp``."""
    micro_batch: int
    """Sequences per rank per micro-batch."""
    microbatches: int
    """Micro-batches per step (gradient accumulation, or the pipeline's)."""
    recompute: str
    """``none``, ``selective`` or ``full``."""
    schedule: str
    """``1f1b``, ``gpipe``, ``interleaved``, ``zbv``; ``-`` when pp = 1."""
    vpp: int = 1
    """Virtual stages per rank (interleaved; 2 for ``zbv``)."""

    @property
    def sp(self) -> bool:
        return self.tp > 1

    @property
    def degrees(self) -> dict[str, int]:
        return {"pp": self.pp, "dp": self.dp, "cp": self.cp, "tp": self.tp, "ep": self.ep}

    @property
    def name(self) -> str:
        mesh = " ".join(f"{k}{v}" for k, v in self.degrees.items() if v > 1) or "1 GPU"
        sched = f" {self.schedule}" + (f"x{self.vpp}" if self.vpp > 1 else "")
        return (
            f"{self.strategy} {mesh} mb{self.micro_batch}x{self.microbatches} "
            f"rc:{self.recompute}" + (sched if self.pp > 1 else "")
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "mesh": self.degrees,
            "strategy": self.strategy,
            "micro_batch": self.micro_batch,
            "microbatches": self.microbatches,
            "recompute": self.recompute,
            "schedule": self.schedule,
            "vpp": self.vpp,
            "sequence_parallel": self.sp,
        }


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def degree_tuples(world: int, *, moe_experts: int | None) -> Iterator[dict[str, int]]:
    """Every (pp, dp, cp, tp, ep) whose product pp*dp*cp*tp is ``world`` (ep | dp)."""
    divs = _divisors(world)
    for tp in divs:
        for cp in _divisors(world // tp):
            for pp in _divisors(world // (tp * cp)):
                dp = world // (tp * cp * pp)
                eps = [e for e in _divisors(dp) if moe_experts % e == 0] if moe_experts else [1]
                for ep in eps:
                    yield {"pp": pp, "dp": dp, "cp": cp, "tp": tp, "ep": ep}


def virtual_stage_counts(most: int) -> list[int]:
    """The v > 1 the search tries, up to ``most`` (one layer per chunk): every v to 8, then
    each about 1.5 times the last (the bubble falls as 1 / v: past 8 the steps matter less)."""
    out = [v for v in range(2, min(most, 8) + 1)]
    v = 8
    while (v := max(v + 1, round(v * 1.5))) <= most:
        out.append(v)
    if most > 8 and out[-1] != most:
        out.append(most)
    return out


def schedules_for(pp: int, layers: int) -> list[tuple[str, int]]:
    """(schedule, vpp) options for ``pp`` stages of ``layers`` layers: 1F1B, GPipe, interleaved
    from 2 virtual stages up to one layer per chunk (``virtual_stage_counts``; uneven chunks
    allowed, ``parlab.ledger.sharding.chunk_sizes``), and the zero-bubble V."""
    if pp == 1:
        return [("-", 1)]
    out = [("1f1b", 1), ("gpipe", 1)]
    for v in virtual_stage_counts(layers // pp):
        try:
            chunk_sizes(layers, pp * v)
        except UsageError:
            continue
        out.append(("interleaved", v))
    out.append(("zbv", 2))  # the layout's constraint table rejects it where 2p > L
    return out

"""One model-internal run's configuration, and the comparison set of (baseline, candidate) pairs."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.parallel.pipeline_schedules import SCHEDULES

PROJECT = "PAR-MODEL-INTERNAL"


@dataclass(frozen=True, kw_only=True)
class RunConfig:
    """One run of the comparison set."""

    name: str
    """Label (``tp2-sp``, ``pp2-1f1b``, ``single-pp``, ...)."""
    model: str
    """Preset or catalog name (``parlab.models``)."""
    nproc: int
    """Ranks (GPUs)."""
    tp: int = 1
    """Tensor-parallel degree."""
    pp: int = 1
    """Pipeline-parallel degree."""
    cp: int = 1
    """Context-parallel degree."""
    sp: bool = False
    """Sequence parallel (with TP)."""
    cp_variant: str = "ring"
    """``ring`` or ``allgather``."""
    impl: str = "parlab"
    """``parlab`` (parlab's mechanisms) or ``torch`` (plain DTensor ``parallelize_module`` for
    TP, ``torch.distributed.pipelining`` for PP): the references the issue compares with."""
    schedule: str = "1f1b"
    """Pipeline schedule (``gpipe``, ``1f1b``, ``interleaved-1f1b``; with ``impl="torch"`` also
    ``zbv``: torch's ScheduleZBVZeroBubble, two stages per rank in a V); at pp 1 it is plain
    gradient accumulation."""
    vpp: int = 1
    """Virtual stages per pipeline rank (``interleaved-1f1b``)."""
    micro_batch: int = 1
    """Sequences per micro-batch."""
    microbatches: int = 1
    """Micro-batches per step (the global batch is ``micro_batch * microbatches``)."""
    seq: int = 64
    """Tokens per sequence."""
    steps: int = 3
    """Timed steps."""
    warmup: int = 1
    """Untimed steps before the metered step."""
    dtype: str = "fp32"
    """``bf16`` (parameters and compute) or ``fp32``."""
    role: str = "candidate"
    """``baseline`` (one rank) or ``candidate``."""
    timeout_s: float = 600.0
    """Process-group timeout."""
    compile: bool = False
    """``torch.compile`` each transformer block (parlab's pipeline stages and their one-rank
    baseline): the blocks are compiled before the stages are wrapped, as torchtitan does."""

    def __post_init__(self) -> None:
        if self.tp * self.pp * self.cp != self.nproc:
            raise UsageError(f"{self.name}: tp*pp*cp = {self.tp * self.pp * self.cp} != nproc")
        if self.dtype not in ("bf16", "fp32"):
            raise UsageError(f"dtype {self.dtype!r}: use bf16 or fp32")
        if self.compile and (self.tp > 1 or self.cp > 1 or self.impl != "parlab"):
            raise UsageError(
                f"{self.name}: compile applies to parlab's pipeline stages and one-rank runs; "
                "TP, CP and torch's implementations run eager"
            )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @property
    def global_batch(self) -> int:
        return self.micro_batch * self.microbatches


def comparison_set(
    preset: str, *, seq: int | None = None, steps: int | None = None
) -> list[tuple[RunConfig, RunConfig]]:
    """(baseline on one rank, candidate on two) pairs: TP2+SP, TP2, PP2 GPipe and 1F1B, CP2 ring at
    the base sequence and at twice it (GPU: 32k and 64k)."""
    if preset == "gpu":
        base = {"model": "1.3b", "dtype": "bf16", "steps": steps or 3, "warmup": 2}
        tp_kw = {"micro_batch": 2, "seq": seq or 4096}
        pp_kw = {"micro_batch": 1, "microbatches": 8, "seq": seq or 4096}
        cp_kw = {"micro_batch": 1, "seq": 32768 if seq is None else seq * 8}
        long_kw = {"micro_batch": 1, "seq": 2 * cp_kw["seq"], "steps": 2, "warmup": 1}
    elif preset == "cpu":
        base = {"model": "tiny", "dtype": "fp32", "steps": steps or 2, "warmup": 1}
        tp_kw = {"micro_batch": 2, "seq": seq or 64}
        pp_kw = {"micro_batch": 1, "microbatches": 4, "seq": seq or 64}
        cp_kw = {"micro_batch": 1, "seq": 2 * (seq or 64)}
        long_kw = {"micro_batch": 1, "seq": 2 * cp_kw["seq"], "steps": 1, "warmup": 1}
    else:
        raise UsageError(f"preset {preset!r}: use cpu or gpu")

    def pair(name: str, kw: dict[str, Any], **cand: Any) -> tuple[RunConfig, RunConfig]:
        both = {**base, **kw}
        single = RunConfig(
            name=f"single-{name}",
            nproc=1,
            role="baseline",
            compile=cand.get("compile", False),
            **both,
        )
        sched = cand.pop("schedule", "1f1b")
        # one rank accumulates the same micro-batches (torch's own schedules: as 1F1B would)
        one = sched if sched in SCHEDULES else "1f1b"
        return dataclasses.replace(single, schedule=one), RunConfig(
            name=name, nproc=2, role="candidate", schedule=sched, **both, **cand
        )

    # in priority order: a set cut short by its time budget keeps the first ones
    return [
        pair("tp2-sp", tp_kw, tp=2, sp=True),
        pair("pp2-gpipe", pp_kw, pp=2, schedule="gpipe"),
        pair("pp2-1f1b", pp_kw, pp=2, schedule="1f1b"),
        pair("cp2-ring", cp_kw, cp=2),
        pair("tp2", tp_kw, tp=2),
        # torch's own implementations, the references issue 6 quotes
        pair("tp2-dtensor", tp_kw, tp=2, impl="torch"),
        pair("pp2-1f1b-torch", pp_kw, pp=2, schedule="1f1b", impl="torch"),
        pair("pp2-interleaved", pp_kw, pp=2, schedule="interleaved-1f1b", vpp=2),
        # torch's zero-bubble V schedule: what the bubble costs parlab's 1F1B family
        pair("pp2-zbv-torch", pp_kw, pp=2, schedule="zbv", vpp=2, impl="torch"),
        # compiled blocks: the per-micro-batch compute the bubble multiplies
        pair("pp2-1f1b-compiled", pp_kw, pp=2, schedule="1f1b", compile=True),
        pair(
            "pp2-interleaved-compiled",
            pp_kw,
            pp=2,
            schedule="interleaved-1f1b",
            vpp=2,
            compile=True,
        ),
        # twice the sequence: one rank may run out of memory (a failure document), CP2 not;
        # its one-rank run goes last of all
        pair("cp2-ring-long", long_kw, cp=2),
    ]


NAMES = tuple(cand.name for _, cand in comparison_set("cpu"))
"""The runs of the set, in its order (the same in both presets)."""
BASELINE_LAST = ("cp2-ring-long",)
"""Runs whose one-rank baseline runs after them (it may run out of memory)."""

"""One training-state run's configuration, checked before anything launches."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import torch

from parlab.dtypes import check_recipe
from parlab.errors import UsageError
from parlab.models import get_spec
from parlab.parallel.compose import RECOMPUTE
from parlab.parallel.deepspeed import deepspeed_version
from parlab.runtime.launch import check_numa_binding

PROJECT = "PAR-TRAINING-STATE"

STRATEGIES = (
    "ddp",
    "ddp-bucket",
    "ddp-naive",
    "zero1",
    "zero1-naive",
    "zero2",
    "zero2-naive",
    "zero3",
    "zero3-naive",
    "fsdp",
    "fsdp-hybrid",
    "deepspeed-zero1",
    "deepspeed-zero2",
    "deepspeed-zero3",
)
"""``ddp``/``fsdp``/``fsdp-hybrid``: torch's paths; ``deepspeed-zero*``: DeepSpeed's (optional);
the others: parlab's mechanisms."""

DTYPES = {"fp32": torch.float32, "bf16-compute": torch.bfloat16, "bf16-params": torch.bfloat16}
"""``--dtype`` (``parlab.dtypes``) -> compute dtype. ``bf16-compute``: bf16 compute over fp32
parameters (autocast; FSDP: FSDP2's param_dtype). ``bf16-params``: bf16 parameters and
gradients with an fp32 master shard the optimizer steps (parlab's ZeRO-1/2; DeepSpeed's bf16
recipe, the only bf16 DeepSpeed runs)."""
MASTER_STRATEGIES = ("zero1", "zero2", "deepspeed-zero1", "deepspeed-zero2", "deepspeed-zero3")
OPTIMIZERS = ("adamw", "sgd")
STATE_ITEMS = ("params", "grads", "optimizer")
MASTER_ITEMS = ("master_params", "master_grads")
"""The state items a ``bf16-params`` run adds (the ledger's items of the same names)."""


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run."""

    strategy: str
    """One of ``STRATEGIES``."""
    model: str
    """Model preset or catalog name (``tiny``, ``small``, ``1.3b``, ``8b``, ...)."""
    nproc: int = 2
    """Ranks (GPUs, or gloo CPU processes); all of them form the data-parallel group."""
    steps: int = 5
    """Timed steps."""
    warmup: int = 2
    """Untimed steps first (one more untimed step, metered, follows the timed ones)."""
    micro_batch: int = 2
    """Sequences per rank per step."""
    global_batch: int | None = None
    """Sequences per step over all ranks (default micro_batch x nproc); nproc must divide it."""
    seq: int = 128
    """Tokens per sequence."""
    dtype: str = "fp32"
    """``fp32``, ``bf16-compute`` (bf16 compute; parameters, gradients, optimizer state stay
    fp32) or ``bf16-params`` (ZeRO-1/2: bf16 parameters and gradients, fp32 master shards)."""
    recompute: str = "none"
    """Activation checkpointing per block: ``none``, ``selective`` or ``full``."""
    compile: bool = False
    """``torch.compile`` each block."""
    optimizer: str = "adamw"
    """``adamw`` (fused on CUDA) or ``sgd``."""
    lr: float = 1e-3
    """Learning rate."""
    seed: int = 0
    """Seed of the weights and the data."""
    reshard_after_forward: bool = True
    """FSDP: free gathered parameters after forward (gather again for backward)."""
    hybrid_shard: int | None = None
    """``fsdp-hybrid``: ranks per shard group (default: nproc // 2, at least 1)."""
    bucket_mb: float = 25.0
    """DDP bucket size, MiB."""
    memory_cap: int | None = None
    """Per-rank memory limit in bytes: going past it is an out-of-memory failure."""
    data: str | None = None
    """A local text file to train on (byte tokens) instead of synthetic tokens."""
    timeout_s: float = 300.0
    """Process-group timeout, seconds."""
    numa_binding: str | None = None
    """torchrun ``--numa-binding`` (node, socket, exclusive, core-complex): each rank on the
    CPUs near its GPU; None: the operating system places the ranks."""
    manual_gc: int = 50
    """N (default 50, torchtitan's ``gc_freq`` default): Python's automatic garbage collection
    off while training, a young-generation collection (``gc.collect(1)``) every N steps
    instead -- Megatron's ``--manual-gc``; 0: automatic collection, which pauses the host
    mid-step: in every 10-step GPT-2 1.5B FSDP run with it (16 runs, one and two H200s), the
    ninth timed step took 1.4-1.9 x the run's median, and in neither run with ``--manual-gc
    50`` (``results/PAR-TRAINING-STATE/train-fsdp-gpt2-1.5b-20261201T0025*``)."""

    def __post_init__(self) -> None:
        if self.strategy not in STRATEGIES:
            raise UsageError(
                f"unknown strategy {self.strategy!r}: use one of {', '.join(STRATEGIES)}"
            )
        if self.strategy.startswith("deepspeed"):
            deepspeed_version()  # one line when DeepSpeed is not installed: before any launch
        spec = get_spec(self.model)  # UsageError naming the known presets
        for name in ("nproc", "steps", "warmup", "micro_batch", "seq"):
            if getattr(self, name) < 1:
                raise UsageError(
                    f"--{name.replace('_', '-')} {getattr(self, name)} must be at least 1"
                )
        self._check_batch()
        self._check_knobs()
        if spec.moe is not None:
            raise UsageError(f"model {self.model!r} is MoE: training-state runs take dense models")
        if self.strategy.removeprefix("deepspeed-").startswith("zero3") and spec.tied_embeddings:
            raise UsageError(
                f"model {self.model!r} ties its embeddings: zero3 gathers per unit and cannot "
                "share a weight between the first and last unit; use fsdp"
            )
        if spec.position == "learned" and self.seq > spec.max_seq_len:
            raise UsageError(f"--seq {self.seq} exceeds the model's {spec.max_seq_len} positions")
        if self.data is None and spec.vocab_size < 2:
            raise UsageError("the model's vocabulary is too small for synthetic tokens")
        if self.data is not None and spec.vocab_size < 256:
            raise UsageError("a text file needs a vocabulary of at least 256 (byte tokens)")

    def _check_batch(self) -> None:
        if self.global_batch is not None and self.global_batch % self.dp:
            raise UsageError(
                f"global batch {self.global_batch} is not divisible by the data-parallel degree "
                f"{self.dp}: use a multiple of {self.dp}"
            )
        if self.global_batch is not None and self.global_batch < self.dp:
            raise UsageError(
                f"global batch {self.global_batch} gives a rank nothing: use >= {self.dp}"
            )

    def _check_knobs(self) -> None:
        check_recipe(self.dtype, DTYPES)
        if self.dtype == "bf16-params" and self.strategy not in MASTER_STRATEGIES:
            raise UsageError(
                f"--dtype bf16-params (bf16 parameters, fp32 master shards) runs under zero1, "
                f"zero2 and deepspeed-zero*, not {self.strategy}: use --dtype bf16-compute"
            )
        if self.dtype == "bf16-compute" and self.strategy.startswith("deepspeed"):
            raise UsageError(
                "DeepSpeed's bf16 keeps bf16 parameters with an fp32 master: --dtype bf16-params"
            )
        if self.recompute not in RECOMPUTE:
            raise UsageError(f"--recompute {self.recompute!r} is not one of {', '.join(RECOMPUTE)}")
        if self.optimizer not in OPTIMIZERS:
            raise UsageError(
                f"--optimizer {self.optimizer!r} is not one of {', '.join(OPTIMIZERS)}"
            )
        if self.manual_gc < 0:
            raise UsageError(f"--manual-gc {self.manual_gc} must be 0 (off) or a step interval")
        check_numa_binding(self.numa_binding)
        if self.strategy == "fsdp-hybrid" and self.nproc % self.shard_size:
            raise UsageError(
                f"--hybrid-shard {self.shard_size} does not divide --nproc {self.nproc}: "
                "pick a divisor"
            )
        if self.compile and self.strategy not in ("ddp", "fsdp", "fsdp-hybrid"):
            raise UsageError(
                f"--compile with {self.strategy}: parlab's own mechanisms run eager (their hooks "
                "issue collectives); use --compile with ddp, fsdp or fsdp-hybrid"
            )
        if self.memory_cap is not None and self.memory_cap < 1:
            raise UsageError("--memory-cap must be a positive size")

    @property
    def dp(self) -> int:
        return self.nproc

    @property
    def shard_size(self) -> int:
        return self.hybrid_shard or max(1, self.nproc // 2)

    @property
    def batch(self) -> int:
        """The global batch, in sequences."""
        return self.global_batch or self.micro_batch * self.dp

    @property
    def per_rank_batch(self) -> int:
        return self.batch // self.dp

    @property
    def role(self) -> str:
        return "baseline" if self.strategy == "ddp" else "candidate"

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def ledger_strategy(strategy: str) -> str:
    """The ledger's name for a strategy (parlab's DDP forms are all ``ddp``; naive forms share
    their stage's memory; DeepSpeed's ZeRO stages are the ledger's ``zero1|2|3``)."""
    base = strategy.removesuffix("-naive").removeprefix("deepspeed-")
    return "ddp" if base in ("ddp", "ddp-bucket") else base

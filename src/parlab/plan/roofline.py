"""The planner's compute time per rank, as a roofline of four kinds of work.

One training step of one rank (its pipeline stage, its tensor/context shard, all its
micro-batches) is split into work that runs at different speeds:

- **GEMMs**: ``6 N`` FLOPs per token (PaLM's count, ``parlab.models.flops``) over the stage's
  parameters and its ``1/tp`` share, at ``gemm`` x the catalog's dense bf16 peak. Full
  recompute adds one forward (``2 N``).
- **Attention core**: with a flash kernel (``attention_kernel="flash"``) only the causal half of
  the score matrix is computed: ``6 L H Q T`` FLOPs per token, half of the ``12 L H Q T`` that
  PaLM counts, at ``attention`` x peak (``ring_attention`` x peak when cp > 1: parlab's ring runs
  flash blocks and merges them). With the materialised kernel (``"math"``: scores through a
  batched GEMM and a fused softmax, as Megatron did in 2022) the whole square is computed at the
  GEMM efficiency and the softmax reads and writes every score (``MATH_SOFTMAX_BYTES``).
  Recompute adds the forward share (one third) again: selective (Megatron's: the attention
  core) and full alike.
- **Elementwise work** (memory-bound): norms, rotary embedding, activation, residual adds,
  the attention layout copy, the cross-entropy over the vocabulary, the mixed-precision casts
  and the optimizer step, as bytes moved / (``memory`` x the catalog's HBM bandwidth). Bytes per
  element per op (``ELEMENTWISE``) count the memory passes of each implementation: ``fused``,
  ``explicit`` (float32 RMSNorm and RoPE op by op) and ``compiled`` (one read and one write per
  group). Under tensor parallelism norms and residual adds run on every token of every rank
  unless sequence parallelism splits them; ``Implementation.sp_gather = "per-linear"`` adds the
  per-linear copies of the gathered sequence (``sp_copy_bytes_per_token``).

Recompute modes: ``none``; ``selective`` (Megatron's: the attention core's forward again);
``full`` (the whole forward again); ``op-selective`` (the runtime's op-level policy: matmul and
attention outputs saved, every other op of the block runs its forward again in backward,
``op_selective_bytes_per_token``).

Byte and FLOP counts are ``parlab.plan.elementwise``'s. The efficiencies (``Roofline``) are the
built-in ones (``parlab.plan.compute``) or fitted on measured runs
(``parlab.plan.fit.efficiencies``); the caller says which.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.ledger.implementation import Implementation
from parlab.ledger.policy import DtypePolicy, dtype_policy
from parlab.models.spec import ModelSpec
from parlab.plan.elementwise import (
    CAST_BYTES_PER_PARAM,
    DDP_ACCUMULATE_BYTES,
    DDP_STEP_BYTES,
    FSDP_REGATHER_BYTES,
    LOSS_BYTES_PER_LOGIT,
    MATH_SOFTMAX_BYTES,
    WEIGHT_RECAST_BYTES,
    causal_attention_flops_per_token,
    elementwise_bytes_per_token,
    op_selective_bytes_per_token,
    sp_copy_bytes_per_token,
)

RECOMPUTE = ("none", "selective", "full", "op-selective")
"""Recompute modes ``work`` prices (the module docstring names them)."""


@dataclass(frozen=True, kw_only=True)
class Roofline:
    """Achieved fractions of the catalog's peaks, per kind of work."""

    gemm: float
    """Fraction of the dense bf16 peak reached by the matmuls."""
    attention: float
    """Fraction of the peak reached by the causal flash attention core (on its causal FLOPs)."""
    ring_attention: float
    """The same for parlab's context-parallel ring (flash blocks and their merges)."""
    memory: float
    """Fraction of the catalog's HBM bandwidth reached by the elementwise kernels."""
    contention: float = 0.0
    """Fraction of the time of a collective hidden under compute that compute loses (the
    collective's kernels take SMs and memory bandwidth from it)."""
    gemm_width: float = 0.0
    """Per-GPU GEMM width (hidden / tp) at which ``gemm`` was measured; 0: every width."""
    gemm_width_half: float = 0.0
    """n0 of the width law f(n) = n / (n + n0): narrower matrices run further from peak;
    0: the same GEMM efficiency at every width."""
    optimizer_bw: float = 0.0
    """Measured bandwidth (B/s) of the fused AdamW step (``benchmarks/param_work_probe.py``);
    0: the optimizer step runs at ``memory`` x the catalog's HBM bandwidth, as the elementwise
    ops."""
    cast_bw: float = 0.0
    """The same for the per-micro-batch casts (weights to bf16, bf16 gradients back)."""
    bucket_bw: float = 0.0
    """The same for torch DDP's passes over its gradient buckets (``DDP_ACCUMULATE_BYTES``,
    ``DDP_STEP_BYTES``)."""
    recompute_gemm: float = 0.0
    """Fraction of the peak reached by the GEMMs a full recompute replays: the model's layer
    forward GEMMs' own efficiency at the run's shapes, as ``benchmarks/gemm_shapes_probe.py``
    measured them (``parlab.plan.fit.shapes.shaped_roofline`` sets it); 0: at ``gemm_at``, as every
    other GEMM. ``gemm`` is fitted on whole steps without recompute, so it carries what those
    steps spend beside their GEMM kernels; a recompute adds GEMMs, not that."""
    head_gemm: float = 0.0
    """Fraction of the peak reached by the output layer's GEMMs (the vocabulary projection, its
    own shape); 0: at ``gemm_at``, as every other GEMM."""
    overhead: float = 0.0
    """What a step adds to the sum of its kernels' times, as a fraction of that sum (the built-in
    model's; a roofline fitted on whole steps carries it in its efficiencies: 0)."""
    source: str = ""
    """Where the numbers come from (the runs they were fitted on)."""

    def __post_init__(self) -> None:
        if not 0.0 <= self.head_gemm <= 1.0:
            raise UsageError(f"roofline head_gemm = {self.head_gemm}: give 0 (off) or a fraction")
        for name in ("gemm", "attention", "ring_attention", "memory"):
            v = getattr(self, name)
            if not 0.0 < v <= 1.0:
                raise UsageError(f"roofline {name} = {v}: give a fraction in (0, 1]")
        if not 0.0 <= self.recompute_gemm <= 1.0:
            raise UsageError(
                f"roofline recompute_gemm = {self.recompute_gemm}: give 0 (off) or a fraction "
                "in (0, 1]"
            )
        if not 0.0 <= self.contention <= 1.0:
            raise UsageError(f"roofline contention = {self.contention}: give a fraction in [0, 1]")
        if self.gemm_width < 0 or self.gemm_width_half < 0:
            raise UsageError("roofline GEMM width and its half: give 0 (off) or more")
        if self.optimizer_bw < 0 or self.cast_bw < 0 or self.bucket_bw < 0:
            raise UsageError(
                "roofline optimizer, cast and bucket bandwidths: give 0 (off) or more B/s"
            )

    def width_factor(self, width: float) -> float:
        """GEMM efficiency at ``width`` relative to ``gemm``'s own: f(width) / f(gemm_width)."""
        n0, ref = self.gemm_width_half, self.gemm_width
        if n0 <= 0 or ref <= 0 or width <= 0:
            return 1.0
        return (width / (width + n0)) / (ref / (ref + n0))

    def gemm_at(self, width: float) -> float:
        """GEMM efficiency at per-GPU width ``width`` (never above 1)."""
        return min(1.0, self.gemm * self.width_factor(width))


PRODUCTION = Implementation(norm_kernel="compiled", kv_repeat=False)
"""What production frameworks run (Megatron-LM with Transformer Engine, torchtitan with
torch.compile): fused kernels that keep what a compiled block keeps (the norm's input and rstd,
SwiGLU's two inputs with its product recomputed), flash attention reading the KV heads as they
are. The planner's default; the ledger falls back to the fused eager blocks where it does not
model compiled ones (GeLU models, autocast over float32 parameters)."""


@dataclass(frozen=True, kw_only=True)
class Work:
    """The work of one rank's step, before efficiencies: FLOPs and bytes."""

    gemm_flops: float
    """Matmul FLOPs (recompute included)."""
    recompute_gemm_flops: float = 0.0
    """The share of ``gemm_flops`` a full recompute replays (the blocks' forward GEMMs)."""
    head_gemm_flops: float = 0.0
    """The share of ``gemm_flops`` of the output layer."""
    attention_flops: float
    """Flash attention core FLOPs (causal half; recompute included); 0 for ``math``."""
    ring: bool
    """Whether the attention core runs as the context-parallel ring."""
    elementwise_bytes: float
    """Bytes of the per-token elementwise ops and the loss."""
    step_bytes: float
    """Bytes of the per-parameter work: casts per micro-batch, DDP's bucket passes and the
    optimizer step."""
    optimizer_bytes: float = 0.0
    """The optimizer step's share of ``step_bytes``."""
    bucket_bytes: float = 0.0
    """torch DDP's bucket passes' share of ``step_bytes`` (the rest: casts)."""
    forward_fraction: float
    """Share of the compute that is forward (the rest is backward and the optimizer)."""
    gemm_width: float = 0.0
    """Per-GPU GEMM width, hidden / tp."""

    def parts(self, roof: Roofline, peak_flops: float, hbm_bw: float) -> ComputeParts:
        """Seconds of each kind at ``roof``'s efficiencies."""
        attn_eff = roof.ring_attention if self.ring else roof.attention
        eff = roof.gemm_at(self.gemm_width)
        rc_eff = roof.recompute_gemm or eff
        head_eff = roof.head_gemm or eff
        rest = self.gemm_flops - self.recompute_gemm_flops - self.head_gemm_flops
        k = 1.0 + roof.overhead
        return ComputeParts(
            gemm_s=k
            * (
                rest / (eff * peak_flops)
                + self.recompute_gemm_flops / (rc_eff * peak_flops)
                + self.head_gemm_flops / (head_eff * peak_flops)
            ),
            attention_s=k * self.attention_flops / (attn_eff * peak_flops),
            elementwise_s=k * self.elementwise_bytes / (roof.memory * hbm_bw),
            step_s=k * self.step_seconds(roof, hbm_bw),
            forward_fraction=self.forward_fraction,
        )

    def step_seconds(self, roof: Roofline, hbm_bw: float) -> float:
        """The per-parameter work's seconds: each part at its measured bandwidth where ``roof``
        carries one, else at the elementwise ops' (``memory`` x ``hbm_bw``)."""
        measured_s, unmeasured = self.step_split(roof)
        return measured_s + unmeasured / (roof.memory * hbm_bw)

    def step_split(self, roof: Roofline) -> tuple[float, float]:
        """(seconds of the per-parameter work ``roof`` has measured bandwidths for, bytes of the
        rest): the optimizer step at ``optimizer_bw``, the casts at ``cast_bw``, DDP's bucket
        passes at ``bucket_bw``, where set."""
        cast = self.step_bytes - self.optimizer_bytes - self.bucket_bytes
        seconds = rest = 0.0
        parts = (
            (self.optimizer_bytes, roof.optimizer_bw),
            (cast, roof.cast_bw),
            (self.bucket_bytes, roof.bucket_bw),
        )
        for nbytes, bw in parts:
            if bw:
                seconds += nbytes / bw
            else:
                rest += nbytes
        return seconds, rest


@dataclass(frozen=True, kw_only=True)
class ComputeParts:
    """Compute seconds of one rank's step, by kind."""

    gemm_s: float
    """Matmuls."""
    attention_s: float
    """The attention core."""
    elementwise_s: float
    """Per-token memory-bound ops and the loss."""
    step_s: float
    """Casts and the optimizer step."""
    forward_fraction: float
    """Share of the per-token compute that is forward."""

    @property
    def total_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s + self.step_s

    @property
    def per_token_s(self) -> float:
        return self.gemm_s + self.attention_s + self.elementwise_s

    @property
    def forward_s(self) -> float:
        return self.per_token_s * self.forward_fraction

    @property
    def backward_s(self) -> float:
        return self.per_token_s * (1.0 - self.forward_fraction)


def work(
    spec: ModelSpec,
    *,
    seq: int,
    micro_batch: int,
    microbatches: int,
    tp: int = 1,
    pp: int = 1,
    cp: int = 1,
    dp: int = 1,
    strategy: str = "ddp",
    recompute: str = "none",
    sp: bool = False,
    dtype: str = "bf16-compute",
    impl: Implementation | None = None,
    layers: float | None = None,
    head: bool = True,
) -> Work:
    """FLOPs and bytes of one rank's step: ``layers`` blocks (default ``spec.layers / pp``, an
    even split) and, with ``head``, the output layer and the loss (the last pipeline stage)."""
    impl = impl or Implementation()
    pol = dtype_policy(dtype)
    tokens = micro_batch * seq / cp * microbatches  # this rank's tokens per step
    share = (spec.layers / pp if layers is None else layers) / spec.layers  # this rank's blocks
    blocks = (spec.num_active_params(embedding=False) - spec.output_params()) * share  # MoE: top-k
    out = (spec.output_params() or spec.vocab_size * spec.hidden) if head else 0  # tied: a matmul
    n_stage = (blocks + out) / tp
    if recompute not in RECOMPUTE:
        raise UsageError(f"recompute {recompute!r}: use one of {', '.join(RECOMPUTE)}")
    if recompute == "op-selective" and impl.attention_kernel != "flash":
        raise UsageError("op-level selective recompute is modelled with flash attention only")
    rc_fwd = 1.0 if recompute == "full" else 0.0
    # full recompute replays the blocks' forward (the output layer is not checkpointed: parlab's
    # ``apply_recompute``, as Megatron's)
    rc_gemm = 2.0 * rc_fwd * blocks / tp * tokens
    gemm = 6.0 * n_stage * tokens + rc_gemm
    attn_core = causal_attention_flops_per_token(spec, seq) * share / tp * tokens
    rc_attn = 1.0 if recompute in ("selective", "full") else 0.0
    ew = _elementwise_bytes(
        spec, impl=impl, pol=pol, strategy=strategy, recompute=recompute, tp=tp, sp=sp,
        micro_batch=micro_batch, tokens=tokens, share=share, head=head,
    )  # fmt: skip
    attention_flops = 0.0
    if impl.attention_kernel == "flash":
        attention_flops = attn_core * (1.0 + rc_attn / 3.0)
    else:  # materialised: the whole square at GEMM speed, and every score through the softmax
        gemm += 2.0 * attn_core * (1.0 + rc_attn / 3.0)
        scores = spec.layers * share * spec.heads / tp * seq * tokens
        ew += MATH_SOFTMAX_BYTES * scores * (1.0 + rc_attn / 2.0)
    # per parameter: mixed-precision casts every micro-batch, then the optimizer step
    params = spec.num_params() * share / tp
    cast, bucket, opt = _per_parameter_bytes(
        pol, impl, strategy=strategy, recompute=recompute, params=params, blocks=blocks, tp=tp,
        microbatches=microbatches, dp=dp, cp=cp,
    )  # fmt: skip
    fwd = (2.0 + 2.0 * rc_fwd) / (6.0 + 2.0 * rc_fwd)
    return Work(
        gemm_flops=gemm,
        recompute_gemm_flops=rc_gemm,
        head_gemm_flops=6.0 * out / tp * tokens,
        attention_flops=attention_flops,
        ring=cp > 1,
        elementwise_bytes=ew,
        step_bytes=cast + opt + bucket,
        optimizer_bytes=opt,
        bucket_bytes=bucket,
        forward_fraction=fwd,
        gemm_width=spec.hidden / tp,
    )


def _elementwise_bytes(
    spec: ModelSpec,
    *,
    impl: Implementation,
    pol: DtypePolicy,
    strategy: str,
    recompute: str,
    tp: int,
    sp: bool,
    micro_batch: int,
    tokens: float,
    share: float,
    head: bool,
) -> float:
    """Bytes of the rank's per-token elementwise ops (recompute's again) and of the loss."""
    # autocast over float32 parameters keeps a float32 residual stream; FSDP and ZeRO-3 gather
    # their parameters in bf16, so theirs is bf16
    fp32_stream = pol.autocast and strategy in ("ddp", "zero1", "zero2")
    rc_fwd = 1.0 if recompute == "full" else 0.0
    ew = elementwise_bytes_per_token(spec, impl=impl, tp=tp, sp=sp, fp32_stream=fp32_stream)
    ew *= tokens * share
    ew *= 1.0 + rc_fwd / 3.0  # full recompute replays the forward's elementwise ops
    if recompute == "op-selective":  # the runtime's: the blocks' elementwise forward again
        ew += op_selective_bytes_per_token(
            spec, impl=impl, tp=tp, sp=sp, fp32_stream=fp32_stream
        ) * (tokens * share)
    if sp:
        ew += sp_copy_bytes_per_token(
            spec, impl=impl, tp=tp, micro_batch=micro_batch, elem=pol.compute_bytes
        ) * (tokens * share)
    if head:
        ew += LOSS_BYTES_PER_LOGIT * spec.vocab_size / tp * tokens
    return ew


def _per_parameter_bytes(
    pol: DtypePolicy,
    impl: Implementation,
    *,
    strategy: str,
    recompute: str,
    params: float,
    blocks: float,
    microbatches: int,
    tp: int,
    dp: int,
    cp: int,
) -> tuple[float, float, float]:
    """(casts, DDP's bucket passes, the optimizer step): bytes of the per-parameter work of the
    rank's ``params`` (``blocks``: the parameters of its blocks, before TP)."""
    cast = CAST_BYTES_PER_PARAM * params * microbatches if pol.autocast else 0.0
    # autocast casts float32 weights (FSDP and ZeRO-3 gather theirs in bf16: nothing to cast);
    # a recompute enters a fresh autocast context and casts each block weight again
    if recompute in ("op-selective", "full") and pol.autocast and strategy not in ("fsdp", "zero3"):
        cast += WEIGHT_RECAST_BYTES * blocks / tp * microbatches
    if strategy == "fsdp" and pol.autocast:
        cast += FSDP_REGATHER_BYTES * blocks / (tp * dp) * microbatches
    bucket = 0.0
    if strategy == "ddp" and (dp * cp > 1 or impl.ddp_one_rank):
        bucket = (DDP_ACCUMULATE_BYTES * microbatches + DDP_STEP_BYTES) * params
    master = pol.master_bytes or pol.param_bytes
    opt_params = params / dp if strategy in ("zero1", "zero2", "zero3", "fsdp") else params
    # fused AdamW: read grad, both states, the master; write both states, the master (and the
    # bf16 copy where a separate master exists)
    opt = opt_params * (
        pol.grad_bytes
        + 4 * pol.state_bytes
        + 2 * master
        + (pol.param_bytes if pol.master_bytes else 0)
    )
    return cast, bucket, opt

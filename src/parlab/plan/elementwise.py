"""The bytes the memory-bound work of a step moves: the passes of each elementwise op per
kernel implementation (``ELEMENTWISE``), the loss, the mixed-precision casts, torch DDP's
bucket passes and FSDP's re-gather, and the per-token counts ``parlab.plan.roofline.work``
reads (the attention core's causal FLOPs beside them)."""

from __future__ import annotations

from parlab.errors import UsageError
from parlab.ledger.implementation import Implementation
from parlab.models.flops import attention_head_dim
from parlab.models.spec import ModelSpec

# Bytes moved per element, forward + backward, bf16 activations (2 B), float32 math where the
# reference model upcasts. Counted op by op from parlab.models.reference:
#   norm: fused F.rms_norm: fwd read x, write y (4); bwd read x, dy, write dx (6).
#         explicit: x.float (2+4), pow (4+4), mean (4), mul rsqrt (4+4), type_as (4+2),
#         * weight (2+2) = 36 forward; autograd replays each op's backward at about twice that.
#   residual add: fwd read 2, write 1 (6); bwd the two branches' gradients summed (6).
#   rope (per q and k element): fused complex multiply: float (2+4), mul (4+4+table), type_as
#         (4+2) = 20 each way; explicit: float, four muls, sub, add, stack, type_as (~84 forward,
#         twice that backward).
#   swiglu (per FFN element): silu (2+2), mul (4+2) forward; bwd mul (6+4), silu (4+2).
#   gelu (per FFN element): fwd 2+2, bwd 4+2.
#   attention layout (per q element): the output's transpose-reshape copy each way (4+4).
#   compiled: each fused group reads its inputs once and writes once.
ELEMENTWISE: dict[str, dict[str, float]] = {
    "fused": {"norm": 10, "residual": 12, "rope": 40, "swiglu": 26, "gelu": 10, "layout": 8},
    "explicit": {"norm": 108, "residual": 12, "rope": 252, "swiglu": 26, "gelu": 10, "layout": 8},
    "compiled": {"norm": 10, "residual": 6, "rope": 8, "swiglu": 16, "gelu": 8, "layout": 8},
}
ELEMENTWISE_FORWARD: dict[str, dict[str, float]] = {
    "fused": {"norm": 4, "residual": 6, "rope": 20, "swiglu": 10, "gelu": 4, "layout": 4},
    "explicit": {"norm": 36, "residual": 6, "rope": 84, "swiglu": 10, "gelu": 4, "layout": 4},
}
"""The forward passes of ``ELEMENTWISE`` (the counts in its comment): what op-level selective
recompute runs again. Eager implementations only: a compiled block's recompute is not counted."""
FP32_STREAM_FORWARD = {"norm": 4.0, "residual": 4.0, "cast": 6.0}
"""The forward passes of ``FP32_STREAM_BYTES``."""
WEIGHT_RECAST_BYTES = 6.0
"""Op-level selective recompute under autocast: the recompute enters a fresh autocast context
(empty weight cache), so each block weight is cast to bf16 again (4 + 2) per micro-batch."""
LOSS_BYTES_PER_LOGIT = 40.0
"""Cross-entropy on float32 logits: upcast (2+4), log-softmax with its two reductions (16),
backward (12) and the cast of the gradient back (4+2)."""
MATH_SOFTMAX_BYTES = 20.0
"""Per score element of a materialised attention: scale-mask-softmax and dropout forward
(2+2, 2+2+1 mask), their backward (2+1+2, 2+2+2)."""
FP32_STREAM_BYTES = {"norm": 10.0, "residual": 10.0, "cast": 12.0}
"""Extra bytes per hidden element when autocast runs over float32 parameters (DDP, ZeRO-1/2):
the embedding's float32 output makes the residual stream float32, so each norm reads and
writes 4-byte elements (+4 forward, +6 backward), each residual add reads and writes them
(+4, +6), and every linear that reads a norm's output casts it to bf16 again (4+2 forward and
2+4 backward; autocast caches weights, not activations)."""
CAST_BYTES_PER_PARAM = 12.0
"""Mixed precision with float32 parameters: each micro-batch casts the weights to bf16 (4+2)
and the bf16 weight gradients back to float32 (2+4)."""
DDP_BUCKET_PASSES: dict[str, float] = {"accumulate": 12.0, "scale": 8.0, "zero_grad": 4.0}
"""torch DDP as ``parlab train`` runs it (``gradient_as_bucket_view``, gradients zeroed, not
set to None), bytes per float32 parameter, named as ``benchmarks/param_work_probe.py`` times
each: ``accumulate``, every micro-batch's gradient added into the kept bucket view (autograd's
AccumulateGrad, ``grad += g``: read 4 + 4, write 4); once a step, ``scale``, the reducer's
in-place division of the bucket by the world size before its all-reduce (read and write 4; on
one rank too), and ``zero_grad``, ``zero_grad(set_to_none=False)`` filling the bucket (write 4).
Profiled: ``results/PAR-TRAINING-STATE/profile-train-ddp-20261201T044931-29002b.json``."""
DDP_ACCUMULATE_BYTES = DDP_BUCKET_PASSES["accumulate"]
"""Per micro-batch (``DDP_BUCKET_PASSES``)."""
DDP_STEP_BYTES = DDP_BUCKET_PASSES["scale"] + DDP_BUCKET_PASSES["zero_grad"]
"""Once a step (``DDP_BUCKET_PASSES``)."""
FSDP_REGATHER_BYTES = 6.0
"""FSDP2 with ``reshard_after_forward``: each block is gathered again before its backward, and
the gather's copy-in casts the float32 shard to bf16 again (4 + 2 per shard element). The
forward's gather is what ``CAST_BYTES_PER_PARAM`` stands for under FSDP (no autocast: the
copy-in casts, the reduce-scatter's copy-in casts the bf16 gradients to float32). Profiled:
``results/PAR-TRAINING-STATE/profile-train-fsdp-20261201T045000-9a446e.json``."""


def _kernel(impl: Implementation) -> str:
    """The column of ``ELEMENTWISE`` for ``impl``'s norm kernel: torch's CPU decomposition
    (``composite``) moves the bytes of the ``explicit`` ops."""
    return "explicit" if impl.norm_kernel == "composite" else impl.norm_kernel


def causal_attention_flops_per_token(spec: ModelSpec, seq: int) -> float:
    """Training FLOPs per token of the causal attention core under a flash kernel:
    ``6 L H Q T``, half of PaLM's ``12 L H Q T`` (keys after the query are never computed)."""
    return 6.0 * spec.layers * spec.heads * attention_head_dim(spec) * seq


def elementwise_bytes_per_token(
    spec: ModelSpec,
    *,
    impl: Implementation,
    tp: int = 1,
    sp: bool = False,
    fp32_stream: bool = False,
) -> float:
    """Bytes the elementwise ops of every block move per token, forward + backward, on one
    tensor-parallel rank (norms and residual adds are split only by sequence parallelism);
    ``fp32_stream``: autocast over float32 parameters (``FP32_STREAM_BYTES``)."""
    t = ELEMENTWISE[_kernel(impl)]
    h, f = spec.hidden, spec.ffn_hidden
    q_width = spec.heads * spec.d_head
    rot = 0.0 if spec.position != "rope" else (q_width + spec.kv_dim)
    act = t["swiglu"] if spec.activation == "swiglu" else t["gelu"]
    replicated = 2 * (t["norm"] + t["residual"]) * h
    split = t["rope"] * rot + act * f + t["layout"] * q_width
    if fp32_stream:
        readers = 3 + (2 if spec.activation == "swiglu" else 1)  # q, k, v; w1 (and w3)
        x = FP32_STREAM_BYTES
        replicated += (2 * x["norm"] + 2 * x["residual"] + readers * x["cast"]) * h
    per_layer = replicated / (tp if sp else 1) + split / tp
    return per_layer * spec.layers


def op_selective_bytes_per_token(
    spec: ModelSpec,
    *,
    impl: Implementation,
    tp: int = 1,
    sp: bool = False,
    fp32_stream: bool = False,
) -> float:
    """Bytes per token that op-level selective recompute moves again in backward, every block,
    on one tensor-parallel rank: the forward (``ELEMENTWISE_FORWARD``) of the block's two norms,
    its RoPE, activation and attention layout copy, and of its first residual add (the second
    follows the last saved matmul, where the recompute stops: torch's early stop), plus under
    ``fp32_stream`` their float32 stream and the activation casts before the linears.
    ``UsageError`` for compiled blocks."""
    if _kernel(impl) not in ELEMENTWISE_FORWARD:
        raise UsageError(
            f"op-level selective recompute of {impl.norm_kernel} blocks is not modelled "
            f"(eager: {', '.join(ELEMENTWISE_FORWARD)})"
        )
    t = ELEMENTWISE_FORWARD[_kernel(impl)]
    h, f = spec.hidden, spec.ffn_hidden
    q_width = spec.heads * spec.d_head
    rot = 0.0 if spec.position != "rope" else (q_width + spec.kv_dim)
    act = t["swiglu"] if spec.activation == "swiglu" else t["gelu"]
    replicated = (2 * t["norm"] + t["residual"]) * h
    split = t["rope"] * rot + act * f + t["layout"] * q_width
    if fp32_stream:
        readers = 3 + (2 if spec.activation == "swiglu" else 1)
        x = FP32_STREAM_FORWARD
        replicated += (2 * x["norm"] + x["residual"] + readers * x["cast"]) * h
    return (replicated / (tp if sp else 1) + split / tp) * spec.layers


def sp_copy_bytes_per_token(
    spec: ModelSpec, *, impl: Implementation, tp: int, micro_batch: int, elem: int = 2
) -> float:
    """Bytes per token that ``sp_gather = "per-linear"`` copies beyond the shared gather, every
    block: the all-gather's output, (S, B, H) seen as a strided (B, S, H), is copied by each
    linear that reads it -- wq, wk, wv and w1 (and w3) -- where the shared form copies it once
    per gather (two a block): ``1 + mats_in`` more copies (read and write, ``elem`` bytes each)
    of the whole gathered sequence in forward; backward is the same in both. None at
    micro-batch 1 (the view is contiguous) or without tensor parallelism."""
    if impl.sp_gather == "shared" or tp == 1 or micro_batch == 1:
        return 0.0
    mats_in = 2 if spec.activation == "swiglu" else 1
    return (1 + mats_in) * 2 * elem * spec.hidden * spec.layers

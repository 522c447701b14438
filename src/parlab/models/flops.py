"""FLOPs per token and MFU, the way PaLM (appendix B) and torchtitan count them.

Training FLOPs per token = ``6 N + 12 L H Q T``:

- ``N``: parameters touched per token without the embedding tables (MoE:
  the active parameters: top-k routed experts plus shared ones). The untied
  output projection counts (it is a matmul per token); a tied one is the
  embedding table and does not (PaLM's convention).
- ``12 L H Q T``: attention scores and their weighted sum, forward (4 L H Q T)
  and backward (8 L H Q T), with L layers, H query heads, Q the head dim
  (MLA: the mean of the query/key and value head dims) and T the sequence
  length. Not halved for the causal mask, as PaLM and torchtitan count.

Forward only (inference, prefill): ``2 N + 4 L H Q T``.

MFU = tokens/s x FLOPs per token / (GPUs x dense peak FLOP/s of the GPU in the
hardware catalog). An unknown GPU (or dtype) has no peak: MFU is ``None``
(shown as unknown, never guessed).
"""

from __future__ import annotations

from parlab.errors import UsageError
from parlab.hardware.catalog import peak_flops
from parlab.models.spec import ModelSpec


def attention_head_dim(spec: ModelSpec) -> float:
    """Q of the formula: the head dim (MLA: mean of the q/k and v head dims)."""
    if spec.mla is not None:
        return (spec.mla.qk_head_dim + spec.mla.v_head_dim) / 2
    return float(spec.d_head)


def _check_seq(seq_len: int) -> None:
    if isinstance(seq_len, bool) or not isinstance(seq_len, int) or seq_len < 1:
        raise UsageError(f"seq_len = {seq_len!r}: give a whole number of tokens, at least 1")


def training_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """``6 N + 12 L H Q T``: forward + backward FLOPs per trained token."""
    _check_seq(seq_len)
    n = spec.num_active_params(embedding=False)
    return 6 * n + 12 * spec.layers * spec.heads * attention_head_dim(spec) * seq_len


def forward_flops_per_token(spec: ModelSpec, seq_len: int) -> float:
    """``2 N + 4 L H Q T``: forward FLOPs per token."""
    _check_seq(seq_len)
    n = spec.num_active_params(embedding=False)
    return 2 * n + 4 * spec.layers * spec.heads * attention_head_dim(spec) * seq_len


def mfu(
    tokens_per_s: float, flops_per_token: float, gpus: int, peak_flops_per_gpu: float | None
) -> float | None:
    """Model FLOPs utilisation as a fraction (0..1), or ``None`` when the peak is unknown."""
    if gpus < 1:
        raise UsageError(f"gpus = {gpus}: give at least 1")
    if peak_flops_per_gpu is None or peak_flops_per_gpu <= 0:
        return None
    return tokens_per_s * flops_per_token / (gpus * peak_flops_per_gpu)


def mfu_for(
    spec: ModelSpec,
    *,
    seq_len: int,
    tokens_per_s: float,
    gpus: int,
    gpu: str,
    dtype: str = "bf16",
) -> float | None:
    """MFU of training ``spec`` at ``tokens_per_s`` (all GPUs together) on ``gpus`` x ``gpu``."""
    return mfu(tokens_per_s, training_flops_per_token(spec, seq_len), gpus, peak_flops(gpu, dtype))


def train_flops_per_token(spec: ModelSpec, *, seq: int) -> float:
    """``training_flops_per_token`` with the sequence as ``seq`` (the planner's spelling)."""
    return training_flops_per_token(spec, seq)

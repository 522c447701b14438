"""Eager speed of the reference model, part by part, against faster equivalent implementations.

What it measures. Forward + backward of the parts of one ``TransformerBlock`` of the
reference model (``parlab.models.reference``), of the whole block, and of the whole model
with its loss, at the preset's shape (``1.3b``: micro-batch 2 x 4096, bf16 on CUDA; a tiny
model in fp32 on the CPU). Each part's current implementation is timed beside equivalent
alternatives:

- norm: ``RMSNorm`` (x.float, pow, mean, rsqrt, mul, type_as, mul) vs ``F.rms_norm`` with
  the weight fused, and ``F.rms_norm`` without weight followed by ``* weight``;
- rope: ``apply_rope`` (float upcast, unflatten, four muls, stack) vs torchtitan's complex
  multiplication (``torch.view_as_complex`` with a cached ``freqs_cis``) and a cached
  pre-expanded cos/sin table; the cost of rebuilding ``rope_table`` each forward is its own row;
- attention core: SDPA on transposed q/k/v (K/V repeated by ``repeat_interleave`` under GQA)
  vs contiguous q/k/v, ``enable_gqa=True`` (torch >= 2.5), and each SDPA backend (CUDA);
- MLP: SwiGLU with separate ``w1``/``w3`` vs one fused ``w13`` matmul;
- loss: cross-entropy on fp32 logits vs on the logits' own dtype;
- block: the current block vs the same weights with every equivalent swap, and (CUDA) the
  current block captured in a CUDA graph; model: the current model vs the swapped one.

Every alternative is first checked equal to the current implementation on the same random
inputs: the output and every gradient (inputs and parameters), as the largest absolute
difference over the largest absolute value of the current one, within 1e-4 (fp32) or
3e-2 (bf16/fp16). The largest such error is printed beside the timing, and an alternative
that is not equal is not timed. Timings: CUDA events around each iteration on a GPU,
recorded back to back without a synchronise in between (the wall clock on the CPU),
``--warmup`` iterations excluded, median of ``--iters``. No communication: one device, one
process. Nothing here changes the model; the table says what to change in it.

    PYTHONPATH=src python3 benchmarks/model_eager_probe.py                # 1.3b on CUDA
    PYTHONPATH=src python3 benchmarks/model_eager_probe.py --tiny         # CPU-sized
    PYTHONPATH=src python3 benchmarks/model_eager_probe.py --gqa-kv-heads 4 --json rows.json

``--check-gate`` first shows the gate at work: alternatives of RMSNorm known to be wrong (in
the output, or only in a gradient, or raising) are refused and not timed. The exit status is
1 when a real alternative was refused.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F

from parlab.models import get_spec
from parlab.models.flops import training_flops_per_token
from parlab.models.reference import Attention, RMSNorm, TransformerBlock, apply_rope, build_model
from parlab.models.reference import rope_table as reference_rope_table
from parlab.models.spec import ModelSpec

TOLERANCE: dict[torch.dtype, float] = {
    torch.float32: 1e-4,
    torch.float64: 1e-8,
    torch.bfloat16: 3e-2,
    torch.float16: 1e-2,
}
"""Largest accepted ``max|alt - current| / max|current|`` per compute dtype."""


@dataclass(frozen=True, kw_only=True)
class ProbeConfig:
    """What to probe and how long."""

    spec: ModelSpec
    """The model (its first block is the block probed)."""
    batch: int
    """Micro-batch size."""
    seq: int
    """Sequence length."""
    dtype: torch.dtype
    """Parameter and activation dtype."""
    device: torch.device
    """Where everything runs."""
    iters: int = 10
    """Timed iterations per row (the median is reported)."""
    warmup: int = 3
    """Untimed iterations before them."""
    whole_model: bool = True
    """Also time the whole model with its loss."""
    cuda_graph: bool = True
    """Also time the block captured in a CUDA graph (CUDA only)."""
    seed: int = 0
    """Seed of the weights and inputs."""
    check_gate: bool = False
    """Also run the equality gate on alternatives known to be wrong (``gate`` rows)."""

    def __post_init__(self) -> None:
        if self.batch < 1 or self.seq < 1:
            raise ValueError(f"batch {self.batch}, seq {self.seq}: give positive sizes")
        if self.iters < 1 or self.warmup < 0:
            raise ValueError(f"iters {self.iters}, warmup {self.warmup}: give iters >= 1")
        if self.dtype not in TOLERANCE:
            raise ValueError(f"dtype {self.dtype}: use fp32, bf16 or fp16")


@dataclass(frozen=True, kw_only=True)
class Variant:
    """One implementation of a part: a forward closure over shared inputs and parameters."""

    name: str
    """Short name printed in the table."""
    forward: Callable[[], torch.Tensor]
    """Runs the forward; its output gets ``backward`` with the part's fixed output gradient."""
    grads: Callable[[], list[torch.Tensor]]
    """The gradients after backward, in the same order for every variant of a part."""
    leaves: list[torch.Tensor]
    """Tensors whose ``.grad`` is cleared before each run."""
    note: str = ""
    """Why this variant may matter (printed)."""


@dataclass(frozen=True, kw_only=True)
class Row:
    """One line of the table."""

    scope: str
    """``part``, ``block`` or ``model``."""
    part: str
    """norm, rope, rope_table, attention, mlp, loss, block, model."""
    variant: str
    """``current`` or the alternative's name."""
    ms: float | None
    """Median forward+backward milliseconds; None when not timed."""
    speedup: float | None
    """current ms / this ms."""
    err_out: float | None
    """Relative max error of the output against the current implementation."""
    err_grad: float | None
    """Relative max error over all gradients against the current implementation."""
    status: str
    """``timed``, ``NOT EQUAL (not timed)``, ``unsupported: ...`` or ``failed: ...``."""
    note: str = ""
    """Why the variant may matter."""
    extra: dict[str, float | None] = field(default_factory=dict)
    """tokens/s and MFU for the model rows."""


# ----- equivalent implementations -----------------------------------------------------------


def freqs_cis(rope_SD2: torch.Tensor) -> torch.Tensor:
    """torchtitan's table: complex64 ``[S, D/2]`` = cos + i sin (built once, cached)."""
    return torch.complex(rope_SD2[..., 0].contiguous(), rope_SD2[..., 1].contiguous())


def apply_rope_complex(x_BSND: torch.Tensor, cis_SD: torch.Tensor) -> torch.Tensor:
    """Interleaved pairs as complex numbers times ``cis``: same rotation as ``apply_rope``."""
    xc = torch.view_as_complex(x_BSND.float().unflatten(-1, (-1, 2)))
    return torch.view_as_real(xc * cis_SD[None, :, None, :]).flatten(-2).type_as(x_BSND)


def cos_sin_expanded(rope_SD2: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Cached ``cos [S,1,D]`` and signed ``sin [S,1,D]`` (``-sin`` on even, ``+sin`` on odd)."""
    cos = rope_SD2[..., 0].repeat_interleave(2, dim=-1)
    sin = torch.stack((-rope_SD2[..., 1], rope_SD2[..., 1]), dim=-1).flatten(-2)
    return cos[:, None, :].contiguous(), sin[:, None, :].contiguous()


def apply_rope_cached(x_BSND: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x * cos + swap_pairs(x) * signed_sin`` in float32 with a cached table."""
    xf = x_BSND.float()
    swapped = xf.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return (xf * cos + swapped * sin).type_as(x_BSND)


def sdpa_current(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The reference's attention core: transposed views, K/V repeated under GQA."""
    B, S = q.shape[:2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(B, S, -1)


def sdpa_contiguous(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """As ``sdpa_current`` with q/k/v made contiguous in ``B N S D`` first."""
    B, S = q.shape[:2]
    q, k, v = (t.transpose(1, 2).contiguous() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    if rep > 1:
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return o.transpose(1, 2).reshape(B, S, -1)


def sdpa_native_gqa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """SDPA with ``enable_gqa=True``: K/V heads are not materialised ``rep`` times."""
    B, S = q.shape[:2]
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
    return o.transpose(1, 2).reshape(B, S, -1)


def has_enable_gqa() -> bool:
    """torch >= 2.5 takes ``enable_gqa``."""
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def fast_block(
    block: TransformerBlock, x_BSH: torch.Tensor, cis_SD: torch.Tensor, gqa_native: bool
) -> torch.Tensor:
    """The block's forward with its own weights and every equivalent swap: ``F.rms_norm``,
    complex rope on a cached table, SDPA with ``enable_gqa`` (under GQA)."""
    attn = block.attention
    ff = block.feed_forward
    an, fn_ = block.attention_norm, block.ffn_norm
    assert isinstance(attn, Attention) and ff is not None and ff.w3 is not None
    assert isinstance(an, RMSNorm) and isinstance(fn_, RMSNorm)
    B, S, H = x_BSH.shape
    h_in = F.rms_norm(x_BSH, (H,), an.weight, an.eps)
    q = attn.wq(h_in).view(B, S, -1, attn.head_dim)
    k = attn.wk(h_in).view(B, S, -1, attn.head_dim)
    v = attn.wv(h_in).view(B, S, -1, attn.head_dim)
    q, k = apply_rope_complex(q, cis_SD), apply_rope_complex(k, cis_SD)
    core = sdpa_native_gqa if gqa_native and q.shape[2] != k.shape[2] else sdpa_current
    h = x_BSH + attn.wo(core(q, k, v))
    g = F.rms_norm(h, (H,), fn_.weight, fn_.eps)
    return h + ff.w2(F.silu(ff.w1(g)) * ff.w3(g))


# ----- checking and timing -------------------------------------------------------------------


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """``max|a - b| / max|b|`` in float32 (0 when both are zero)."""
    a32, b32 = a.detach().float(), b.detach().float()
    scale = b32.abs().max().item()
    diff = (a32 - b32).abs().max().item()
    if scale == 0.0:
        return diff
    return diff / scale


def run_once(v: Variant, gout: torch.Tensor | None) -> torch.Tensor:
    """Clear the leaves' grads, forward, backward (with ``gout``, or 1 for a scalar)."""
    for t in v.leaves:
        t.grad = None
    out = v.forward()
    out.backward(gout if out.dim() else None)
    return out


def sample_ms(fn: Callable[[], object], iters: int, device: torch.device) -> list[float]:
    """Milliseconds of each of ``iters`` back-to-back calls.

    On a GPU: a CUDA event before and after every call, recorded without synchronising in
    between (the host runs ahead as in training, so an interval holds the GPU's busy time
    plus any idle gap left by slow launches), read after one final synchronise. Elsewhere:
    the wall clock around each call."""
    if device.type == "cuda":
        events = [
            (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
            for _ in range(iters)
        ]
        for start, end in events:
            start.record()
            fn()
            end.record()
        torch.cuda.synchronize(device)
        return [start.elapsed_time(end) for start, end in events]
    out = []
    for _ in range(iters):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def median_ms(fn: Callable[[], object], cfg: ProbeConfig) -> float:
    """Median of ``cfg.iters`` timed calls after ``cfg.warmup`` untimed ones."""
    for _ in range(cfg.warmup):
        fn()
    if cfg.device.type == "cuda":
        torch.cuda.synchronize(cfg.device)
    return statistics.median(sample_ms(fn, cfg.iters, cfg.device))


def probe_part(
    scope: str, part: str, variants: list[Variant], cfg: ProbeConfig, *, seed: int = 0
) -> list[Row]:
    """Check every alternative equal to ``variants[0]`` (the current one), then time the equal
    ones. An alternative whose output or any gradient differs beyond the tolerance is not
    timed; one that raises is reported as failed."""
    tol = TOLERANCE[cfg.dtype]
    current = variants[0]
    with torch.no_grad():
        ref_out = current.forward()
    gen = torch.Generator(device=cfg.device).manual_seed(seed)
    gout = None
    if ref_out.dim():
        gout = torch.randn(
            ref_out.shape, generator=gen, device=cfg.device, dtype=ref_out.dtype
        ) / math.sqrt(ref_out.numel() / ref_out.shape[0])
    del ref_out
    ref_out = run_once(current, gout).detach()
    ref_grads = [g.detach().clone() for g in current.grads()]
    assert all(g is not None for g in ref_grads), f"{part}: a current gradient is missing"
    rows: list[Row] = []
    cur_ms: float | None = None
    for i, v in enumerate(variants):
        err_out = err_grad = None
        try:
            if i > 0:
                out = run_once(v, gout)
                grads = v.grads()
                err_out = rel_err(out, ref_out)
                if len(grads) != len(ref_grads) or any(g is None for g in grads):
                    raise AssertionError("gradients missing or misaligned")
                err_grad = max(
                    (rel_err(g, r) for g, r in zip(grads, ref_grads, strict=True)), default=0.0
                )
                del out, grads
                if not (err_out <= tol and err_grad <= tol):
                    rows.append(
                        Row(scope=scope, part=part, variant=v.name, ms=None, speedup=None,
                            err_out=err_out, err_grad=err_grad,
                            status="NOT EQUAL (not timed)", note=v.note)
                    )  # fmt: skip
                    continue
            else:
                err_out = err_grad = 0.0
            ms = median_ms(lambda v=v: run_once(v, gout), cfg)
        except Exception as exc:
            msg = str(exc).strip().splitlines()[0][:80] if str(exc).strip() else type(exc).__name__
            rows.append(
                Row(scope=scope, part=part, variant=v.name, ms=None, speedup=None,
                    err_out=err_out, err_grad=err_grad, status=f"failed: {msg}", note=v.note)
            )  # fmt: skip
            continue
        if i == 0:
            cur_ms = ms
        speedup = cur_ms / ms if cur_ms is not None and ms > 0 else None
        rows.append(
            Row(scope=scope, part=part, variant=v.name, ms=ms, speedup=speedup, err_out=err_out,
                err_grad=err_grad, status="timed", note=v.note)
        )  # fmt: skip
    for t in current.leaves:
        t.grad = None
    return rows


def unsupported(scope: str, part: str, name: str, why: str) -> Row:
    """A row for an alternative this torch or device cannot run."""
    return Row(
        scope=scope, part=part, variant=name, ms=None, speedup=None, err_out=None,
        err_grad=None, status=f"unsupported: {why}",
    )  # fmt: skip


# ----- the probe ----------------------------------------------------------------------------


def _leaf(shape: tuple[int, ...], cfg: ProbeConfig, gen: torch.Generator) -> torch.Tensor:
    t = torch.randn(shape, generator=gen, device=cfg.device, dtype=torch.float32)
    return t.to(cfg.dtype).requires_grad_(True)


def _params(mod: torch.nn.Module) -> list[torch.Tensor]:
    return list(mod.parameters())


def _grads(ts: list[torch.Tensor]) -> Callable[[], list[torch.Tensor]]:
    return lambda: [t.grad for t in ts]  # type: ignore[misc]


Emit = Callable[[list["Row"]], None] | None
"""Called with each group of rows as soon as it is measured (to print as the probe goes)."""


def _emitted(emit: Emit, rows: list[Row]) -> list[Row]:
    if emit is not None:
        emit(rows)
    return rows


def probe_block_parts(
    cfg: ProbeConfig, block: TransformerBlock, rope_SD2: torch.Tensor, emit: Emit = None
) -> list[Row]:
    """Rows for norm, rope, rope_table, attention, mlp and the whole block (each part's rows
    go to ``emit`` as soon as they are measured)."""
    spec = cfg.spec
    B, S, H = cfg.batch, cfg.seq, spec.hidden
    N, Nkv, D = spec.heads, spec.n_kv_heads, spec.d_head
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed + 1)
    rows: list[Row] = []
    cuda = cfg.device.type == "cuda"

    # norm
    x = _leaf((B, S, H), cfg, gen)
    norm = block.attention_norm
    assert isinstance(norm, RMSNorm)
    w = norm.weight
    leaves = [x, *_params(norm)]
    g = _grads(leaves)
    rows += _emitted(emit, probe_part("part", "norm", [
        Variant(name="current", forward=lambda: norm(x), grads=g, leaves=leaves),
        Variant(name="F.rms_norm(weight)", forward=lambda: F.rms_norm(x, (H,), w, norm.eps),
                grads=g, leaves=leaves, note="one fused kernel each way (CUDA, torch >= 2.6)"),
        Variant(name="F.rms_norm * weight",
                forward=lambda: F.rms_norm(x, (H,), None, norm.eps) * w, grads=g, leaves=leaves,
                note="same rounding as current (normalise, cast, then scale)"),
    ], cfg))  # fmt: skip

    # rope (the table is built once per model forward: its cost is its own row)
    q, k = _leaf((B, S, N, D), cfg, gen), _leaf((B, S, Nkv, D), cfg, gen)
    leaves = [q, k]
    g = _grads(leaves)
    cis = freqs_cis(rope_SD2)
    cos, sin = cos_sin_expanded(rope_SD2)

    def rope_cat(fn: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], torch.Tensor]:
        return lambda: torch.cat((fn(q).flatten(2), fn(k).flatten(2)), dim=-1)

    rows += _emitted(emit, probe_part("part", "rope", [
        Variant(name="current", forward=rope_cat(lambda t: apply_rope(t, rope_SD2)), grads=g,
                leaves=leaves),
        Variant(name="complex (cached freqs_cis)",
                forward=rope_cat(lambda t: apply_rope_complex(t, cis)), grads=g, leaves=leaves,
                note="torchtitan's view_as_complex rotation"),
        Variant(name="cached cos/sin [S,1,D]",
                forward=rope_cat(lambda t: apply_rope_cached(t, cos, sin)), grads=g,
                leaves=leaves, note="no per-call slicing of the table"),
    ], cfg))  # fmt: skip
    positions = torch.arange(S, device=cfg.device)
    table_ms = median_ms(lambda: reference_rope_table(positions, D, spec.rope_theta), cfg)
    rows += _emitted(emit, [
        Row(scope="part", part="rope_table", variant="current (forward only, once per step)",
            ms=table_ms, speedup=None, err_out=0.0, err_grad=0.0, status="timed",
            note="rebuilt by every Transformer.forward; a cached buffer costs 0")
    ])  # fmt: skip

    # attention core (inputs as the projections give them: B S N D views)
    qa, ka = _leaf((B, S, N, D), cfg, gen), _leaf((B, S, Nkv, D), cfg, gen)
    va = _leaf((B, S, Nkv, D), cfg, gen)
    leaves = [qa, ka, va]
    g = _grads(leaves)
    att: list[Variant] = [
        Variant(name="current", forward=lambda: sdpa_current(qa, ka, va), grads=g, leaves=leaves),
        Variant(name="contiguous q/k/v", forward=lambda: sdpa_contiguous(qa, ka, va), grads=g,
                leaves=leaves, note="B N S D copies before SDPA"),
    ]  # fmt: skip
    extra_rows: list[Row] = []
    if Nkv != N:
        if has_enable_gqa():
            att.append(
                Variant(name="enable_gqa=True", forward=lambda: sdpa_native_gqa(qa, ka, va),
                        grads=g, leaves=leaves, note="no repeat_interleave of K/V")
            )  # fmt: skip
        else:
            extra_rows.append(unsupported("part", "attention", "enable_gqa=True", "torch < 2.5"))
    if cuda:
        from torch.nn.attention import SDPBackend, sdpa_kernel

        for name, backend in (
            ("flash backend", SDPBackend.FLASH_ATTENTION),
            ("cudnn backend", SDPBackend.CUDNN_ATTENTION),
            ("efficient backend", SDPBackend.EFFICIENT_ATTENTION),
        ):

            def with_backend(b: SDPBackend = backend) -> torch.Tensor:
                with sdpa_kernel(b):
                    return sdpa_current(qa, ka, va)

            att.append(Variant(name=name, forward=with_backend, grads=g, leaves=leaves,
                               note="SDPA backend forced"))  # fmt: skip
    else:
        extra_rows.append(unsupported("part", "attention", "flash/cudnn backends", "CUDA only"))
    rows += _emitted(emit, probe_part("part", "attention", att, cfg) + extra_rows)

    # MLP: separate w1/w3 vs one fused w13 (its gradient split back into w1, w3)
    ff = block.feed_forward
    assert ff is not None and ff.w3 is not None
    xm = _leaf((B, S, H), cfg, gen)
    w13 = torch.cat((ff.w1.weight, ff.w3.weight)).detach().requires_grad_(True)
    cur_leaves = [xm, ff.w1.weight, ff.w3.weight, ff.w2.weight]
    fused_leaves = [xm, w13, ff.w2.weight]

    def fused_mlp() -> torch.Tensor:
        gate, up = F.linear(xm, w13).chunk(2, dim=-1)
        return ff.w2(F.silu(gate) * up)

    def fused_grads() -> list[torch.Tensor]:
        assert w13.grad is not None
        g1, g3 = w13.grad.chunk(2, dim=0)
        return [xm.grad, g1, g3, ff.w2.weight.grad]  # type: ignore[list-item]

    rows += _emitted(emit, probe_part("part", "mlp", [
        Variant(name="current", forward=lambda: ff(xm), grads=_grads(cur_leaves),
                leaves=cur_leaves),
        Variant(name="fused w13", forward=fused_mlp, grads=fused_grads, leaves=fused_leaves,
                note="one [2F, H] matmul instead of two"),
    ], cfg))  # fmt: skip

    # whole block
    xb = _leaf((B, S, H), cfg, gen)
    leaves = [xb, *_params(block)]
    g = _grads(leaves)
    blk: list[Variant] = [
        Variant(name="current", forward=lambda: block(xb, rope_SD2), grads=g, leaves=leaves),
        Variant(name="all equivalent swaps", grads=g, leaves=leaves,
                forward=lambda: fast_block(block, xb, cis, has_enable_gqa()),
                note="F.rms_norm + complex rope + cached table (+ enable_gqa under GQA)"),
    ]  # fmt: skip
    graph_rows: list[Row] = []
    if cuda and cfg.cuda_graph:
        try:
            gblock = copy.deepcopy(block)
            gx = xb.detach().clone().requires_grad_(True)
            graphed = torch.cuda.make_graphed_callables(gblock, (gx, rope_SD2))
            gleaves = [xb, *_params(gblock)]
            blk.append(Variant(name="CUDA graph (current)", leaves=gleaves, grads=_grads(gleaves),
                               forward=lambda: graphed(xb, rope_SD2),
                               note="one launch each way; needs static shapes"))  # fmt: skip
        except Exception as exc:
            graph_rows.append(unsupported("block", "block", "CUDA graph (current)", str(exc)[:60]))
    elif not cuda:
        graph_rows.append(unsupported("block", "block", "CUDA graph (current)", "CUDA only"))
    rows += _emitted(emit, probe_part("block", "block", blk, cfg) + graph_rows)
    return rows


def probe_loss(cfg: ProbeConfig) -> list[Row]:
    """Cross-entropy on fp32 logits (current) vs on the logits' dtype."""
    spec = cfg.spec
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed + 2)
    logits = _leaf((cfg.batch, cfg.seq, spec.vocab_size), cfg, gen)
    labels = torch.randint(0, spec.vocab_size, (cfg.batch * cfg.seq,), generator=gen,
                           device=cfg.device)  # fmt: skip
    leaves = [logits]
    g = _grads(leaves)
    return probe_part("part", "loss", [
        Variant(name="current", grads=g, leaves=leaves,
                forward=lambda: F.cross_entropy(logits.flatten(0, 1).float(), labels)),
        Variant(name="no fp32 upcast", grads=g, leaves=leaves,
                forward=lambda: F.cross_entropy(logits.flatten(0, 1), labels),
                note="no [B*S, V] fp32 copy of the logits"),
    ], cfg)  # fmt: skip


def probe_model(cfg: ProbeConfig, model: torch.nn.Module) -> list[Row]:
    """Forward + backward of the whole model with its loss: current vs every swap."""
    spec = cfg.spec
    gen = torch.Generator(device=cfg.device).manual_seed(cfg.seed + 3)
    tokens = torch.randint(0, spec.vocab_size, (cfg.batch, cfg.seq), generator=gen,
                           device=cfg.device)  # fmt: skip
    labels = torch.randint(0, spec.vocab_size, (cfg.batch * cfg.seq,), generator=gen,
                           device=cfg.device)  # fmt: skip
    params = _params(model)
    g = _grads(params)
    positions = torch.arange(cfg.seq, device=cfg.device)
    rope = model.rope(positions)
    assert rope is not None
    cis = freqs_cis(rope)

    def current() -> torch.Tensor:
        return F.cross_entropy(model(tokens).flatten(0, 1).float(), labels)

    def swapped() -> torch.Tensor:
        h = model.tok_embeddings(tokens)
        for layer in model.layers:
            h = fast_block(layer, h, cis, has_enable_gqa())
        norm = model.norm
        h = F.rms_norm(h, (spec.hidden,), norm.weight, norm.eps)
        return F.cross_entropy(model.output(h).flatten(0, 1).float(), labels)

    rows = probe_part("model", "model", [
        Variant(name="current", forward=current, grads=g, leaves=params),
        Variant(name="all equivalent swaps", forward=swapped, grads=g, leaves=params,
                note="every block swapped, rope table cached"),
    ], cfg)  # fmt: skip
    flops = training_flops_per_token(spec, cfg.seq)
    peak = None
    if cfg.device.type == "cuda":
        from parlab.hardware.catalog import peak_flops

        peak = peak_flops(torch.cuda.get_device_name(cfg.device), "bf16")
    out = []
    for r in rows:
        extra: dict[str, float | None] = {}
        if r.ms:
            tps = cfg.batch * cfg.seq / (r.ms / 1e3)
            extra = {"tokens_per_s": tps, "mfu": tps * flops / peak if peak else None}
        out.append(Row(**{**asdict(r), "extra": extra}))
    return out


def check_spec(spec: ModelSpec) -> None:
    """A ``ValueError`` unless ``spec`` is a dense Llama-style model (what the probe covers)."""
    if spec.position != "rope" or spec.norm != "rmsnorm" or spec.activation != "swiglu":
        raise ValueError(f"{spec.name}: the probe covers Llama-style models (rope, rmsnorm, "
                         "swiglu); use e.g. --model 1.3b")  # fmt: skip
    if spec.mla is not None or spec.moe is not None:
        raise ValueError(f"{spec.name}: MLA/MoE blocks are not probed; use a dense Llama preset")


def probe_gate(cfg: ProbeConfig) -> list[Row]:
    """The gate itself (``--check-gate``): an RMSNorm against itself, against one whose output
    is 1 % off, one whose output is right but whose input gradient is 1 % off, and one that
    raises; only the first may be timed (scope ``gate``)."""
    x = torch.randn(4, 32, device=cfg.device, dtype=cfg.dtype, requires_grad=True)
    w = torch.ones(32, device=cfg.device, dtype=cfg.dtype, requires_grad=True)

    def current() -> torch.Tensor:
        return F.rms_norm(x, (32,), w, 1e-5)

    def wrong_grad() -> torch.Tensor:  # the same output, the gradient of x scaled by 1.01
        y = current()
        return y + 0.01 * (y - y.detach())

    kw = {"grads": lambda: [x.grad, w.grad], "leaves": [x, w]}
    return probe_part("gate", "norm", [
        Variant(name="current", forward=current, **kw),
        Variant(name="off output", forward=lambda: current() * 1.01, **kw),
        Variant(name="off gradient", forward=wrong_grad, **kw),
        Variant(name="raises", forward=lambda: x @ w[:3], **kw),
    ], cfg)  # fmt: skip


def run_probe(cfg: ProbeConfig, emit: Emit = None) -> list[Row]:
    """Every row of the probe for ``cfg`` (the model is built here, seeded); ``emit`` gets
    each group of rows as soon as it is measured."""
    spec = cfg.spec
    check_spec(spec)
    torch.manual_seed(cfg.seed)
    if cfg.whole_model:
        model = build_model(spec, device=cfg.device, dtype=cfg.dtype, seed=cfg.seed)
        block = model.layers[0]
    else:
        model = None
        block = build_model(spec.replace(layers=1), device=cfg.device, dtype=cfg.dtype,
                            seed=cfg.seed).layers[0]  # fmt: skip
    assert isinstance(block, TransformerBlock)
    rope = reference_rope_table(torch.arange(cfg.seq, device=cfg.device), spec.d_head,
                                spec.rope_theta)  # fmt: skip
    rows = _emitted(emit, probe_gate(cfg)) if cfg.check_gate else []
    rows += probe_block_parts(cfg, block, rope, emit)
    rows += _emitted(emit, probe_loss(cfg))
    if model is not None:
        rows += _emitted(emit, probe_model(cfg, model))
    return rows


# ----- output -------------------------------------------------------------------------------


def header(cfg: ProbeConfig) -> str:
    """Versions, devices and the probed shape."""
    cuda = torch.version.cuda or "-"
    devs = (
        [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        if torch.cuda.is_available()
        else ["cpu"]
    )
    s = cfg.spec
    return "\n".join([
        f"python {platform.python_version()}  torch {torch.__version__}  CUDA {cuda}  "
        f"devices: {', '.join(devs)}  (probing on {cfg.device})",
        f"model {s.name}: hidden {s.hidden}, layers {s.layers}, heads {s.heads} "
        f"(kv {s.n_kv_heads}), ffn {s.ffn_hidden}, vocab {s.vocab_size}; micro-batch "
        f"{cfg.batch} x {cfg.seq}, {str(cfg.dtype).removeprefix('torch.')}; forward+backward, "
        f"median of {cfg.iters} after {cfg.warmup} warm-up; tolerance {TOLERANCE[cfg.dtype]:g}; "
        "model MFU counts forward+backward only (no optimizer, no communication)",
        "evidence: " + ("measured on " + devs[0] if cfg.device.type == "cuda" else "cpu-mechanism"
                        " (CPU timings say nothing about GPU speed)"),
    ])  # fmt: skip


def _f(v: float | None, fmt: str) -> str:
    return "-" if v is None else format(v, fmt)


def format_table(rows: list[Row]) -> str:
    """The rows as a fixed-width table (scope, part, variant, ms, speed-up, errors, status)."""
    return "\n".join([TABLE_HEADER, *format_rows(rows)])


TABLE_HEADER = (
    f"{'scope':<6} {'part':<10} {'variant':<38} {'ms':>9} {'x cur':>6} {'err out':>9} "
    f"{'err grad':>9} {'tok/s':>9} {'MFU':>6}  status / note"
)
"""The table's column names."""


def format_rows(rows: list[Row]) -> list[str]:
    """One fixed-width line per row, under ``TABLE_HEADER``."""
    lines = []
    for r in rows:
        tps = r.extra.get("tokens_per_s")
        mfu = r.extra.get("mfu")
        tail = r.status + (f"  ({r.note})" if r.note else "")
        lines.append(
            f"{r.scope:<6} {r.part:<10} {r.variant[:38]:<38} {_f(r.ms, '.3f'):>9} "
            f"{_f(r.speedup, '.2f'):>6} {_f(r.err_out, '.1e'):>9} {_f(r.err_grad, '.1e'):>9} "
            f"{_f(tps, ',.0f'):>9} {_f(None if mfu is None else 100 * mfu, '.1f'):>6}  {tail}"
        )
    return lines


DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def config_from_args(args: argparse.Namespace) -> ProbeConfig:
    """The probe configuration for the command line (tiny on CPU unless sizes are given)."""
    cuda = torch.cuda.is_available() and args.device != "cpu"
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    spec = get_spec(args.model)
    check_spec(spec)
    tiny = args.tiny or not cuda
    if tiny:
        spec = spec.replace(hidden=64, layers=2, heads=4, ffn_hidden=160, vocab_size=256,
                            max_seq_len=64)  # fmt: skip
    if args.gqa_kv_heads is not None:
        spec = spec.replace(kv_heads=args.gqa_kv_heads)
    batch = args.batch or 2
    seq = args.seq or (32 if tiny else spec.max_seq_len)
    dtype = DTYPES[args.dtype] if args.dtype else (torch.bfloat16 if cuda else torch.float32)
    iters = args.iters or (5 if tiny else 10)
    warmup = args.warmup if args.warmup is not None else (1 if tiny else 3)
    return ProbeConfig(spec=spec, batch=batch, seq=seq, dtype=dtype, device=device, iters=iters,
                       warmup=warmup, whole_model=not args.no_model,
                       cuda_graph=not args.no_cuda_graph, check_gate=args.check_gate)  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="1.3b", help="dense Llama-style preset (default 1.3b)")
    p.add_argument("--tiny", action="store_true", help="a tiny model (the default on CPU)")
    p.add_argument("--device", choices=("auto", "cpu"), default="auto")
    p.add_argument("--batch", type=int, help="micro-batch (default 2)")
    p.add_argument("--seq", type=int, help="sequence (default the preset's, 32 when tiny)")
    p.add_argument("--dtype", choices=tuple(DTYPES), help="default bf16 on CUDA, fp32 on CPU")
    p.add_argument("--gqa-kv-heads", type=int, help="probe a GQA variant with this many K/V heads")
    p.add_argument("--iters", type=int, help="timed iterations (default 10, 5 when tiny)")
    p.add_argument("--warmup", type=int, help="warm-up iterations (default 3, 1 when tiny)")
    p.add_argument("--no-model", action="store_true", help="skip the whole-model rows")
    p.add_argument("--no-cuda-graph", action="store_true", help="skip the CUDA-graph row")
    p.add_argument("--json", type=Path, help="also write the rows as JSON here")
    p.add_argument("--check-gate", action="store_true",
                   help="first show the equality gate refusing alternatives known to be wrong")  # fmt: skip
    args = p.parse_args(argv)
    try:
        cfg = config_from_args(args)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(header(cfg), flush=True)
    print(TABLE_HEADER, flush=True)
    rows = run_probe(cfg, lambda group: print("\n".join(format_rows(group)), flush=True))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        doc = {"header": header(cfg), "tolerance": TOLERANCE[cfg.dtype],
               "rows": [asdict(r) for r in rows]}  # fmt: skip
        args.json.write_text(json.dumps(doc, indent=1) + "\n")
    refused = [r for r in rows if r.status.startswith("NOT EQUAL") and r.scope != "gate"]
    return 1 if refused else 0


if __name__ == "__main__":
    sys.exit(main())

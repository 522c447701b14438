"""Plain torch training scripts (FSDP2, DDP, pipelining) on parlab's model shapes: the baselines.

Why: issue 5 (training state) says parlab's FSDP run must reach at least what a plain FSDP2
script reaches on the same machine (about 47,000 tokens/s per GPU, MFU ~47% on the 1.3B
model, ~50% with ``torch.compile``, DDP ~43%), and issue 6 (model internal) that parlab's
PP2 must reach at least a plain ``torch.distributed.pipelining`` 1F1B run (about 47,000
tokens/s per GPU). Those numbers come from the issue author's machine; this script measures
the same plain recipes on the machine parlab runs on. It is a reference script, not a
parlab contract document: it writes a small JSON of its own.

What is plain here: the model (a compact torchtitan-style Llama: ``Transformer`` with
``tok_embeddings``, ``layers`` as an ``nn.ModuleDict`` of ``TransformerBlock`` (RMSNorm
through ``F.rms_norm``, ``Attention`` with complex ``freqs_cis`` RoPE and GQA through
``repeat_kv`` + ``F.scaled_dot_product_attention(is_causal=True)``, SwiGLU
``FeedForward``), ``norm``, ``output``), the training loop and every parallel wrapper are
written here with torch only. Nothing of parlab's mechanisms runs. From parlab it takes two
things: the shapes (``parlab.models.get_spec(--model)``: hidden, layers, heads, KV heads,
head dim, FFN width, vocabulary, norm eps, RoPE theta, tied embeddings), and the FLOPs/MFU
helpers (``parlab.models.flops``), so the MFU printed is counted the way parlab's documents
count it. The parameter names equal parlab's reference model's (``--save-weights``:
``tests/test_plain_references.py`` loads them into ``parlab.models.reference`` and compares
logits).

Modes (``--mode``):

- ``fsdp``: fp32 parameters; ``fully_shard`` on each ``TransformerBlock``, then on the root
  (embeddings, final norm, output), with ``MixedPrecisionPolicy(param_dtype=bf16,
  reduce_dtype=fp32)``; ``reshard_after_forward`` left at torch's default on both: blocks
  reshard after forward, the root does not (in torch 2.13 the default ``None`` resolves to
  True, and to False for the root at lazy init: its parameters would be all-gathered again
  at once for backward; torchtitan passes ``reshard_after_forward=not pp_enabled`` to the
  root, the same here). ``--compile``: ``torch.compile`` each block (``fullgraph=True``)
  before ``fully_shard``, as torchtitan does (inductor warns that it leaves the complex
  RoPE multiply to eager kernels, as it does in torchtitan's Llama).
- ``ddp``: fp32 parameters, ``DistributedDataParallel`` with the default bucket size
  (``broadcast_buffers=False``: the only buffer, the RoPE table, is the same everywhere),
  forward under ``torch.autocast("cuda", dtype=torch.bfloat16)``.
- ``pp``: ``torch.distributed.pipelining`` with bf16 parameters (initialised in fp32 like
  the other modes, then cast before the optimizer is made), split by hand into stages of
  equal layer counts (first stage: embeddings + its layers; last: its layers + final norm +
  output), one ``PipelineStage`` each.
  ``--schedule 1f1b`` (``Schedule1F1B``, default), ``gpipe`` (``ScheduleGPipe``) or
  ``interleaved`` (``ScheduleInterleaved1F1B`` with two stages per rank: rank r holds
  stages r and r + world). ``--microbatches`` (default 8) micro-batches of
  ``--micro-batch`` x ``--seq`` per step (default 1 x 4096 for pp). One fused AdamW per
  rank over the parameters of its stage(s).

Every mode: AdamW(lr=1e-4, fused on CUDA), cross-entropy on fp32 logits (``logits.float()``),
weights initialised deterministically (seed 0; each parameter from its own generator seeded
by its name, so every mode and every pipeline stage holds the same weights), synthetic
tokens from ``torch.Generator().manual_seed(step)``: one global batch per step, the same in
every mode for the same number of rows (fsdp/ddp: rank r takes rows r*mb..(r+1)*mb of
world x micro-batch rows; pp: all microbatches x micro-batch rows go through the pipeline).

Timing: ``--warmup`` untimed steps, then ``--steps`` timed ones between two
``torch.cuda.synchronize()``; step time = the slowest rank's (all_reduce MAX) elapsed time
over the timed steps / steps. Per-step times (``step_times_s``, CUDA events between step
ends, no extra synchronisation; max over ranks per step) are reported beside it with their
median. Tokens/s per GPU = tokens per step over all GPUs / step time / world size:

- fsdp, ddp: each rank trains micro-batch x seq tokens a step, so world x micro-batch x seq
  tokens per step in all, i.e. micro-batch x seq / step time per GPU;
- pp: a step trains the global batch microbatches x micro-batch x seq once, through the
  pipeline, so per GPU = microbatches x micro-batch x seq / world / step time (parlab's
  PP documents divide the same way).

MFU = tokens/s per GPU x FLOPs per token / the device's dense bf16 peak in parlab's
hardware catalog (``parlab.models.flops.mfu_for``), with FLOPs per token = ``6 N + 12 L H Q
T`` (``parlab.models.flops.training_flops_per_token``, as ``parlab.projects.training_state``
and ``parlab.projects.model_internal`` compute it: N the non-embedding parameters with the
untied output, L layers, H heads, Q head dim, T = seq). Peak memory:
``torch.cuda.max_memory_allocated``, max over ranks, reset after the model is built and
wrapped (so the fp32 full model built before sharding does not count).

    torchrun --nproc-per-node 2 benchmarks/plain_references.py --mode fsdp [--compile]
    torchrun --nproc-per-node 2 benchmarks/plain_references.py --mode ddp
    torchrun --nproc-per-node 2 benchmarks/plain_references.py --mode pp --schedule 1f1b

(with ``PYTHONPATH=src``; ``--json PATH`` writes the result; ``scripts/gpu/plain_references.sh``
runs all six). Without CUDA it runs on gloo CPU ranks with the ``tiny`` model, fp32
everywhere (no autocast, no fused AdamW), seq 64: a dry run whose times say nothing about
a GPU; the CPU test checks that the first two losses of every mode are those of one
process training the same model on the same global batch.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import statistics
import time
import warnings
import zlib
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

INIT_STD = 0.02
SCHEDULES = ("1f1b", "gpipe", "interleaved")
FORMULA = (
    "flops_per_token = 6 N + 12 L H Q T (parlab.models.flops.training_flops_per_token: N "
    "non-embedding params incl. the untied output, L layers, H heads, Q head dim, T seq); "
    "mfu = tokens/s per GPU x flops_per_token / dense bf16 peak of the device "
    "(parlab.models.flops.mfu_for, parlab.hardware.catalog)"
)


# ----- the model (torchtitan's Llama, compact) --------------------------------------------------


@dataclass
class ModelArgs:
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    norm_eps: float
    rope_theta: float
    tied_embeddings: bool

    @classmethod
    def from_parlab(cls, name: str) -> ModelArgs:
        """The dimensions of parlab's preset ``name`` (Llama-style specs only)."""
        from parlab.models import get_spec

        s = get_spec(name)
        plain = (
            s.activation == "swiglu"
            and s.norm == "rmsnorm"
            and s.position == "rope"
            and s.mla is None
            and s.moe is None
            and not (s.qkv_bias or s.linear_bias)
        )
        if not plain:
            raise SystemExit(f"model {name!r}: only Llama-style specs (RMSNorm, RoPE, SwiGLU)")
        return cls(
            dim=s.hidden,
            n_layers=s.layers,
            n_heads=s.heads,
            n_kv_heads=s.n_kv_heads,
            head_dim=s.d_head,
            ffn_dim=s.ffn_hidden,
            vocab_size=s.vocab_size,
            norm_eps=s.norm_eps,
            rope_theta=s.rope_theta,
            tied_embeddings=s.tied_embeddings,
        )


def precompute_freqs_cis(head_dim: int, end: int, theta: float) -> torch.Tensor:
    """``[end, head_dim // 2]`` complex64 rotations (Meta's/torchtitan's interleaved RoPE)."""
    freqs = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    angles = torch.outer(torch.arange(end, dtype=torch.float32), freqs)
    return torch.polar(torch.ones_like(angles), angles)


def apply_rotary_emb(
    xq: torch.Tensor, xk: torch.Tensor, freqs_cis: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    xq_ = torch.view_as_complex(xq.float().reshape(*xq.shape[:-1], -1, 2))
    xk_ = torch.view_as_complex(xk.float().reshape(*xk.shape[:-1], -1, 2))
    f = freqs_cis.view(1, xq_.shape[1], 1, xq_.shape[-1])
    xq_out = torch.view_as_real(xq_ * f).flatten(3)
    xk_out = torch.view_as_real(xk_ * f).flatten(3)
    return xq_out.type_as(xq), xk_out.type_as(xk)


def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """``[B, S, n_kv, D] -> [B, S, n_kv * n_rep, D]``."""
    if n_rep == 1:
        return x
    b, s, n, d = x.shape
    return x[:, :, :, None, :].expand(b, s, n, n_rep, d).reshape(b, s, n * n_rep, d)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x, self.weight.shape, self.weight, self.eps)


class Attention(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = a.n_heads, a.n_kv_heads, a.head_dim
        self.wq = nn.Linear(a.dim, a.n_heads * a.head_dim, bias=False)
        self.wk = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wv = nn.Linear(a.dim, a.n_kv_heads * a.head_dim, bias=False)
        self.wo = nn.Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        bs, seqlen, _ = x.shape
        xq = self.wq(x).view(bs, seqlen, -1, self.head_dim)
        xk = self.wk(x).view(bs, seqlen, -1, self.head_dim)
        xv = self.wv(x).view(bs, seqlen, -1, self.head_dim)
        xq, xk = apply_rotary_emb(xq, xk, freqs_cis)
        n_rep = self.n_heads // self.n_kv_heads
        keys, values = repeat_kv(xk, n_rep), repeat_kv(xv, n_rep)
        xq, keys, values = (t.transpose(1, 2) for t in (xq, keys, values))
        out = F.scaled_dot_product_attention(xq, keys, values, is_causal=True)
        return self.wo(out.transpose(1, 2).reshape(bs, seqlen, -1))


class FeedForward(nn.Module):
    def __init__(self, dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.w1 = nn.Linear(dim, hidden_dim, bias=False)
        self.w2 = nn.Linear(hidden_dim, dim, bias=False)
        self.w3 = nn.Linear(dim, hidden_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    def __init__(self, a: ModelArgs) -> None:
        super().__init__()
        self.attention_norm = RMSNorm(a.dim, a.norm_eps)
        self.attention = Attention(a)
        self.ffn_norm = RMSNorm(a.dim, a.norm_eps)
        self.feed_forward = FeedForward(a.dim, a.ffn_dim)

    def forward(self, x: torch.Tensor, freqs_cis: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """Tokens -> logits; a pipeline stage deletes what it does not hold (``None`` modules,
    missing ``layers`` keys), so parameter names stay those of the whole model."""

    def __init__(self, a: ModelArgs, max_seq_len: int) -> None:
        super().__init__()
        self.args, self.max_seq_len = a, max_seq_len
        self.tok_embeddings: nn.Embedding | None = nn.Embedding(a.vocab_size, a.dim)
        self.layers = nn.ModuleDict({str(i): TransformerBlock(a) for i in range(a.n_layers)})
        self.norm: RMSNorm | None = RMSNorm(a.dim, a.norm_eps)
        self.output: nn.Linear | None = nn.Linear(a.dim, a.vocab_size, bias=False)
        if a.tied_embeddings:
            self.output.weight = self.tok_embeddings.weight
        self.register_buffer(
            "freqs_cis", precompute_freqs_cis(a.head_dim, max_seq_len, a.rope_theta), False
        )

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(tokens) if self.tok_embeddings is not None else tokens
        freqs_cis = self.freqs_cis[: h.shape[1]]
        for layer in self.layers.values():
            h = layer(h, freqs_cis)
        h = self.norm(h) if self.norm is not None else h
        return self.output(h) if self.output is not None else h

    @torch.no_grad()
    def init_weights(self, seed: int = 0) -> None:
        """normal(0, 0.02) weights (``wo``/``w2``: 0.02 / sqrt(2 layers)), unit norms; each
        parameter drawn from a generator seeded by ``seed`` and its name, so any subset of
        the model (a pipeline stage) gets the weights the whole model would."""
        out_std = INIT_STD / math.sqrt(2 * self.args.n_layers)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
                continue
            g = torch.Generator(device=p.device)
            g.manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
            std = out_std if name.endswith(("wo.weight", "w2.weight")) else INIT_STD
            nn.init.normal_(p, 0.0, std, generator=g)
        self.init_rope()

    def init_rope(self) -> None:
        """(Re)compute the complex RoPE table on the module's device."""
        device = self.freqs_cis.device
        a = self.args
        self.freqs_cis = precompute_freqs_cis(a.head_dim, self.max_seq_len, a.rope_theta).to(device)


def build_model(
    a: ModelArgs,
    max_seq_len: int,
    device: torch.device,
    *,
    layers: range | None = None,
    first: bool = True,
    last: bool = True,
    seed: int = 0,
) -> Transformer:
    """The model (or one pipeline stage: ``layers``, with the embeddings when ``first`` and
    the final norm and output when ``last``) on ``device`` in fp32, initialised from ``seed``."""
    # built on the device itself, then pruned (a meta-device build + ``to_empty`` made gloo
    # CPU ranks abort at exit now and then, "terminate called without an active exception")
    with torch.device(device):
        model = Transformer(a, max_seq_len)
    if layers is not None:
        for i in range(a.n_layers):
            if i not in layers:
                del model.layers[str(i)]
    if not first:
        model.tok_embeddings = None
    if not last:
        model.norm, model.output = None, None
    model.init_weights(seed)
    return model


def make_batch(step: int, rows: int, seq: int, vocab: int) -> torch.Tensor:
    """The global batch of ``step``: ``[rows, seq + 1]`` tokens (inputs and shifted targets)."""
    g = torch.Generator().manual_seed(step)
    return torch.randint(0, vocab, (rows, seq + 1), generator=g)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())


# ----- the three recipes ---------------------------------------------------------------------


@dataclass
class Config:
    mode: str
    model: str
    micro_batch: int
    seq: int
    microbatches: int
    schedule: str
    compile: bool
    warmup: int
    steps: int
    lr: float
    precision: str


def _optimizer(params: Any, dev: torch.device, lr: float) -> torch.optim.Optimizer:
    return torch.optim.AdamW(params, lr=lr, fused=dev.type == "cuda")


def _compile_blocks(model: Transformer) -> None:
    for layer_id, block in list(model.layers.items()):
        model.layers.register_module(layer_id, torch.compile(block, fullgraph=True))


def setup_data_parallel(
    cfg: Config, a: ModelArgs, dev: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """fsdp or ddp: a function training one step on this rank's rows, returning its loss."""
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model(a, cfg.seq, dev)
    if cfg.compile:
        _compile_blocks(model)
    autocast: Any = contextlib.nullcontext
    if cfg.mode == "fsdp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        mesh = init_device_mesh(dev.type, (world,))
        if dev.type == "cuda":
            mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        else:
            mp = MixedPrecisionPolicy()  # CPU: fp32 everywhere
        for block in model.layers.values():
            fully_shard(block, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
        net: nn.Module = model
    else:
        from torch.nn.parallel import DistributedDataParallel

        ids = [dev.index] if dev.type == "cuda" else None
        with warnings.catch_warnings():  # torch 2.13 renames it; the old one still works
            warnings.filterwarnings("ignore", message=".*broadcast_buffers.*deprecated")
            net = DistributedDataParallel(model, device_ids=ids, broadcast_buffers=False)
        if dev.type == "cuda":

            def autocast() -> Any:
                return torch.autocast("cuda", dtype=torch.bfloat16)

    opt = _optimizer(net.parameters(), dev, cfg.lr)
    lo, hi = rank * cfg.micro_batch, (rank + 1) * cfg.micro_batch

    def step(batch: torch.Tensor) -> torch.Tensor:
        mine = batch[lo:hi]
        with autocast():
            logits = net(mine[:, :-1])
        loss = loss_fn(logits, mine[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss.detach()

    return step


def setup_pipeline(
    cfg: Config, a: ModelArgs, dev: torch.device
) -> Callable[[torch.Tensor], torch.Tensor]:
    """pp: a function training one step of the whole global batch through the pipeline; it
    returns the mean micro-batch loss on the rank holding the last stage, 0 elsewhere."""
    from torch.distributed.pipelining import (
        PipelineStage,
        Schedule1F1B,
        ScheduleGPipe,
        ScheduleInterleaved1F1B,
    )

    rank, world = dist.get_rank(), dist.get_world_size()
    per_rank = 2 if cfg.schedule == "interleaved" else 1
    n_stages = world * per_rank
    if a.n_layers % n_stages:
        raise SystemExit(f"{a.n_layers} layers do not split into {n_stages} equal stages")
    if a.tied_embeddings:
        raise SystemExit("pp: tied embeddings across stages are not supported here")
    per_stage = a.n_layers // n_stages
    dtype = torch.bfloat16 if dev.type == "cuda" else torch.float32
    stages, modules = [], []
    for s in (rank + k * world for k in range(per_rank)):
        m = build_model(
            a,
            cfg.seq,
            dev,
            layers=range(s * per_stage, (s + 1) * per_stage),
            first=s == 0,
            last=s == n_stages - 1,
        )
        for p in m.parameters():  # parameters only: the RoPE table stays complex64
            p.data = p.data.to(dtype)
        if cfg.compile:
            _compile_blocks(m)
        modules.append(m)
        stages.append(PipelineStage(m, s, n_stages, dev))
    if cfg.schedule == "interleaved":
        schedule: Any = ScheduleInterleaved1F1B(stages, cfg.microbatches, loss_fn=loss_fn)
    else:
        cls = Schedule1F1B if cfg.schedule == "1f1b" else ScheduleGPipe
        schedule = cls(stages[0], cfg.microbatches, loss_fn=loss_fn)
    opt = _optimizer([p for m in modules for p in m.parameters()], dev, cfg.lr)
    first, last = rank == 0, any(st.is_last for st in stages)

    def step(batch: torch.Tensor) -> torch.Tensor:
        losses: list[torch.Tensor] = []
        if first:
            schedule.step(batch[:, :-1])
        elif last:
            schedule.step(target=batch[:, 1:], losses=losses)
        else:
            schedule.step()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if last:
            return torch.stack([x.detach().float() for x in losses]).mean()
        return torch.zeros((), device=dev)

    return step


# ----- the run ---------------------------------------------------------------------------------


def rows_per_step(cfg: Config, world: int) -> int:
    """Sequences in one step's global batch."""
    if cfg.mode == "pp":
        return cfg.microbatches * cfg.micro_batch
    return world * cfg.micro_batch


def run(cfg: Config, dev: torch.device) -> dict[str, Any]:
    from parlab.models import get_spec
    from parlab.models.flops import mfu_for, training_flops_per_token

    world = dist.get_world_size()
    a = ModelArgs.from_parlab(cfg.model)
    setup = setup_pipeline if cfg.mode == "pp" else setup_data_parallel
    step = setup(cfg, a, dev)
    rows = rows_per_step(cfg, world)
    batches = [
        make_batch(i, rows, cfg.seq, a.vocab_size).to(dev) for i in range(cfg.warmup + cfg.steps)
    ]
    cuda = dev.type == "cuda"
    if cuda:
        torch.cuda.synchronize(dev)
        torch.cuda.reset_peak_memory_stats(dev)
    losses = [step(b) for b in batches[: cfg.warmup]]
    if cuda:
        torch.cuda.synchronize(dev)
        marks: list[Any] = [torch.cuda.Event(enable_timing=True) for _ in range(cfg.steps + 1)]
        marks[0].record()
    else:
        marks = [time.perf_counter()]
    t0 = time.perf_counter()
    for i, b in enumerate(batches[cfg.warmup :]):
        losses.append(step(b))
        if cuda:
            marks[i + 1].record()
        else:
            marks.append(time.perf_counter())
    if cuda:
        torch.cuda.synchronize(dev)
    elapsed = time.perf_counter() - t0
    if cuda:
        per_step = [marks[i].elapsed_time(marks[i + 1]) / 1e3 for i in range(cfg.steps)]
    else:
        per_step = [marks[i + 1] - marks[i] for i in range(cfg.steps)]
    peak = float(torch.cuda.max_memory_allocated(dev)) if cuda else 0.0
    # the slowest rank's times (MAX); peaks gathered; losses summed (see below)
    times = torch.tensor([elapsed, *per_step], dtype=torch.float64, device=dev)
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    peaks = [torch.zeros(1, dtype=torch.float64, device=dev) for _ in range(world)]
    dist.all_gather(peaks, torch.tensor([peak], dtype=torch.float64, device=dev))
    loss_t = torch.stack([x.float() for x in losses]).to(torch.float64)
    dist.all_reduce(loss_t)
    # fsdp/ddp: each rank's loss is the mean over equal token counts -> the global mean is the
    # mean over ranks; pp: only the rank holding the last stage contributes (others add 0)
    loss_t = loss_t / (1 if cfg.mode == "pp" else world)
    step_s = float(times[0]) / cfg.steps
    step_times = [float(t) for t in times[1:]]
    tokens_per_step = rows * cfg.seq
    tps = tokens_per_step / step_s / world
    spec = get_spec(cfg.model)
    device_name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    fpt = training_flops_per_token(spec, cfg.seq)
    mfu = mfu_for(spec, seq_len=cfg.seq, tokens_per_s=tps * world, gpus=world, gpu=device_name)
    return {
        "mode": cfg.mode,
        "config": asdict(cfg),
        "torch": torch.__version__,
        "nccl": nccl_version() if cuda else None,
        "device": device_name,
        "world_size": world,
        "step_s": step_s,
        "step_s_median": statistics.median(step_times),
        "step_times_s": step_times,
        "tokens_per_step": tokens_per_step,
        "tokens_per_s_per_gpu": tps,
        "mfu": mfu,
        "peak_memory_bytes": max(float(p) for p in peaks) if cuda else None,
        "peak_memory_bytes_per_rank": [float(p) for p in peaks] if cuda else None,
        "flops_per_token": fpt,
        "params": spec.num_params(),
        "losses": [float(x) for x in loss_t],
        "formula": FORMULA,
    }


def nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # a build without NCCL
        return None
    return ".".join(str(x) for x in v) if isinstance(v, tuple) else str(v)


def label(cfg: Config) -> str:
    name = f"pp-{cfg.schedule}" if cfg.mode == "pp" else cfg.mode
    return name + ("+compile" if cfg.compile else "")


def row(r: dict[str, Any]) -> str:
    c = r["config"]
    batch = (
        f"{c['microbatches']}x{c['micro_batch']}x{c['seq']}"
        if c["mode"] == "pp"
        else f"{c['micro_batch']}x{c['seq']}/rank"
    )
    mfu = "-" if r["mfu"] is None else f"{r['mfu']:.1%}"
    pk = "-" if r["peak_memory_bytes"] is None else f"{r['peak_memory_bytes'] / 2**30:.2f}"
    return (
        f"{label(Config(**c)):<18} {batch:<16} {r['step_s'] * 1e3:>9.1f} "
        f"{r['step_s_median'] * 1e3:>9.1f} {r['tokens_per_s_per_gpu']:>12,.0f} {mfu:>6} "
        f"{pk:>9} {r['losses'][0]:>8.4f} {r['losses'][-1]:>8.4f}"
    )


HEADER = (
    f"{'run':<18} {'batch':<16} {'step ms':>9} {'median':>9} {'tok/s/GPU':>12} {'MFU':>6} "
    f"{'peak GiB':>9} {'loss[0]':>8} {'loss[-1]':>8}"
)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mode", choices=("fsdp", "ddp", "pp"), required=True)
    ap.add_argument("--schedule", choices=SCHEDULES, default="1f1b", help="pp only")
    ap.add_argument("--model", default=None, help="parlab preset (1.3b on CUDA, tiny on CPU)")
    ap.add_argument("--micro-batch", type=int, default=None, help="2 (fsdp, ddp), 1 (pp)")
    ap.add_argument("--seq", type=int, default=None, help="4096 on CUDA, 64 on CPU")
    ap.add_argument("--microbatches", type=int, default=8, help="pp: micro-batches a step")
    ap.add_argument("--compile", action="store_true", help="torch.compile each block")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--json", default=None, help="write the result here (rank 0)")
    ap.add_argument(
        "--save-weights",
        default=None,
        help="rank 0 writes the model's initial weights, every step's batch and the untrained "
        "logits here (torch.save) before training: what a check against another model loads",
    )
    return ap.parse_args(argv)


def save_weights(cfg: Config, path: str, world: int) -> None:
    """The whole model's initial weights (every mode starts from them), every step's global
    batch and the untrained model's logits on each batch's inputs, on the CPU in fp32."""
    a = ModelArgs.from_parlab(cfg.model)
    model = build_model(a, cfg.seq, torch.device("cpu"))
    rows = rows_per_step(cfg, world)
    batches = [make_batch(i, rows, cfg.seq, a.vocab_size) for i in range(cfg.warmup + cfg.steps)]
    with torch.no_grad():
        logits = [model(b[:, :-1]) for b in batches]
    torch.save({"weights": model.state_dict(), "batches": batches, "logits": logits}, path)


def main(argv: list[str] | None = None) -> None:
    ns = parse(argv)
    cuda = torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    dev = torch.device("cuda", local) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(dev)
    dist.init_process_group("nccl" if cuda else "gloo", device_id=dev if cuda else None)
    cfg = Config(
        mode=ns.mode,
        model=ns.model or ("1.3b" if cuda else "tiny"),
        micro_batch=ns.micro_batch or (1 if ns.mode == "pp" else 2),
        seq=ns.seq or (4096 if cuda else 64),
        microbatches=ns.microbatches,
        schedule=ns.schedule if ns.mode == "pp" else "-",
        compile=ns.compile,
        warmup=ns.warmup,
        steps=ns.steps,
        lr=ns.lr,
        precision=("bf16 params" if ns.mode == "pp" else "fp32 params, bf16 compute")
        if cuda
        else "fp32",
    )
    rank0 = dist.get_rank() == 0
    if rank0:
        dev_name = torch.cuda.get_device_name(dev) if cuda else "cpu (gloo)"
        print(
            f"plain_references: torch {torch.__version__}, NCCL {nccl_version() if cuda else '-'}, "
            f"{dev_name}, world {dist.get_world_size()}\n"
            f"  {label(cfg)}: model {cfg.model}, micro-batch {cfg.micro_batch}, seq {cfg.seq}"
            + (f", {cfg.microbatches} micro-batches" if cfg.mode == "pp" else "")
            + f", {cfg.precision}, warmup {cfg.warmup}, steps {cfg.steps}, lr {cfg.lr}",
            flush=True,
        )
    if ns.save_weights and rank0:
        save_weights(cfg, ns.save_weights, dist.get_world_size())
    # a failure propagates without teardown (torchrun reports it; a barrier could hang)
    result = run(cfg, dev)
    if rank0:
        print(HEADER)
        print(row(result), flush=True)
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump(result, f, indent=1)
    dist.barrier()  # no rank tears the group down while another still uses it
    dist.destroy_process_group()


if __name__ == "__main__":
    main()

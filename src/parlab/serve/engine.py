"""The reference replica's engine: continuous batching over a KV cache, with prefix caching.

It runs parlab's reference model (``parlab.models.reference``, random weights)
with its own decode loop around the model's weights: per layer
``attention_norm`` -> ``attention.{wq,wk,wv}`` -> RoPE -> attention over the
cached keys/values -> ``attention.wo``, then ``ffn_norm`` -> the block's FFN
(or MoE) -- the same modules the model's full ``forward`` calls, so a test
keeps the engine's logits equal to the full forward's. MLA models are not
supported here.

Tokenizer: byte-level (token id = byte value, vocabulary >= 256); sampled
tokens are restricted to printable ASCII so each output token is one
character. No EOS: every request generates exactly ``max_tokens``.

KV cache: a slot pool per layer, ``k_cache[l]`` / ``v_cache[l]`` of shape
``[max_batch, n_kv_heads, max_len, head_dim]``; a running request owns one
slot. Prefix cache: the KV of every full block of ``block`` prompt tokens is
kept in a ``BlockLRU`` under its chained hash (``prefix.py``); a new prompt
copies its longest cached prefix into its slot and prefills only the rest
(at least its last token, to get the next-token logits).

Scheduling, one iteration at a time (the simulator models exactly this):
if requests are waiting and slots are free, a *prefill iteration* prefills
each admitted request in turn (each yields its first token); otherwise a
*decode iteration* advances every running request by one token in one
batched forward (attention masked to each request's length). Every
iteration's kind, size and duration is logged for the simulator's profile.

CUDA graphs (``EngineConfig.cuda_graphs``; on by default on CUDA without tensor
parallelism). The eager decode iteration is host-bound: Python enqueues every
layer's small kernels each step (on an H200, 1.3B at batch 16-32, a ~20 ms step
whose wall time equals the engine thread's CPU time), so its duration follows
the host CPU. The graph path runs a *static decode* instead (``_decode_static``):
fixed shapes, over all ``M = max_batch`` slots, its inputs (each slot's last
token and the position its new token is written at) read from one static
device buffer; each slot writes its new K/V at its position and attends over
the first ``L`` cached keys of its slot, masked after its position. One CUDA
graph per key-length bucket ``L`` (``decode_buckets``: powers of two from
``MIN_BUCKET`` to 1024, then every 512, and ``max_len``) is captured at start-up
(``Engine.warmup_graphs``). A decode iteration copies the inputs in (one
host-to-device copy), replays the graph of the smallest bucket longer than the
longest running sequence and reads the greedy picks of every slot back (one
device-to-host copy). What it costs: attention reads ``L`` keys for every
slot, free ones included (below 1024 up to twice the longest running sequence,
above it up to 512 more, times ``max_batch / batch``), and the projections and
FFN run on all ``max_batch`` rows; what it buys: the step's host time no
longer grows with the layers, and its duration is the GPU's.

Prefills run as graphs too (``_prefill_static``; ``EngineConfig.prefill_graphs``): one
request at a time, its uncached tokens zero-padded to a fixed length and read from one
static device buffer with its slot, start position and token count. A miss (nothing cached)
runs causally over its own tokens at the smallest of ``miss_buckets`` that holds its prompt
(every 256 tokens); a prefix-cache hit runs its new tokens at the smallest of
``prefill_buckets`` (64, 128, then the decode's key lengths) against the smallest key length
that holds its whole prompt, masked. The padding rows write K/V past the prompt (clamped to
``max_len - 1``), which nothing reads before the decode rewrites it, and their outputs are
dropped. On an H200 (1.3B, bf16) a 1,024-token prefill took 12.1 ms eager and 7.0 ms as a
graph (results/logs/gpu-20261130T2111-serve_engine), and a prefill no longer carries the
eager host floor that changed from one replica start-up to the next (13.6 to 23.0 ms in the
19:40-20:01 profiles); hashing the prompt and copying prefix-cache blocks stay eager.

Shape suffixes: B batch, S sequence (new tokens), L cached length, M every KV
slot (``max_batch``), N query heads, K kv heads, R query heads per kv head, D
head dim, H hidden, V vocab.
"""

from __future__ import annotations

import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from parlab.errors import UsageError
from parlab.models.reference import Transformer, apply_rope
from parlab.serve.prefix import DEFAULT_BLOCK, BlockLRU, block_hashes

NO_CUDNN = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]
"""SDPA backends of the engine on CUDA unless ``EngineConfig.cudnn_attention``."""
PRINTABLE = (32, 127)  # sampled token ids: printable ASCII
MIN_BUCKET = 256
"""Shortest key length of the static decode (``decode_buckets``)."""
BUCKET_STEP = 512
"""Spacing of the static decode's key lengths past ``2 * BUCKET_STEP`` (``decode_buckets``)."""
MISS_STEP = 256
"""Spacing of the static prefill's prompt lengths for misses (``miss_buckets``)."""


def decode_buckets(max_len: int) -> list[int]:
    """Key lengths the static decode runs at (one captured graph each): powers of two from
    ``MIN_BUCKET`` up to ``2 * BUCKET_STEP``, then every ``BUCKET_STEP``, those below
    ``max_len``, then ``max_len`` (e.g. 4096: 256, 512, 1024, 1536, 2048, 2560, 3072, 3584,
    4096). Attention reads ``L`` keys per slot, so the finer steps keep a long context's
    bucket close to it: a 2113-token context reads 2560 keys, not 4096 (each bucket costs one
    graph's capture at start-up and its share of the graphs' memory pool)."""
    out: list[int] = []
    b = MIN_BUCKET
    while b < max_len:
        out.append(b)
        b = b * 2 if b < 2 * BUCKET_STEP else b + BUCKET_STEP
    return [*out, max_len]


def prefill_buckets(max_len: int) -> list[int]:
    """New-token counts the static prefill of a prefix-cache hit runs at (its query lengths):
    64 and 128 where they are shorter than the decode's first key length, then
    ``decode_buckets(max_len)`` (e.g. 4096: 64, 128, 256, 512, 1024, 1536, ..., 4096). A
    hit's uncached tokens are padded to the smallest that holds them (a few new tokens after
    a cached system prompt run at 64), and it attends over a key length of the same list."""
    keys = decode_buckets(max_len)
    return [q for q in (64, 128) if q < keys[0]] + keys


def miss_buckets(max_len: int) -> list[int]:
    """Prompt lengths the static prefill of a miss (nothing cached) runs at: 64 and 128, then
    every ``MISS_STEP`` below ``max_len``, then ``max_len`` (e.g. 4096: 64, 128, 256, 512,
    ..., 3840, 4096). A miss's whole prompt is computed, so its padding costs every layer's
    GEMMs: the finer steps keep a 2,112-token prompt at 2,304, not 2,560."""
    out = [q for q in (64, 128) if q < max_len] + list(range(MISS_STEP, max_len, MISS_STEP))
    return [*out, max_len]


def _rope_rows(x_BSND: torch.Tensor, rope_TD2: torch.Tensor) -> torch.Tensor:
    """RoPE with a position per row and token: ``rope_TD2`` is the model's table for the
    ``T = B * S`` positions in row-major order (``[T, D/2, 2]``), applied in one call of the
    reference ``apply_rope`` by folding the batch into its sequence dimension."""
    B, S, N, D = x_BSND.shape
    return apply_rope(x_BSND.reshape(1, B * S, N, D), rope_TD2).reshape(B, S, N, D)


@dataclass(frozen=True)
class _Plan:
    """The device-side indices of one forward, built once and read by every layer."""

    slot_BS: torch.Tensor
    """KV slot of each new token (the rows' slots, broadcast)."""
    pos_BS: torch.Tensor
    """Position of each new token."""
    total: int
    """Cached length attention reads: the longest row's start + S."""
    causal: bool
    """Every row starts at 0: attention runs causally over the new K/V alone."""
    rows: slice | torch.Tensor
    """The cache rows attention reads: a slice (a view of the cache) or slot indices (a
    gather)."""
    scatter: torch.Tensor | None
    """Where row ``b``'s queries sit among ``rows`` when that slice is not in row order."""
    mask: torch.Tensor | None
    """``[R, 1, S, total]`` additive mask: 0 where key ``j`` is visible to new token ``i`` of
    attention row ``r``, ``-inf`` elsewhere."""


@dataclass(frozen=True)
class _Graph:
    """One captured static decode (``Engine.warmup_graphs``): replaying ``graph`` rewrites
    ``logits_MV`` and ``picks_M`` in place."""

    graph: Any
    """The ``torch.cuda.CUDAGraph``."""
    logits_MV: torch.Tensor
    picks_M: torch.Tensor


@dataclass(frozen=True, kw_only=True)
class EngineConfig:
    """The engine's knobs."""

    max_batch: int = 16
    """Most requests decoding at once (KV slots)."""
    max_len: int = 2048
    """Longest prompt + output, tokens."""
    prefix_cache: bool = True
    """Reuse the KV of cached prompt prefixes."""
    block: int = DEFAULT_BLOCK
    """Prefix-cache block, tokens."""
    cache_blocks: int = 4096
    """Prefix-cache capacity, blocks."""
    max_prefill_tokens: int = 8192
    """Most prompt tokens prefilled in one iteration (at least one request always)."""
    cudnn_attention: bool = False
    """Let SDPA pick cuDNN attention on CUDA. Off by default: cuDNN builds an execution plan
    for every new (batch, length) shape the first time it sees it, and a serving engine
    sees a new one almost every iteration (each decode step is one token longer);
    flash, memory-efficient and math attention need no per-shape plan. On an H200 (1.3B,
    bf16, batch 32) a decode step took 56.2 ms with cuDNN allowed and 15.2 ms without
    (scripts/gpu/serve_engine.sh)."""
    cuda_graphs: bool | None = None
    """Run decode iterations as captured CUDA graphs (the module docstring: one per key-length
    bucket, over every KV slot). None: on when the device is CUDA, the engine is not tensor
    parallel and the model has no MoE layer; False: off (the eager batched forward); True:
    required (``UsageError`` where it cannot be). Tensor-parallel engines stay eager: an
    all-reduce inside a captured graph (NCCL under capture, every rank replaying in step) is
    not attempted here. MoE models stay eager: the dropless MoE picks its tokens per expert
    with data-dependent shapes (``torch.where``), which a graph cannot capture."""
    prefill_graphs: bool = True
    """With ``cuda_graphs``, run prefills as captured graphs too (the module docstring: one per
    query-length and key-length bucket); False: prefills stay eager."""

    def __post_init__(self) -> None:
        if self.max_batch < 1 or self.max_len < 2 or self.block < 1 or self.cache_blocks < 1:
            raise UsageError("--max-batch, --max-len, block and cache size must be positive")


@dataclass(eq=False)
class Sequence:
    """One request inside the engine."""

    prompt: list[int]
    """Prompt token ids."""
    max_tokens: int
    """Tokens to generate."""
    temperature: float = 0.0
    """0: greedy."""
    seed: int | None = None
    """Sampling seed."""
    output: list[int] = field(default_factory=list)
    """Generated token ids."""
    cached_tokens: int = 0
    """Prompt tokens taken from the prefix cache."""
    slot: int = -1
    """KV slot while running."""
    length: int = 0
    """Tokens in its KV cache."""
    gen: torch.Generator | None = None
    sink: Any = None
    """Where its tokens go (the server's queue)."""
    cancelled: bool = False
    uid: int = -1
    """Engine-wide id (the same on every tensor-parallel rank)."""
    prefill_graph: tuple[int, int] = (0, 0)
    """The static prefill's (query length, key length) it ran at; (0, 0): the eager forward."""

    @property
    def finished(self) -> bool:
        return len(self.output) >= self.max_tokens


def encode(text: str) -> list[int]:
    """Byte-level tokenizer."""
    return list(text.encode("utf-8"))


def decode(ids: list[int]) -> str:
    return bytes(i % 256 for i in ids).decode("utf-8", errors="replace")


class Engine:
    """Continuous batching for one model on one device."""

    def __init__(
        self, model: Transformer, config: EngineConfig | None = None, tp: Any = None
    ) -> None:
        """``tp``: a ``parlab.serve.tp.TPComm`` when ``model`` is sharded across ranks."""
        spec = model.spec
        if spec.mla is not None:
            raise UsageError(f"model {spec.name!r} uses MLA: the reference replica serves MHA/GQA")
        if spec.vocab_size < 256:
            raise UsageError(f"model {spec.name!r} has vocab {spec.vocab_size} < 256 bytes")
        self.model = model.eval()
        self.config = config or EngineConfig()
        cfg = self.config
        if spec.position == "learned" and cfg.max_len > spec.max_seq_len:
            raise UsageError(
                f"--max-len {cfg.max_len} exceeds {spec.name}'s {spec.max_seq_len} learned positions"
            )
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        kvh, d = spec.n_kv_heads // (tp.world if tp is not None else 1), spec.d_head
        shape = (cfg.max_batch, kvh, cfg.max_len, d)
        self.k_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers
        ]
        self.v_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers
        ]
        self.free_slots = list(range(cfg.max_batch))[::-1]
        self.prefix = BlockLRU(cfg.cache_blocks)
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.log: list[dict[str, float]] = []
        """Per iteration: kind (0 prefill, 1 decode), batch, tokens (prefill: uncached prompt
        tokens, with ``cached`` the prompt tokens taken from the prefix cache; decode: context
        tokens), seconds (``s``), this thread's CPU seconds in it (``cpu``: ``s - cpu`` is
        time the thread waited -- for the GPU, the GIL or a core) and, for decode, the seconds
        until the forward was enqueued (``launch``) and the static decode's key length
        (``graph``; 0: the eager forward)."""
        self.tp = tp
        self._inbox: list[Sequence] = []
        self._cancels: list[int] = []
        self._next_uid = 0
        self._by_uid: dict[int, Sequence] = {}
        self.vocab_mask = torch.full((spec.vocab_size,), float("-inf"), device=self.device)
        self.vocab_mask[PRINTABLE[0] : PRINTABLE[1]] = 0.0
        self.cuda_graphs = self._graphs_wanted(tp)
        """Decode iterations replay captured CUDA graphs (``EngineConfig.cuda_graphs``)."""
        self.buckets = decode_buckets(cfg.max_len)
        """Key lengths of the static decode (``decode_buckets``)."""
        self._in_2M = torch.zeros((2, cfg.max_batch), dtype=torch.long, device=self.device)
        """The static decode's inputs, at a fixed address: row 0 each slot's last token, row 1
        the position its new token is written at (0 and 0 for free slots)."""
        host_2M = torch.zeros((2, cfg.max_batch), dtype=torch.long)
        self._host_2M = host_2M.pin_memory() if self.device.type == "cuda" else host_2M
        """Where a decode iteration writes ``_in_2M`` before its one copy to the device."""
        self._static_decode = self.cuda_graphs
        """Decode through ``_decode_static``: on with CUDA graphs (replayed); a CPU test turns it
        on to run the function eagerly, without a graph."""
        self._graphs: dict[int, _Graph] = {}
        """The captured static decode of each bucket."""
        self.prefill_lens = prefill_buckets(cfg.max_len)
        """Query lengths of the static prefill of a prefix-cache hit (``prefill_buckets``); its
        key lengths are ``buckets``."""
        self.miss_lens = miss_buckets(cfg.max_len)
        """Prompt lengths of the static prefill of a miss (``miss_buckets``)."""
        q_max = cfg.max_len
        self._in_P = torch.zeros(q_max + 3, dtype=torch.long, device=self.device)
        """The static prefill's inputs, at a fixed address: the new tokens (zero-padded to
        ``q_max``), then the slot, the first new token's position and the count of new tokens."""
        host_P = torch.zeros(q_max + 3, dtype=torch.long)
        self._host_P = host_P.pin_memory() if self.device.type == "cuda" else host_P
        self._static_prefill = self.cuda_graphs and cfg.prefill_graphs
        """Prefill through ``_prefill_static``: on with CUDA graphs unless
        ``EngineConfig.prefill_graphs`` is off; a CPU test turns it on to run it eagerly."""
        self._prefill_graphs: dict[tuple[int, int], _Graph] = {}
        """The captured static prefill of each (query length, key length) pair."""
        self.graph_capture_s = self.warmup_graphs() if self.cuda_graphs else 0.0
        """Seconds the start-up capture took (``warmup_graphs``)."""

    def _graphs_wanted(self, tp: Any) -> bool:
        """``EngineConfig.cuda_graphs`` resolved for this engine (``UsageError`` where it is
        required and cannot be)."""
        why = None
        if self.device.type != "cuda":
            why = f"the engine runs on {self.device}, not a CUDA device"
        elif tp is not None:
            why = "a tensor-parallel engine decodes eagerly"
        elif any(layer.moe is not None for layer in self.model.layers):
            why = f"model {self.model.spec.name!r} has MoE layers, which a graph cannot capture"
        want = self.config.cuda_graphs
        if want and why is not None:
            raise UsageError(f"--cuda-graphs: {why}")
        return why is None if want is None else want

    # -- model pieces --------------------------------------------------------------------
    def _plan(self, B: int, S: int, slots: list[int], starts: list[int]) -> _Plan:
        """Every index one forward needs, built on the host and sent to the device in one copy."""
        total = max(starts) + S
        lo, hi = min(slots), max(slots) + 1
        causal = total == S  # every row starts at 0: its new tokens are all it attends to
        rows: slice | None = None
        rel: list[int] = []
        att_starts = starts
        if not causal and hi - lo <= 2 * B:
            # the running rows' cache is a slice (a view); holes in it, if any, get zero
            # queries that see key 0 only, and their outputs are dropped
            rows = slice(lo, hi)
            if slots != list(range(lo, hi)):
                rel = [s - lo for s in slots]
                att_starts = [0] * (hi - lo)
                for r, st in zip(rel, starts, strict=True):
                    att_starts[r] = st
        host = slots + starts + att_starts + rel
        idx = torch.tensor(host, dtype=torch.long)
        if self.device.type == "cuda":
            idx = idx.pin_memory()  # an asynchronous copy: no wait for the device to drain
        idx = idx.to(self.device, non_blocking=True)
        slot_B, start_B = idx[:B], idx[B : 2 * B]
        att_start_R = idx[2 * B : 2 * B + len(att_starts)]
        ar_S = torch.arange(S, device=self.device)
        pos_BS = start_B[:, None] + ar_S
        mask = None
        if not causal:
            mask = self._mask(att_start_R[:, None] + ar_S, total)[:, None]
        return _Plan(
            slot_BS=slot_B[:, None].expand(B, S),
            pos_BS=pos_BS,
            total=total,
            causal=causal,
            rows=rows if rows is not None else slot_B,
            scatter=idx[2 * B + len(att_starts) :] if rel else None,
            mask=mask,
        )

    def _mask(self, pos_RS: torch.Tensor, total: int) -> torch.Tensor:
        """Additive attention mask ``[R, S, total]``: 0 where key ``j <= pos_RS[r, s]`` (the
        new token at that position sees it), ``-inf`` after. Built once per forward; its rows
        are padded to 16 keys and sliced, so CUDA's memory-efficient attention takes the slice
        as it is instead of padding a copy every layer."""
        width = -(-total // 16) * 16
        hidden = torch.arange(width, device=self.device) > pos_RS[..., None]
        mask = torch.zeros(hidden.shape, device=self.device, dtype=self.dtype)
        return mask.masked_fill_(hidden, float("-inf"))[..., :total]

    def _qkv(
        self, attn: Any, x_BSH: torch.Tensor, rope_TD2: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries ``[B, S, N, D]``, keys and values ``[B, S, K, D]`` of the new tokens, RoPE
        applied."""
        B, S, _ = x_BSH.shape
        d = attn.head_dim
        q = attn.wq(x_BSH).view(B, S, -1, d)
        k = attn.wk(x_BSH).view(B, S, -1, d)
        v = attn.wv(x_BSH).view(B, S, -1, d)
        if rope_TD2 is not None:
            q, k = _rope_rows(q, rope_TD2), _rope_rows(k, rope_TD2)
        return q, k, v

    def _attn_layer(
        self, li: int, x_BSH: torch.Tensor, rope_TD2: torch.Tensor | None, plan: _Plan
    ) -> torch.Tensor:
        """Attention of ``S`` new tokens per row, appending their K/V to the cache first."""
        attn = self.model.layers[li].attention
        B, S, _ = x_BSH.shape
        q, k, v = self._qkv(attn, x_BSH, rope_TD2)
        kc, vc = self.k_cache[li], self.v_cache[li]
        kc[plan.slot_BS, :, plan.pos_BS] = k  # one indexed write for every row and token
        vc[plan.slot_BS, :, plan.pos_BS] = v
        q = q.transpose(1, 2)  # B N S D
        if plan.causal:
            keys, vals = k.transpose(1, 2), v.transpose(1, 2)
        else:
            keys = kc[plan.rows, :, : plan.total]  # R K L D
            vals = vc[plan.rows, :, : plan.total]
            if plan.scatter is not None:
                q_R = q.new_zeros((keys.shape[0], *q.shape[1:]))
                q_R[plan.scatter] = q
                q = q_R
        o = self._sdpa(q, keys, vals, plan.mask, plan.causal)
        if plan.scatter is not None:
            o = o[plan.scatter]
        return attn.wo(o.transpose(1, 2).reshape(B, S, -1))

    def _sdpa(
        self,
        q_BNSD: torch.Tensor,
        keys_BKLD: torch.Tensor,
        vals_BKLD: torch.Tensor,
        mask: torch.Tensor | None,
        causal: bool,
    ) -> torch.Tensor:
        """SDPA with grouped KV heads: the CPU groups them without a copy; on CUDA the KV heads
        are repeated (memory-efficient attention takes no grouped heads with a mask)."""
        rep = q_BNSD.shape[1] // keys_BKLD.shape[1]
        gqa = rep > 1 and self.device.type == "cpu"
        if rep > 1 and not gqa:
            keys_BKLD = keys_BKLD.repeat_interleave(rep, dim=1)
            vals_BKLD = vals_BKLD.repeat_interleave(rep, dim=1)
        with self._sdpa_backends():
            return F.scaled_dot_product_attention(
                q_BNSD, keys_BKLD, vals_BKLD, attn_mask=mask, is_causal=causal, enable_gqa=gqa
            )

    def _sdpa_backends(self) -> Any:
        """The SDPA backends allowed here (``EngineConfig.cudnn_attention``)."""
        if self.device.type != "cuda" or self.config.cudnn_attention:
            return contextlib.nullcontext()
        return sdpa_kernel(NO_CUDNN)

    def _attn_static(
        self,
        li: int,
        x_M1H: torch.Tensor,
        rope_MD2: torch.Tensor | None,
        slot_M: torch.Tensor,
        pos_M: torch.Tensor,
        mask_M11L: torch.Tensor,
    ) -> torch.Tensor:
        """The static decode's attention: every slot's one new token, its K/V written at its
        position, attending over the first ``L`` cached keys of its slot (views, no gather)."""
        attn = self.model.layers[li].attention
        M = x_M1H.shape[0]
        L = mask_M11L.shape[-1]
        q, k, v = self._qkv(attn, x_M1H, rope_MD2)
        kc, vc = self.k_cache[li], self.v_cache[li]
        kc[slot_M, :, pos_M] = k[:, 0]  # index tensors on the device: capturable
        vc[slot_M, :, pos_M] = v[:, 0]
        K, D = k.shape[2], k.shape[3]
        # GQA without repeating K/V: the R query heads of each KV head are its query
        # sequence; all of a slot's queries sit at one position, so one mask row serves them
        q_MKRD = q.reshape(M, K, -1, D)
        with self._sdpa_backends():
            o_MKRD = F.scaled_dot_product_attention(
                q_MKRD, kc[:, :, :L], vc[:, :, :L], attn_mask=mask_M11L
            )
        return attn.wo(o_MKRD.reshape(M, 1, -1))

    def _embed(
        self, tokens_BS: torch.Tensor, pos_BS: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Hidden states of the new tokens ``[B, S, H]`` and their RoPE table (rows in
        row-major order; None with learned positions)."""
        m = self.model
        h = m.tok_embeddings(tokens_BS)
        if m.pos_embeddings is not None:
            h = h + m.pos_embeddings(pos_BS)
        rope = m.rope(pos_BS.reshape(-1)) if m.spec.position == "rope" else None
        return h, rope

    def _blocks(
        self,
        h_BSH: torch.Tensor,
        attend: Callable[[int, torch.Tensor], torch.Tensor],
        last_1: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """The model's blocks over ``h_BSH`` with ``attend(layer, x_BSH)`` as each one's
        attention, then the final norm and output of each row's last token: logits ``[B, V]``.
        ``last_1``: the index of that token on the device (the static prefill's, whose rows
        are padded); default the last position."""
        m = self.model
        for li, layer in enumerate(m.layers):
            h_BSH = h_BSH + self._reduce(attend(li, layer.attention_norm(h_BSH)))
            h_BSH = h_BSH + self._reduce(layer.ffn(layer.ffn_norm(h_BSH)))
        h_BH = h_BSH[:, -1] if last_1 is None else h_BSH.index_select(1, last_1)[:, 0]
        return m.output(m.norm(h_BH)).float()

    @torch.no_grad()
    def forward(self, tokens_BS: torch.Tensor, slots: list[int], starts: list[int]) -> torch.Tensor:
        """Logits of the last new token of each row ``[B, V]``, caching the new K/V.

        Row ``b``'s tokens sit at positions ``starts[b] ..`` of KV slot ``slots[b]``; it
        attends to its cached positions ``0 .. starts[b] - 1`` and causally to its new ones.
        """
        B, S = tokens_BS.shape
        plan = self._plan(B, S, list(slots), list(starts))
        h, rope = self._embed(tokens_BS, plan.pos_BS)
        return self._blocks(h, lambda li, x: self._attn_layer(li, x, rope, plan))

    @torch.no_grad()
    def _decode_static(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One decode step of every KV slot at fixed shapes (what a CUDA graph captures):
        logits ``[M, V]`` and greedy picks ``[M]`` (printable tokens only).

        Slot ``m``'s token ``_in_2M[0, m]`` sits at position ``p = _in_2M[1, m]``: its K/V are
        written there and it attends to keys ``0 .. p`` of its slot, of the first ``L``. A free
        slot (token 0 at position 0) computes rows nobody reads and writes its K/V at position
        0, which is harmless: the prefill that takes a slot rewrites every position it will
        read (``_prefill``: the prefix-cache copy writes ``0 .. start - 1``, its forward
        ``start .. len - 1``), and nothing reads a free slot.
        """
        tok_M, pos_M = self._in_2M[0], self._in_2M[1]
        h, rope = self._embed(tok_M[:, None], pos_M[:, None])
        slot_M = torch.arange(tok_M.shape[0], device=self.device)
        mask_M11L = self._mask(pos_M[:, None], L)[:, None]
        logits_MV = self._blocks(
            h, lambda li, x: self._attn_static(li, x, rope, slot_M, pos_M, mask_M11L)
        )
        return logits_MV, (logits_MV + self.vocab_mask).argmax(dim=-1)

    def warmup_graphs(self) -> float:
        """Capture the static decode of every bucket and, with ``prefill_graphs``, the static
        prefill of every pair (``prefill_pairs``) as CUDA graphs, all in one memory pool
        (replacing any captured before); return the seconds it took.

        Only on an idle engine: warming up and capturing run the static decode with every slot
        free, which writes K/V at position 0 of every slot (the prefill, at slot 0's first
        positions). The graphs share their pool safely
        because each replay reads only its own outputs, right after it, and nothing a graph
        keeps across replays (the cache, the inputs) lives in the pool."""
        if not self.cuda_graphs:
            raise UsageError("CUDA graphs are off for this engine (EngineConfig.cuda_graphs)")
        assert not self.running, "capture on an idle engine: it overwrites every slot's position 0"
        t0 = time.perf_counter()
        self._graphs, self._prefill_graphs = {}, {}
        pairs = self.prefill_pairs() if self._static_prefill else []
        with torch.cuda.device(self.device):
            self._in_2M.zero_()
            self._in_P.zero_()
            self._in_P[-1] = 1  # one new token (slot 0, position 0): its last row is row 0
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # warm-up off the capture: cuBLAS, SDPA's choice
                for _ in range(2):
                    for L in self.buckets:
                        self._decode_static(L)
                    for Q, L in pairs:
                        self._prefill_static(Q, L)
            torch.cuda.current_stream().wait_stream(side)
            pool = torch.cuda.graph_pool_handle()
            # the largest first; the smaller reuse its blocks
            for Q, L in sorted(pairs, key=lambda p: p[0] * max(p), reverse=True):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    logits_1V, picks_1 = self._prefill_static(Q, L)
                self._prefill_graphs[Q, L] = _Graph(g, logits_1V, picks_1)
            for L in reversed(self.buckets):
                g = torch.cuda.CUDAGraph()
                with torch.cuda.graph(g, pool=pool):
                    logits_MV, picks_M = self._decode_static(L)
                self._graphs[L] = _Graph(g, logits_MV, picks_M)
            torch.cuda.synchronize()
        return time.perf_counter() - t0

    def _decode_slots(self, batch: list[Sequence]) -> tuple[torch.Tensor, torch.Tensor, int]:
        """The static decode for the running ``batch`` (rows are KV slots): its inputs in one
        host-to-device copy, then the replay of the bucket's graph (without graphs, the
        function run eagerly); ``(logits_MV, picks_M, L)``."""
        L = next(b for b in self.buckets if b > max(s.length for s in batch))
        # the previous step's copy out of this host buffer is done: its picks were read back
        host_2M = self._host_2M.numpy()
        host_2M.fill(0)
        slots = [s.slot for s in batch]
        host_2M[0, slots] = [s.output[-1] for s in batch]
        host_2M[1, slots] = [s.length for s in batch]
        self._in_2M.copy_(self._host_2M, non_blocking=True)
        return (*self._run_static(L), L)

    def _run_static(self, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The static decode at key length ``L`` on the inputs in ``_in_2M``: the replay of its
        captured graph, or, where none was captured, the function run eagerly;
        ``(logits_MV, picks_M)``."""
        g = self._graphs.get(L)
        if g is None:
            return self._decode_static(L)
        g.graph.replay()
        return g.logits_MV, g.picks_M

    @torch.no_grad()
    def _prefill_static(self, Q: int, L: int) -> tuple[torch.Tensor, torch.Tensor]:
        """One request's prefill at fixed shapes (what a CUDA graph captures): logits of its
        last new token ``[1, V]`` and the greedy pick ``[1]`` (printable tokens only).

        Its inputs are in ``_in_P``: ``n`` new tokens (padded with zeros to ``Q``), for slot
        ``slot`` from position ``start``. Every one of the ``Q`` rows runs; row ``i`` sits at
        position ``start + i``, clamped to ``max_len - 1``, writes its K/V there and attends
        to keys ``0 .. its position`` of the first ``L`` of its slot. The ``n`` real rows
        write and read exactly what the eager forward does (``start + n <= max_len - 1``:
        ``_prefill`` runs longer prompts eagerly, and a request has at least one output token,
        so a prompt is at most ``max_len - 1`` long); the padding rows write K/V at the
        positions after the prompt, which nothing reads before the decode rewrites them (the
        decode writes a token's K/V before it attends), and their outputs are dropped."""
        q_max = self.config.max_len
        tok_Q = self._in_P[:Q]
        slot_1 = self._in_P[q_max : q_max + 1]
        start, n = self._in_P[q_max + 1], self._in_P[q_max + 2]
        pos_1Q = (start + torch.arange(Q, device=self.device)).clamp(max=self.config.max_len - 1)
        pos_1Q = pos_1Q[None]
        h, rope = self._embed(tok_Q[None], pos_1Q)
        slot_1Q = slot_1[:, None].expand(1, Q)
        mask_11QL = self._mask(pos_1Q, L)[:, None] if L else None
        logits_1V = self._blocks(
            h,
            lambda li, x: self._attn_prefill(li, x, rope, slot_1Q, pos_1Q, mask_11QL),
            last_1=(n - 1).reshape(1),
        )
        return logits_1V, (logits_1V + self.vocab_mask).argmax(dim=-1)

    def _attn_prefill(
        self,
        li: int,
        x_1QH: torch.Tensor,
        rope_QD2: torch.Tensor | None,
        slot_1Q: torch.Tensor,
        pos_1Q: torch.Tensor,
        mask_11QL: torch.Tensor | None,
    ) -> torch.Tensor:
        """The static prefill's attention: the new tokens' K/V written at their positions of
        the slot, then every new token attends over the slot's first ``L`` cached keys (the
        mask's width); without a mask (a miss: its tokens start at position 0), causally over
        the new tokens themselves, as the eager forward does."""
        attn = self.model.layers[li].attention
        Q = x_1QH.shape[1]
        q, k, v = self._qkv(attn, x_1QH, rope_QD2)
        kc, vc = self.k_cache[li], self.v_cache[li]
        kc[slot_1Q, :, pos_1Q] = k  # index tensors on the device: capturable
        vc[slot_1Q, :, pos_1Q] = v
        if mask_11QL is None:
            keys, vals = k.transpose(1, 2), v.transpose(1, 2)  # 1 K Q D
        else:
            L = mask_11QL.shape[-1]
            keys, vals = kc[slot_1Q[:, 0], :, :L], vc[slot_1Q[:, 0], :, :L]  # 1 K L D
        o = self._sdpa(q.transpose(1, 2), keys, vals, mask_11QL, mask_11QL is None)
        return attn.wo(o.transpose(1, 2).reshape(1, Q, -1))

    def _prefill_slot(
        self, tokens: list[int], slot: int, start: int, pair: tuple[int, int] | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, tuple[int, int]]:
        """The static prefill of ``tokens`` into ``slot`` from position ``start``: its inputs in
        one host-to-device copy, then the replay of its pair's graph (without graphs, the
        function run eagerly); ``(logits_1V, picks_1, (Q, L))``. The pair: for a miss
        (``start`` 0) the smallest prompt length that holds the tokens and ``L = 0`` (causal
        over them); for a hit the smallest query length that holds the tokens and the smallest
        key length that holds ``start`` + them (``pair`` sets it: the profile's timing)."""
        n = len(tokens)
        if pair is not None:
            Q, L = pair
        elif start == 0:
            Q, L = next(q for q in self.miss_lens if q >= n), 0
        else:
            Q = next(q for q in self.prefill_lens if q >= n)
            L = next(b for b in self.buckets if b >= start + n)
        # the previous prefill's copy out of this host buffer is done: its picks were read
        host = self._host_P.numpy()
        host[:n] = tokens
        host[n:Q] = 0
        host[-3:] = (slot, start, n)
        self._in_P.copy_(self._host_P, non_blocking=True)
        g = self._prefill_graphs.get((Q, L))
        if g is None:
            return (*self._prefill_static(Q, L), (Q, L))
        g.graph.replay()
        return g.logits_MV, g.picks_M, (Q, L)

    def prefill_pairs(self) -> list[tuple[int, int]]:
        """The static prefill's (query length, key length) pairs: each miss length with key
        length 0 (causal over its own tokens), then each hit query length with every key
        length that holds it (a hit's ``L`` holds its ``start + n >= n`` tokens)."""
        misses = [(Q, 0) for Q in self.miss_lens]
        return misses + [(Q, L) for Q in self.prefill_lens for L in self.buckets if L >= Q]

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the partial outputs of row-sharded ``wo`` / ``w2`` (tensor parallel only)."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def _sample(
        self,
        logits_BV: torch.Tensor,
        seqs: list[Sequence],
        picks_B: torch.Tensor | None = None,
        rows: list[int] | None = None,
    ) -> list[int]:
        """One token per sequence: greedy ones by one batched ``argmax`` (``picks_B`` when the
        static decode took it already), ones with a temperature from their own seeded
        generator; one device-to-host copy for the whole batch. ``rows[i]``: ``seqs[i]``'s row
        of ``logits_BV`` and ``picks_B`` (default ``i``)."""
        if picks_B is None:
            picks_B = (logits_BV + self.vocab_mask).argmax(dim=-1)
        rows = list(range(len(seqs))) if rows is None else rows
        drawn: list[int] = []
        draws: list[torch.Tensor] = []
        for i, (seq, r) in enumerate(zip(seqs, rows, strict=True)):
            if seq.temperature <= 0:
                continue
            if seq.gen is None:
                seq.gen = torch.Generator(device=self.device)
                seq.gen.manual_seed(seq.seed if seq.seed is not None else 0)
            probs = torch.softmax((logits_BV[r] + self.vocab_mask) / seq.temperature, dim=-1)
            draws.append(torch.multinomial(probs, 1, generator=seq.gen))
            drawn.append(i)
        out = (torch.cat([picks_B, *draws]) if draws else picks_B).tolist()
        picks, extra = out[: len(picks_B)], out[len(picks_B) :]
        toks = [picks[r] for r in rows]
        for i, t in zip(drawn, extra, strict=True):
            toks[i] = t
        return toks

    # -- scheduling ----------------------------------------------------------------------
    def add(self, seq: Sequence) -> None:
        """Queue a request; ``UsageError`` if it cannot fit."""
        if not seq.prompt:
            raise UsageError("empty prompt: give at least one character")
        if len(seq.prompt) + seq.max_tokens > self.config.max_len:
            raise UsageError(
                f"prompt ({len(seq.prompt)} tokens) + max_tokens ({seq.max_tokens}) exceeds "
                f"the replica's --max-len {self.config.max_len}"
            )
        self.submit(seq)

    def submit(self, seq: Sequence) -> None:
        """Hand a request to the engine; it joins at the start of the next ``step``."""
        self._inbox.append(seq)

    def cancel(self, seq: Sequence) -> None:
        """Drop a request at the start of the next ``step``."""
        self._cancels.append(seq.uid)

    def _admit_inbox(self) -> None:
        """Move submitted requests and cancellations in; on tensor-parallel ranks rank 0
        broadcasts them first, so every rank schedules exactly the same iteration."""
        new, self._inbox = self._inbox, []
        cancels, self._cancels = self._cancels, []
        if self.tp is not None:
            msg = [(s.prompt, s.max_tokens, s.temperature, s.seed) for s in new]
            msg, cancels = self.tp.broadcast_plan((msg, cancels))
            if not self.tp.is_main:
                new = [
                    Sequence(prompt=p, max_tokens=m, temperature=t, seed=sd) for p, m, t, sd in msg
                ]
        for seq in new:
            seq.uid = self._next_uid
            self._next_uid += 1
            self._by_uid[seq.uid] = seq
            self.waiting.append(seq)
        for uid in cancels:
            if uid in self._by_uid:
                self._by_uid[uid].cancelled = True

    def has_work(self) -> bool:
        return bool(self.waiting or self.running or self._inbox or self._cancels)

    def _prefill(self, seq: Sequence) -> None:
        cfg = self.config
        slot = self.free_slots.pop()
        seq.slot = slot
        hashes = block_hashes(seq.prompt, cfg.block) if cfg.prefix_cache else []
        n = self.prefix.match(hashes) if cfg.prefix_cache else 0
        n = min(n, (len(seq.prompt) - 1) // cfg.block)  # leave at least one token to compute
        start = n * cfg.block
        if n:
            # the cached blocks, each [layers, 2, K, block, D], joined along the tokens
            kv = torch.cat([self.prefix.get(h) for h in hashes[:n]], dim=3)
            for li, (kc, vc) in enumerate(zip(self.k_cache, self.v_cache, strict=True)):
                kc[slot, :, :start] = kv[li, 0]
                vc[slot, :, :start] = kv[li, 1]
        seq.cached_tokens = start
        picks: torch.Tensor | None = None
        if self._static_prefill and len(seq.prompt) < cfg.max_len:
            logits, picks, seq.prefill_graph = self._prefill_slot(seq.prompt[start:], slot, start)
        else:
            new = torch.tensor([seq.prompt[start:]], device=self.device)
            logits = self.forward(new, [slot], [start])
        seq.length = len(seq.prompt)
        if cfg.prefix_cache and len(hashes) > n:
            a, b = start, len(hashes) * cfg.block
            kv = torch.stack(
                [
                    torch.stack((kc[slot, :, a:b], vc[slot, :, a:b]))
                    for kc, vc in zip(self.k_cache, self.v_cache, strict=True)
                ]
            )  # [layers, 2, K, tokens, D]
            for j in range(n, len(hashes)):
                o = (j - n) * cfg.block
                block_kv = kv[:, :, :, o : o + cfg.block]
                self.prefix.put(hashes[j], block_kv.clone(memory_format=torch.contiguous_format))
        seq.output.extend(self._sample(logits, [seq], picks))

    def _release(self, seq: Sequence) -> None:
        if seq.slot >= 0:
            self.free_slots.append(seq.slot)
            seq.slot = -1

    def step(self) -> list[Sequence]:
        """Run one iteration; return the sequences that got a token (the caller reads
        ``seq.output[-1]``; finished ones are already out of the engine)."""
        cfg = self.config
        self._admit_inbox()
        for s in [s for s in self.running if s.cancelled]:
            self.running.remove(s)
            self._release(s)
            self._by_uid.pop(s.uid, None)
        while self.waiting and self.waiting[0].cancelled:
            self._by_uid.pop(self.waiting.popleft().uid, None)
        t0 = time.perf_counter()
        c0 = time.thread_time()  # this thread's CPU time: wall - cpu = time it did not run
        emitted: list[Sequence] = []
        if self.waiting and self.free_slots:
            budget = cfg.max_prefill_tokens
            tokens = cached = 0
            while self.waiting and self.free_slots:
                seq = self.waiting[0]
                if emitted and len(seq.prompt) > budget:
                    break
                self.waiting.popleft()
                if seq.cancelled:
                    continue
                self._prefill(seq)
                budget -= len(seq.prompt) - seq.cached_tokens
                tokens += len(seq.prompt) - seq.cached_tokens
                cached += seq.cached_tokens
                emitted.append(seq)
            self._sync()
            self.log.append(
                {
                    "kind": 0,
                    "batch": len(emitted),
                    "tokens": tokens,
                    "cached": cached,
                    "s": time.perf_counter() - t0,
                    "cpu": time.thread_time() - c0,
                }
            )
        elif self.running:
            batch = self.running
            if self._static_decode:
                logits, picks, graph = self._decode_slots(batch)
                launched = time.perf_counter() - t0  # the host's time to enqueue the replay
                new = self._sample(logits, batch, picks, [s.slot for s in batch])
            else:
                toks = torch.tensor([[s.output[-1]] for s in batch], device=self.device)
                logits = self.forward(toks, [s.slot for s in batch], [s.length for s in batch])
                launched = time.perf_counter() - t0  # the host's time to enqueue the forward
                new, graph = self._sample(logits, batch), 0
            for s, tok in zip(batch, new, strict=True):
                s.length += 1
                s.output.append(tok)
            emitted = list(batch)
            self._sync()
            self.log.append(
                {
                    "kind": 1,
                    "batch": len(batch),
                    "tokens": sum(s.length for s in batch),
                    "s": time.perf_counter() - t0,
                    "cpu": time.thread_time() - c0,
                    "launch": launched,
                    "graph": graph,
                }
            )
        else:
            return []
        still = []
        for s in self.running + [e for e in emitted if e not in self.running]:
            if s.finished:
                self._release(s)
                self._by_uid.pop(s.uid, None)
            else:
                still.append(s)
        self.running = still
        return emitted

    def _sync(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def generate(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Run requests to completion (offline use and tests)."""
        seqs = [Sequence(prompt=p, max_tokens=max_tokens) for p in prompts]
        for s in seqs:
            self.add(s)
        guard = 0
        while self.has_work():
            self.step()
            guard += 1
            assert guard < 10_000_000
        return [s.output for s in seqs]

    # -- profile for the simulator ---------------------------------------------------------
    def profile(
        self,
        *,
        prefill_lens: tuple[int, ...] = (32, 128, 512, 2048),
        hit_tokens: int = 64,
        batches: tuple[int, ...] = (1, 4, 8, 16, 32),
        bucket_reps: int = 5,
    ) -> dict[str, Any]:
        """Iteration costs of this idle engine for the simulator (``sim.ReplicaProfile``), timed
        as a serving run pays them; a few seconds on a GPU.

        Prefill, with the prefix cache as configured: per length in ``prefill_lens`` (those
        that fit ``max_len``), prompts that cannot hit (each begins with its own two tokens) and
        prompts that hit the first one's cached blocks (it plus ``hit_tokens`` new tokens,
        which begin with their own two; where they fit); three of each, the first discarded
        (warm-up). With the cache on, a miss pays hashing and storing its blocks (``_prefill``),
        as in a run. The profile runs against an empty prefix cache of the configured size,
        swapped in for its duration: its prompts' blocks never give a run free hits, and the
        engine's own cache comes back as it was.

        The prefill costs are given in the overlap model (``sim.ReplicaProfile.prefill_overlap``:
        ``max(base, per_token * uncached) + per_cached_token * cached``): ``base`` is the
        shortest misses' median, ``per_token`` the longest misses' median cost per token, and
        ``per_cached_token`` what the hits of the most cached tokens cost above that, per
        token. The host enqueues every layer whatever the length while the GPU works, so a short
        prompt costs the host's floor and a long one its GPU work. The additive least-squares
        fit (``base + per_token * uncached + per_cached_token * cached``, no negative cost) is
        kept under ``prefill_linear``; on 2xH200 it priced a 2,112-token prompt at 35 ms where
        the runs paid 26 ms.

        Decode, two ways:

        - ``decode_bucket_s``: with the static decode (CUDA graphs, or a CPU test's hook;
          None for eager engines), the seconds of one decode iteration at each bucket
          (``self.buckets``) -- the inputs' host-to-device copy, the graph's replay, the picks
          read back -- the median of ``bucket_reps`` after one warm-up. The static decode runs
          every KV slot whatever the batch, so one number per bucket prices any batch; the
          simulator charges a decode iteration the bucket of its longest running request.
        - ``decode_base_s + decode_per_seq_s * batch``: steps on 32-token prompts at each
          batch in ``batches`` (up to ``max_batch``), least squares -- the eager decode's cost
          at short contexts (attention over long cached contexts adds to it; the fit of a
          run's own iteration log, ``sim.fit_profile``, includes that). With the static decode
          these steps run its smallest bucket.
        """
        import itertools
        import statistics

        import numpy as np

        from parlab.serve.sim import ReplicaProfile, nonneg_lstsq

        assert not self.has_work(), "profile an idle engine"
        cfg = self.config
        lens = [n for n in prefill_lens if n + 8 <= cfg.max_len]
        if not lens or cfg.max_len < 40 or hit_tokens < 2:
            raise UsageError(
                f"profile: --max-len {cfg.max_len} leaves no room for its prompts (prefill "
                f"lengths {prefill_lens} + 8, decode 32 + 8) or hit_tokens {hit_tokens} < 2"
            )
        own_cache, self.prefix = self.prefix, BlockLRU(cfg.cache_blocks)
        count = itertools.count()

        def fresh() -> list[int]:
            """Two printable tokens no earlier prompt of the profile began with (9,025 pairs)."""
            k, lo = next(count), PRINTABLE[0]
            width = PRINTABLE[1] - lo
            return [lo + k // width % width, lo + k % width]

        def prefill(prompt: list[int]) -> dict[str, float]:
            self.log.clear()
            self.generate([prompt], 1)
            return self.log[0]

        pre: list[tuple[int, int, float]] = []
        dec: list[tuple[int, float]] = []
        buckets: dict[int, list[float]] | None = None
        pairs: dict[tuple[int, int], list[float]] | None = None
        try:
            for n in lens:
                misses = [fresh() + [65] * (n - 2) for _ in range(3)]
                hits = [misses[0] + fresh() + [66] * (hit_tokens - 2) for _ in range(3)]
                if n + hit_tokens + 8 > cfg.max_len:
                    hits = []
                for rep, prompt in enumerate(misses + hits):
                    e = prefill(prompt)
                    if rep % 3:
                        pre.append((int(e["tokens"]), int(e["cached"]), e["s"]))
            for b in [b for b in batches if b <= cfg.max_batch]:
                self.log.clear()
                self.generate([fresh() + [66] * 30 for _ in range(b)], 6)
                steps = [e["s"] for e in self.log if e["kind"] == 1]
                dec.extend((b, s) for s in steps[1:])
            if self._static_decode:
                buckets = self._time_buckets(bucket_reps)
            if self._static_prefill:
                pairs = self._time_prefill_pairs(bucket_reps)
        finally:
            self.prefix = own_cache
            self.log.clear()
        pa = np.asarray(pre, dtype=float)
        pb, pt, pc = nonneg_lstsq(np.column_stack([np.ones(len(pa)), pa[:, 0], pa[:, 1]]), pa[:, 2])
        # the overlap model (sim.ReplicaProfile.prefill_overlap): the host's floor from the
        # shortest misses, the per-token work from the longest (its cost / its tokens, so
        # max(floor, per_token * n) is exactly what that length cost), and what a cached token
        # adds on top of that, from the hits
        miss = [(n, t) for n, c, t in pre if c == 0]
        short, long_ = min(n for n, _ in miss), max(n for n, _ in miss)
        floor = statistics.median(t for n, t in miss if n == short)
        per_tok = statistics.median(t / n for n, t in miss if n == long_)
        # from the hits of the most cached tokens: at a few cached tokens the floor's own
        # jitter (~1 ms) divided by them would swamp the per-token cost
        hit = [(n, c, t) for n, c, t in pre if c > 0]
        most = max((c for _, c, _ in hit), default=0)
        uncached_only = ReplicaProfile(
            prefill_base_s=floor,
            prefill_per_token_s=per_tok,
            decode_base_s=0.0,
            decode_per_seq_s=0.0,
            prefill_overlap=True,
        )
        per_cached = (
            statistics.median(
                max(0.0, t - uncached_only.prefill_s(n, 0)) / c for n, c, t in hit if c == most
            )
            if hit
            else 0.0
        )
        da = np.asarray(dec, dtype=float)
        db, ds = nonneg_lstsq(np.column_stack([np.ones(len(da)), da[:, 0]]), da[:, 1])
        linear = {
            "prefill_base_s": float(pb),
            "prefill_per_token_s": float(pt),
            "prefill_per_cached_token_s": float(pc),
        }
        prefill: dict[str, Any] = {
            "prefill_base_s": float(floor),
            "prefill_per_token_s": float(per_tok),
            "prefill_per_cached_token_s": float(per_cached),
            "prefill_overlap": True,
        }
        table = None
        if pairs is not None:
            # the static prefill: each pair's replay as timed, and what the prefills cost
            # around it (hashing, the cached blocks copied in, the new ones stored) fitted
            # to their remainder
            table = [[Q, L, statistics.median(t)] for (Q, L), t in sorted(pairs.items())]
            replay = ReplicaProfile(
                prefill_base_s=0.0,
                prefill_per_token_s=0.0,
                decode_base_s=0.0,
                decode_per_seq_s=0.0,
                prefill_bucket_s=tuple((q, L, t) for q, L, t in table),
            )
            rest = np.asarray([t - replay.prefill_s(n, c) for n, c, t in pre])
            hb, ht, hc = nonneg_lstsq(np.column_stack([np.ones(len(pa)), pa[:, :2]]), rest)
            prefill = {
                "prefill_base_s": float(hb),
                "prefill_per_token_s": float(ht),
                "prefill_per_cached_token_s": float(hc),
                "prefill_overlap": False,
                "prefill_eager": prefill,
            }
        return {
            **prefill,
            "prefill_bucket_s": table,
            "prefill_linear": linear,
            "decode_base_s": float(db),
            "decode_per_seq_s": float(ds),
            "decode_bucket_s": None
            if buckets is None
            else {L: statistics.median(t) for L, t in buckets.items()},
            "samples": {
                "prefill": pre,
                "decode": dec,
                "decode_bucket": buckets,
                "prefill_bucket": None if pairs is None else [[*k, t] for k, t in pairs.items()],
            },
        }

    def _time_prefill_pairs(self, reps: int) -> dict[tuple[int, int], list[float]]:
        """Seconds of one static prefill at each pair (``prefill_pairs``), ``reps`` times after
        one warm-up, as ``_prefill`` pays it: the inputs' copy to the device, the replay, the
        greedy pick read back. Slot 0, ``Q`` new tokens ending at key ``L`` (a miss: from 0)."""
        assert not self.running, "timed on an idle engine: it overwrites slot 0's keys"
        out: dict[tuple[int, int], list[float]] = {}
        for Q, L in self.prefill_pairs():
            times = []
            for i in range(reps + 1):
                t0 = time.perf_counter()
                _, picks_1, _ = self._prefill_slot([65] * Q, 0, max(L - Q, 0), (Q, L))
                picks_1.tolist()
                self._sync()
                if i:
                    times.append(time.perf_counter() - t0)
            out[Q, L] = times
        return out

    def _time_buckets(self, reps: int) -> dict[int, list[float]]:
        """Seconds of one static decode iteration at each bucket, ``reps`` times after one
        warm-up: the inputs' copy to the device, the replay (``_run_static``), the greedy picks
        read back, as ``_decode_slots`` and ``_sample`` do. Every slot free (token 0 at position
        0): the step runs every slot and reads ``L`` keys for each, whichever are running."""
        assert not self.running, "timed on an idle engine: it overwrites every slot's position 0"
        self._host_2M.zero_()
        out: dict[int, list[float]] = {}
        for L in self.buckets:
            times = []
            for i in range(reps + 1):
                t0 = time.perf_counter()
                self._in_2M.copy_(self._host_2M, non_blocking=True)
                _, picks_M = self._run_static(L)
                picks_M.tolist()
                self._sync()
                if i:
                    times.append(time.perf_counter() - t0)
            out[L] = times
        return out

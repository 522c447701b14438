"""The engine's forward over one step's flat batch, its KV pages, and its CUDA graphs.

A step's inputs reach the device in one host-to-device copy of one packed int64 buffer and
one float32 buffer (``StepInputs.pack``). Per layer: ``attention_norm`` -> one fused QKV
projection (the model's ``wq``/``wk``/``wv`` weights concatenated once, the modules' own
weights left as views of it) -> ``PagedAttention`` -> ``attention.wo`` -> the residual add
and ``ffn_norm`` -> the FFN (SwiGLU's ``w1``/``w3`` fused the same way; MoE as the model runs
it) -> the residual add and the next layer's ``attention_norm``, the last layer's for the
rows that sample only, with the final norm; then the output and ``sampling.sample`` on the
device. With the triton backend each residual add and its RMSNorm run as one kernel, and
SwiGLU's ``silu(gate) * up`` as one (``kernels_norm``). The modules are the model's own, so a
test keeps the engine's tokens equal to the model's full forward.

CUDA graphs: a decode-only step of ``b`` sequences is padded to the smallest captured bucket
``>= b`` (``EngineConfig.buckets``) and replays that bucket's graph: its inputs read from
the bucket's static buffers, padding rows are token 0 at position 0 of the null page (page
0, which nothing reads), its outputs the logits and the sampled ids. Steps with prompt
chunks, and every step of an engine without graphs, run the same forward eagerly.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from parlab.errors import UsageError
from parlab.models.reference import RMSNorm
from parlab.serve.engine.attention import ChunkMeta, PagedAttention, StepMeta
from parlab.serve.engine.config import EngineConfig
from parlab.serve.engine.graphs import StaticStep
from parlab.serve.engine.inputs import StepInputs
from parlab.serve.engine.sampling import sample


class ModelRunner:
    """The model's weights (fused), its KV pages and the step's forward."""

    def __init__(
        self, model: Any, cfg: EngineConfig, *, allowed: list[int], stop_ids: tuple[int, ...],
        tp: Any = None,
    ) -> None:  # fmt: skip
        self.model, self.cfg, self.tp = model, cfg, tp
        p = next(model.parameters())
        self.device, self.dtype = p.device, p.dtype
        a0 = model.layers[0].attention
        D = a0.head_dim
        self.N, self.K, self.D = a0.wq.weight.shape[0] // D, a0.wk.weight.shape[0] // D, D
        self._fuse()
        shape = (cfg.num_blocks, cfg.block, self.K, D)
        self.k_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers
        ]
        self.v_cache = [
            torch.zeros(shape, device=self.device, dtype=self.dtype) for _ in model.layers
        ]
        self.backend = self._backend()
        self.fused = self.backend == "triton" and all(
            isinstance(n, RMSNorm)
            for n in [
                model.norm,
                *(x for b in model.layers for x in (b.attention_norm, b.ffn_norm)),
            ]
        )
        """The residual adds with their RMSNorm, and SwiGLU's ``silu(gate) * up``, as Triton
        kernels (``kernels_norm``): with the triton backend, where every norm is RMSNorm."""
        if self.fused:
            from parlab.serve.engine import kernels_norm  # lazy: triton

            self._fused_kernels = kernels_norm
        self.attn = PagedAttention(
            n_heads=self.N, n_kv=self.K, head_dim=D, backend=self.backend, device=self.device
        )
        V = model.spec.vocab_size
        allowed_V = torch.full((V,), float("-inf"))
        allowed_V[[*allowed, *stop_ids]] = 0.0
        self.allowed_V = allowed_V.to(self.device)
        self.stop_ids = torch.tensor(stop_ids, dtype=torch.long, device=self.device)
        self.sms = (
            torch.cuda.get_device_properties(self.device).multi_processor_count
            if self.device.type == "cuda"
            else 1
        )
        self.static: dict[int, StaticStep] = {}
        """Each decode bucket's fixed buffers and, where captured, its graph."""
        self.use_graphs = self._graphs_wanted()
        self.capture_s = self.capture() if self.use_graphs else 0.0

    # -- set-up ----------------------------------------------------------------------------
    def _fuse(self) -> None:
        """One QKV weight per layer (and one W1|W3 for SwiGLU); the modules' weights become
        views of it, so the model is unchanged and no memory is doubled."""
        self.wqkv, self.bqkv, self.w13, self.b13 = [], [], [], []
        for layer in self.model.layers:
            a = layer.attention
            w = torch.cat([a.wq.weight, a.wk.weight, a.wv.weight]).detach()
            b = None
            if a.wq.bias is not None:
                b = torch.cat([a.wq.bias, a.wk.bias, a.wv.bias]).detach()
            self._rebind((a.wq, a.wk, a.wv), w, b)
            self.wqkv.append(w)
            self.bqkv.append(b)
            f = layer.feed_forward
            if f is not None and f.swiglu:
                w = torch.cat([f.w1.weight, f.w3.weight]).detach()
                b = torch.cat([f.w1.bias, f.w3.bias]).detach() if f.w1.bias is not None else None
                self._rebind((f.w1, f.w3), w, b)
                self.w13.append(w)
                self.b13.append(b)
            else:
                self.w13.append(None)
                self.b13.append(None)

    @staticmethod
    def _rebind(linears: tuple[Any, ...], w: torch.Tensor, b: torch.Tensor | None) -> None:
        o = 0
        for lin in linears:
            n = lin.weight.shape[0]
            lin.weight = torch.nn.Parameter(w[o : o + n], requires_grad=False)
            if b is not None:
                lin.bias = torch.nn.Parameter(b[o : o + n], requires_grad=False)
            o += n

    def _backend(self) -> str:
        want = self.cfg.attention
        if want == "torch" or (want == "auto" and self.device.type != "cuda"):
            return "torch"
        if self.device.type != "cuda":
            raise UsageError("attention triton needs a CUDA device: use --attention torch")
        try:
            import triton  # noqa: F401  # lazy: triton
        except ImportError:
            if want == "triton":
                raise UsageError("attention triton: Triton is not installed here") from None
            return "torch"
        return "triton"

    def _graphs_wanted(self) -> bool:
        why = None
        if self.device.type != "cuda":
            why = f"the engine runs on {self.device}, not a CUDA device"
        elif self.tp is not None:
            why = "a tensor-parallel engine runs eagerly (an all-reduce inside a graph is not attempted)"
        elif any(layer.moe is not None for layer in self.model.layers):
            why = "MoE layers pick tokens per expert with data-dependent shapes"
        want = self.cfg.cuda_graphs
        if want and why is not None:
            raise UsageError(f"--cuda-graphs: {why}")
        return why is None if want is None else want

    # -- the forward -----------------------------------------------------------------------
    @torch.no_grad()
    def forward(
        self, tokens_T: torch.Tensor, positions_T: torch.Tensor, meta: StepMeta,
        rows_R: torch.Tensor | None,
    ) -> torch.Tensor:  # fmt: skip
        """Logits ``[R, V]`` (float32) of the sampled rows, caching every token's K/V."""
        m = self.model
        h = m.tok_embeddings(tokens_T)
        if m.pos_embeddings is not None:
            h = h + m.pos_embeddings(positions_T)
        rope = m.rope(positions_T)
        x = m.layers[0].attention_norm(h)
        last = len(m.layers) - 1
        for li, layer in enumerate(m.layers):
            qkv = F.linear(x, self.wqkv[li], self.bqkv[li])
            o = self.attn(qkv, rope, self.k_cache[li], self.v_cache[li], meta)
            h, x = self._add_norm(h, self._reduce(layer.attention.wo(o)), layer.ffn_norm)
            d = self._reduce(self._ffn(li, layer, x))
            if li == last and rows_R is not None:  # the final norm of the sampled rows only
                h, d = h.index_select(0, rows_R), d.index_select(0, rows_R)
            nxt = m.norm if li == last else m.layers[li + 1].attention_norm
            h, x = self._add_norm(h, d, nxt)
        return m.output(x).float()

    def _add_norm(self, h: torch.Tensor, d: torch.Tensor, norm: Any) -> tuple[Any, Any]:
        """``h + d`` and its ``norm``: one Triton kernel where ``fused`` (``h`` updated in
        place), else torch's add and the norm module."""
        if self.fused:
            return h, self._fused_kernels.add_rms_norm(h, d, norm.weight, norm.eps)
        h = h + d
        return h, norm(h)

    def _ffn(self, li: int, layer: Any, x: torch.Tensor) -> torch.Tensor:
        if layer.moe is not None:
            return layer.ffn(x)  # the reference block's MoE (``TransformerBlock.ffn``)
        f = layer.feed_forward
        if self.w13[li] is None:
            return f(x)
        ab = F.linear(x, self.w13[li], self.b13[li])
        if self.fused:
            return f.w2(self._fused_kernels.silu_mul(ab))
        a, b = ab.chunk(2, dim=-1)
        return f.w2(F.silu(a) * b)

    def _reduce(self, x: torch.Tensor) -> torch.Tensor:
        """Sum the partial outputs of row-sharded ``wo`` / ``w2`` (tensor parallel only)."""
        return x if self.tp is None else self.tp.all_reduce(x)

    def _views(self, ints: torch.Tensor, floats: torch.Tensor, where: dict, inp: StepInputs):
        def f(name: str) -> torch.Tensor:
            a, b = where[name]
            return ints[a:b]

        B = inp.n_decode
        meta = StepMeta(
            slots_T=f("slots"),
            n_decode=B,
            table_BM=f("table").view(B, -1) if B else f("table"),
            lens_B=f("lens"),
            max_pages=inp.table.shape[1] if B else 0,
            chunks=self._chunk_groups(inp, f),
            decode=self._decode_config(B),
        )
        R = len(inp.rows)
        params = {
            "temperature_R": floats[:R],
            "top_p_R": floats[R : 2 * R],
            "seed_R": f("seed"),
            "step_R": f("step"),
            "eos_ok_R": f("eos_ok").bool(),
        }
        return f("tokens"), f("positions"), meta, f("rows"), params

    def _chunk_groups(self, inp: StepInputs, f: Any) -> list[ChunkMeta]:
        """The step's prompt chunks, those from position 0 of equal length that sit side by
        side merged into one group (one attention call for all)."""
        groups: list[list[Any]] = []  # [offset, n, start, [pages...]]
        for i, (o, n, s, _) in enumerate(inp.chunks):
            g = groups[-1] if groups else None
            if g and s == 0 and g[2] == 0 and g[1] == n and g[0] + len(g[3]) * n == o:
                g[3].append(f(f"c{i}"))
            else:
                groups.append([o, n, s, [f(f"c{i}")]])
        return [ChunkMeta.build(o, n, s, p, self.cfg.block) for o, n, s, p in groups]

    def _decode_config(self, B: int) -> Any:
        if self.backend != "triton" or not B:
            return None
        from parlab.serve.engine.kernels import decode_config  # lazy: triton

        return decode_config(B, self.K, self.sms)

    def _sample(
        self, logits: torch.Tensor, params: dict, use_top_p: bool, greedy_only: bool = False
    ) -> torch.Tensor:
        return sample(
            logits, allowed_V=self.allowed_V, stop_ids=self.stop_ids, use_top_p=use_top_p,
            greedy_only=greedy_only, **params,
        )  # fmt: skip

    def run(self, inp: StepInputs) -> tuple[np.ndarray, int]:
        """Run one step; the sampled ids of ``inp.rows`` and the graph bucket (0: eager)."""
        top_p = bool((inp.top_p < 1.0).any())
        drawn = top_p or bool((inp.temperature > 0).any())
        n_out = len(inp.rows)
        bucket = self._bucket(inp)
        if bucket:
            st = self.static.get(bucket) or self.static.setdefault(
                bucket, StaticStep.make(self.cfg, bucket, self.device)
            )
            st.fill(inp)
            if st.graph is not None:
                st.graph.replay()
                toks, logits = st.tokens, st.logits
            else:  # the captured step run eagerly (CPU tests)
                toks, logits = self._static_step(st.ints, st.floats, st.where, st.inp)
            if drawn:  # the graph took the greedy picks: draw from its logits, eagerly
                *_, params = self._views(st.ints, st.floats, st.where, st.inp)
                toks = self._sample(logits, params, top_p)
            return toks[:n_out].cpu().numpy(), bucket
        if inp.n_decode:
            # eager: the page table only as wide as the longest sequence needs
            pages = -(-int(inp.lens.max()) // self.cfg.block)
            inp.table = inp.table[:, :pages]
        ints, floats, where = inp.pack()
        ints_d = torch.from_numpy(ints).to(self.device, non_blocking=True)
        floats_d = torch.from_numpy(floats).to(self.device, non_blocking=True)
        tok, pos, meta, rows, params = self._views(ints_d, floats_d, where, inp)
        logits = self.forward(tok, pos, meta, rows)
        toks = self._sample(logits, params, top_p, greedy_only=not drawn)
        return toks[:n_out].cpu().numpy(), bucket

    def _bucket(self, inp: StepInputs) -> int:
        if inp.chunks or not inp.n_decode or not (self.use_graphs or self.static_decode):
            return 0
        return next((b for b in self.cfg.buckets() if b >= inp.n_decode), 0)

    static_decode = False
    """Run decode-only steps padded to their bucket even without graphs (CPU tests of the
    captured step's inputs)."""

    # -- graphs ----------------------------------------------------------------------------
    def capture(self) -> float:
        """Capture the decode step of every bucket (largest first, one memory pool); return
        the seconds it took. Only on an idle engine: the capture's padding rows write page
        0."""
        t0 = time.perf_counter()
        pool = torch.cuda.graph_pool_handle()
        for b in reversed(self.cfg.buckets()):
            st = self.static[b] = StaticStep.make(self.cfg, b, self.device)
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(2):  # compile the Triton kernels, settle cuBLAS's choice
                    self._static_step(st.ints, st.floats, st.where, st.inp)
            torch.cuda.current_stream().wait_stream(side)
            st.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(st.graph, pool=pool):
                st.tokens, st.logits = self._static_step(st.ints, st.floats, st.where, st.inp)
        torch.cuda.synchronize(self.device)
        return time.perf_counter() - t0

    def _static_step(
        self, ints: torch.Tensor, floats: torch.Tensor, where: dict, inp: StepInputs
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The captured decode step: forward of every row and its greedy pick."""
        tok, pos, meta, _, params = self._views(ints, floats, where, inp)
        logits = self.forward(tok, pos, meta, None)
        return self._sample(logits, params, False, greedy_only=True), logits

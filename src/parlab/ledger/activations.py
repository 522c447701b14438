"""Activation memory per layer and per pipeline stage (what autograd keeps for backward).

The structure is Korthikanti et al. 2022 ("Reducing Activation Recomputation in
Large Transformer Models"): per layer, per token, the bytes of every tensor a
block saves for backward, split into the terms tensor parallelism divides
(attention and MLP interiors) and the ones only sequence parallelism divides
(norm inputs/outputs, linear inputs). Their GPT layer is ``34 s b h + 5 a s^2 b``
bytes in 16-bit; the terms here are the same accounting done for parlab's
reference model (``parlab.models.reference``), with these corrections:

- **SwiGLU**: the MLP keeps the gate output, ``silu`` output, up output and
  their product: ``4 f`` elements per token (GeLU: ``2 f``), with f the FFN width.
- **GQA**: K and V are projected to ``kv_heads * head_dim``; the reference
  repeats them to the query heads before attention, so attention's K and V
  inputs are ``q_dim`` wide (``kv_repeat=False`` counts them unrepeated).
- **Flash / memory-efficient SDPA** keeps no ``s x s`` scores, only the output
  and a float32 log-sum-exp per head (``flash=True``); ``flash=False`` adds
  the math kernel's ``heads * s`` scores per token (Korthikanti's ``5 a s / h``
  term without dropout).
- **No dropout** (no masks); **RMSNorm** (``F.rms_norm``, float32 math) on CUDA is one
  fused kernel that keeps its input and a float32 rstd per token
  (``norm_kernel="fused"``); elsewhere torch decomposes it into float32 ops that keep a
  float32 copy of the input and the float32 normalised output
  (``norm_kernel="composite"``, what CPU runs do); RoPE keeps only its cos/sin table (its
  multiplications need no saved input); under **autocast** every linear keeps
  its own bf16 copy of its input.
- **Sequence parallelism**: the column-parallel linears' input is the all-gathered sequence.
  Megatron saves it sharded (``S/t``) and gathers it again in backward; parlab's SP saves the
  whole gathered sequence (``sp_saves_gathered``), once, shared by the linears that read it
  (``sp_gather="shared"``). With ``sp_gather="per-linear"`` (parlab's SP before commit
  02e7fd8: a strided view of the gathered buffer, which ``mm`` copies and saves) each of wq,
  wk, wv and w1 (and w3) keeps its own copy at micro-batch > 1; under autocast each linear
  casts (and saves) its own copy either way.

Dtypes: ``r`` is the residual stream's element size (fp32 under autocast),
``e`` the compute dtype's. Recompute modes: ``none``; ``selective``
(Korthikanti's: the attention core is recomputed, so the ``s^2`` term goes;
identical to ``none`` with flash attention); ``full`` (only each layer's input
is kept; one layer's activations live again during its backward);
``op-selective`` (torchtitan's op-level selective checkpointing, what
``parlab train --recompute selective`` runs: the outputs of every matmul and of
attention are kept, everything else is recomputed -- see ``op_saved_terms``).

Micro-batches in flight on pipeline rank k of p with m micro-batches:
GPipe m (also with p = 1: a GPipe-ordered single stage runs every forward
before any backward; other schedules at p = 1 are gradient accumulation, 1);
1F1B ``min(p - k, m)``; interleaved 1F1B with v chunks
``min(2 (p - k - 1) + (v - 1) p + 1, m v)`` chunks of ``L / (p v)`` layers
(Megatron's warm-up count plus one; rank 0 holds ``L (1 + (p-1)/(p v))``
layer-micro-batches); the zero-bubble V (``zbv``: Qi et al., "Zero Bubble Pipeline
Parallelism", ICLR 2024, Section 6; torch's ``ScheduleZBVZeroBubble``), two chunks of
``L / (2p)`` layers per rank, ``min(2m, m + 1 + k, 2p)`` chunks -- counted on torch's action
lists from each chunk's forward to its deferred weight-gradient pass (torch's input-gradient
pass retains the whole graph for it), so every rank holds ``L`` layer-micro-batches once
``m >= 2p - 1``: the paper's ``p M_B``, 1F1B's rank 0, on every rank.
"""

from __future__ import annotations

from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.models.spec import ModelSpec

RECOMPUTE = ("none", "selective", "full", "op-selective")
NORM_KERNELS = ("fused", "composite", "explicit", "compiled")
"""How RMSNorm runs: ``F.rms_norm`` as one fused CUDA kernel, or as torch's decomposition
(CPU); ``explicit`` is the reference model's RMSNorm before it called ``F.rms_norm``
(``x.float() * rsqrt(mean(x^2) + eps)``, cast back, times the weight), what the run
documents without a ``norm_kernel`` knob ran. ``compiled``: the block under ``torch.compile``,
whose partition of forward and backward (AOTAutograd's min-cut, as inductor runs it) decides
what is kept: the norm keeps what the fused kernel keeps (its input and a float32 rstd per
token), and SwiGLU's ``silu`` output is recomputed in backward instead of kept, ``3 f``
elements per token rather than ``4 f`` (``tests/test_ledger_compiled.py`` checks it against
the partition of the reference block). Modelled for dense SwiGLU blocks without autocast
(``compiled_modelled``)."""


def compiled_modelled(spec: ModelSpec, layer_id: int, *, autocast: bool) -> bool:
    """Whether the ``compiled`` terms describe block ``layer_id``: dense (no MoE, no MLA)
    SwiGLU, parameters in the compute dtype (no autocast)."""
    return (
        spec.activation == "swiglu"
        and spec.mla is None
        and not spec.is_moe_layer(layer_id)
        and not autocast
    )


PP_SCHEDULES = ("1f1b", "gpipe", "interleaved", "zbv")
SP_GATHERS = ("shared", "per-linear")
"""What the column-parallel linears behind parlab's sequence-parallel all-gather save: one
contiguous gathered sequence they share (since commit 02e7fd8; run documents record
``layout.sp_saved_input``), or a copy each of a strided view of it (before; the documents
record no ``sp_saved_input``) -- ``Implementation.sp_gather`` says which."""


@dataclass(frozen=True, kw_only=True)
class ActTerm:
    """One saved tensor (or group) of a block, in bytes per token."""

    name: str
    """What it is (``attn_norm``, ``mlp_hidden``, ...)."""
    bytes_per_token: float
    """Bytes per token of the local sequence, before any TP division."""
    split: str
    """``tp``: divided by the TP degree; ``sp``: divided only with sequence parallelism;
    ``sp_in``: a column-parallel linear's input, divided with sequence parallelism only where
    the sharded sequence is saved and re-gathered in backward (Megatron), whole where the
    gathered sequence is saved (``sp_saves_gathered``: parlab's SP); ``none``: never divided
    (a row-parallel matmul's partial sums, whole per rank)."""
    per_linear_bytes_per_token: float | None = None
    """``sp_in`` terms: the bytes per token when every linear reading the gathered input saves
    its own copy of it (``sp_gather="per-linear"``, parlab's SP before commit 02e7fd8); None:
    ``bytes_per_token`` either way."""


def _norm(spec: ModelSpec, width: int, r: int, norm_kernel: str = "fused") -> int:
    """Bytes per token one norm keeps for backward.

    RMSNorm, fused (CUDA): its input (``r``) and a float32 rstd per token. RMSNorm, composite
    (torch's decomposition, CPU): a float32 copy of its input (the input itself when it is
    float32), the float32 normalised output and the rstd. RMSNorm, explicit: the float32 input
    copy, the normalised output in the input dtype and the rstd. LayerNorm (native kernel):
    its input and a float32 mean and rstd per token.
    """
    if spec.norm != "rmsnorm":
        return r * width + 8
    if norm_kernel not in NORM_KERNELS:
        raise UsageError(f"norm_kernel = {norm_kernel!r}: use one of {', '.join(NORM_KERNELS)}")
    per_element = {"fused": r, "composite": 8, "explicit": 4 + r, "compiled": r}[norm_kernel]
    return per_element * width + 4


def layer_terms(
    spec: ModelSpec,
    layer_id: int,
    *,
    seq_len: int,
    r: int,
    e: int,
    autocast: bool,
    flash: bool = True,
    kv_repeat: bool = True,
    norm_kernel: str = "fused",
) -> list[ActTerm]:
    """The activation terms of block ``layer_id`` (bytes per token), see the module docstring."""
    h = spec.hidden
    if norm_kernel == "compiled" and not compiled_modelled(spec, layer_id, autocast=autocast):
        raise UsageError(
            "norm_kernel = 'compiled': modelled for dense SwiGLU blocks without autocast "
            f"({spec.name} block {layer_id}, autocast {autocast})"
        )
    out: list[ActTerm] = [
        ActTerm(name="attn_norm", bytes_per_token=_norm(spec, h, r, norm_kernel), split="sp")
    ]
    out += _attention_terms(spec, seq_len=seq_len, r=r, e=e, autocast=autocast, flash=flash,
                            kv_repeat=kv_repeat)  # fmt: skip
    out.append(ActTerm(name="ffn_norm", bytes_per_token=_norm(spec, h, r, norm_kernel), split="sp"))
    hid = 4 if spec.activation == "swiglu" else 2
    if norm_kernel == "compiled":
        hid = 3  # silu(w1 x) recomputed in backward: w1's and w3's outputs and their product
    mats_in = 2 if spec.activation == "swiglu" else 1
    if spec.is_moe_layer(layer_id):
        out += _moe_terms(spec, r=r, e=e, autocast=autocast, hid=hid, mats_in=mats_in)
    else:
        out.append(_sp_in(spec, "mlp_in", mats_in, r=r, e=e, autocast=autocast))
        out.append(
            ActTerm(name="mlp_hidden", bytes_per_token=hid * e * spec.ffn_hidden, split="tp")
        )
    return out


def _sp_in(spec: ModelSpec, name: str, count: int, *, r: int, e: int, autocast: bool) -> ActTerm:
    """A column-parallel block's input feeding ``count`` linears: one shared tensor (under
    autocast a bf16 copy each); per-linear, a copy per linear in the input's dtype (under
    autocast each linear's own bf16 cast already is one)."""
    h = spec.hidden
    shared = count * e * h if autocast else r * h
    own = count * (e if autocast else r) * h
    return ActTerm(name=name, bytes_per_token=shared, split="sp_in", per_linear_bytes_per_token=own)


def _attention_terms(
    spec: ModelSpec, *, seq_len: int, r: int, e: int, autocast: bool, flash: bool, kv_repeat: bool
) -> list[ActTerm]:
    """The attention's input, its latents (MLA), the SDPA inputs and outputs, and without flash
    the materialised scores."""
    if spec.mla is not None:
        m = spec.mla
        n = spec.heads
        out = [_sp_in(spec, "attn_in", 2, r=r, e=e, autocast=autocast)]
        lat = (4 + e) * m.kv_lora_rank + e * m.kv_lora_rank
        if m.q_lora_rank:
            lat += (4 + e) * m.q_lora_rank + e * m.q_lora_rank
        out.append(ActTerm(name="mla_latents", bytes_per_token=lat, split="sp"))
        qk = n * m.qk_head_dim
        out.append(
            ActTerm(
                name="sdpa_io",
                bytes_per_token=e * (2 * qk + 2 * n * m.v_head_dim) + 4 * n,
                split="tp",
            )
        )
    else:
        out = [_sp_in(spec, "attn_in", 3, r=r, e=e, autocast=autocast)]
        q, kv = spec.q_dim, spec.kv_dim
        kv_in = 2 * q if kv_repeat else 2 * kv
        out.append(
            ActTerm(
                name="sdpa_io", bytes_per_token=e * (q + kv_in + q) + 4 * spec.heads, split="tp"
            )
        )
    if not flash:
        out.append(
            ActTerm(name="attn_scores", bytes_per_token=e * spec.heads * seq_len, split="tp")
        )
    return out


def _moe_terms(
    spec: ModelSpec, *, r: int, e: int, autocast: bool, hid: int, mats_in: int
) -> list[ActTerm]:
    """An MoE block's router, its routed copies and its shared expert."""
    h = spec.hidden
    m = spec.moe
    assert m is not None
    # router: its input (or bf16 copy), float32 scores per expert, top-k ids and weights
    out = [
        ActTerm(
            name="moe_router",
            bytes_per_token=(e * h if autocast else r * h) + 4 * m.num_experts + 16 * m.top_k + 4,
            split="sp",
        )
    ]
    # per routed copy: gathered input, the FFN interior, expert output and weighted output,
    # the token index (int64) and routing weight (float32)
    per_route = (
        (mats_in * e * h if autocast else r * h) + hid * e * m.expert_ffn_hidden + 2 * e * h + 12
    )
    out.append(ActTerm(name="moe_routed", bytes_per_token=m.top_k * per_route, split="tp"))
    if m.shared_hidden:
        shared_in = mats_in * e * h if autocast else 0  # shares the router's input otherwise
        out.append(
            ActTerm(
                name="moe_shared",
                bytes_per_token=shared_in + hid * e * m.shared_hidden,
                split="tp",
            )
        )
    return out


def layer_bytes_per_token(
    terms: list[ActTerm],
    *,
    tp: int = 1,
    sp: bool = False,
    recompute: str = "none",
    r: int = 2,
    hidden: int = 0,
    sp_saves_gathered: bool = False,
    sp_gather: str = "shared",
) -> float:
    """Bytes per (local) token one block keeps, under TP/SP and a recompute mode.

    ``sp_gather="per-linear"`` (with ``sp`` and ``sp_saves_gathered``): each linear behind
    the all-gather saves its own copy of the gathered input (``SP_GATHERS``; the caller
    passes it only where the copies happen: tp > 1 and micro-batch > 1)."""
    if sp_gather not in SP_GATHERS:
        raise UsageError(f"sp_gather = {sp_gather!r}: use one of {', '.join(SP_GATHERS)}")
    if recompute == "full":
        return r * hidden / (tp if sp else 1)
    per_linear = sp and sp_saves_gathered and sp_gather == "per-linear"
    total = 0.0
    for t in terms:
        if recompute == "selective" and t.name == "attn_scores":
            continue
        sharded = sp and (t.split == "sp" or (t.split == "sp_in" and not sp_saves_gathered))
        div = tp if (t.split == "tp" or sharded) else 1
        own = t.per_linear_bytes_per_token
        total += (own if per_linear and own is not None else t.bytes_per_token) / div
    return total


def op_saved_terms(spec: ModelSpec, layer_id: int, *, r: int, e: int) -> list[ActTerm]:
    """What op-level selective checkpointing keeps of one block (bytes per token).

    The policy (``parlab.parallel.fsdp._selective_policy``, torchtitan's) saves the output
    of every ``mm``/``addmm``/``bmm`` and of scaled-dot-product attention; the checkpoint
    keeps the block's input; everything else (norms, RoPE, SwiGLU's product, residual
    adds) is recomputed in backward. Outputs are in the compute dtype ``e`` (under
    autocast too: the matmuls run in bf16); the block input is in the residual dtype ``r``.
    The q/k/v projections' outputs are ``q_dim + 2 kv_dim`` wide (before any KV repeat);
    the attention-output and down projections' outputs are whole (``h``) on every TP rank.
    Dense attention-FFN blocks only: MLA and MoE blocks raise ``UsageError``.
    """
    if spec.mla is not None or spec.is_moe_layer(layer_id):
        raise UsageError("recompute = 'op-selective' is modelled for dense MHA/GQA blocks only")
    h = spec.hidden
    mats_in = 2 if spec.activation == "swiglu" else 1
    return [
        ActTerm(name="block_input", bytes_per_token=r * h, split="sp"),
        ActTerm(name="qkv_out", bytes_per_token=e * (spec.q_dim + 2 * spec.kv_dim), split="tp"),
        ActTerm(name="sdpa_out", bytes_per_token=e * spec.q_dim + 4 * spec.heads, split="tp"),
        ActTerm(name="attn_proj_out", bytes_per_token=e * h, split="none"),
        ActTerm(name="mlp_up_out", bytes_per_token=e * mats_in * spec.ffn_hidden, split="tp"),
        ActTerm(name="mlp_down_out", bytes_per_token=e * h, split="none"),
    ]


def head_bytes_per_token(
    spec: ModelSpec,
    *,
    r: int,
    e: int,
    autocast: bool,
    tp: int,
    sp: bool,
    norm_kernel: str = "fused",
    sp_saves_gathered: bool = False,
) -> float:
    """The final norm and the output projection's input (last stage). The output projection
    is the one linear behind its all-gather: per-linear SP saves the same one copy."""
    norm = _norm(spec, spec.hidden, r, norm_kernel) / (tp if sp else 1)
    lin_in = (e if autocast else r) * spec.hidden
    return norm + lin_in / (tp if sp and not sp_saves_gathered else 1)


def schedule_name(name: str) -> str:
    """The canonical schedule name (``interleaved-1f1b`` and ``Interleaved1F1B`` mean ``interleaved``)."""
    key = name.strip().lower().replace("_", "-")
    key = {"interleaved-1f1b": "interleaved", "interleaved1f1b": "interleaved"}.get(key, key)
    if key not in PP_SCHEDULES:
        raise UsageError(f"pp_schedule = {name!r}: use one of {', '.join(PP_SCHEDULES)}")
    return key


def bubble_fraction(pp: int, microbatches: int, virtual: int = 1) -> float:
    """The pipeline bubble of ``pp`` equal stages: idle time over busy time, ``(p - 1) / (v m)``
    for ``m`` micro-batches and ``v`` interleaved chunks per rank (GPipe and 1F1B alike; the
    fraction of the step is ``b / (1 + b)``). The one definition: the planner, the schedules'
    simulator, the model-internal project and the doctor call it."""
    return (pp - 1) / (max(1, virtual) * max(1, microbatches)) if pp > 1 else 0.0


def in_flight(schedule: str, pp: int, stage: int, microbatches: int, virtual: int = 1) -> float:
    """Micro-batches of the whole stage whose activations are alive at once on pipeline rank ``stage``.

    Interleaved schedules return a fraction of whole-stage micro-batches (chunks / v).
    """
    schedule = schedule_name(schedule)
    if schedule == "gpipe":  # every forward before any backward: on one stage (pp = 1) too
        return float(microbatches)
    if pp == 1:
        return 1.0
    if schedule == "zbv":  # chunk k and 2p - 1 - k, each alive from forward to weight-gradient
        m = microbatches
        return min(2 * m, m + 1 + stage, 2 * pp) / 2
    if schedule == "1f1b" or virtual == 1:
        return float(min(pp - stage, microbatches))
    chunks = min(2 * (pp - stage - 1) + (virtual - 1) * pp + 1, microbatches * virtual)
    return chunks / virtual

"""Who holds which parameter elements: the sharding rules the ledger and the real mechanisms share.

Pure arithmetic on ``ModelSpec.param_shapes()``; no torch, no process group.

Rules (each a function other code calls, so predictions and meters agree):

- **Tensor parallel** (``tp_local_shape``): column-parallel linears (``wq``,
  ``wk``, ``wv``, ``w1``, ``w3``, MLA's ``wq``/``wq_b``/``wkv_b``, ``output``)
  keep ``dim0 / tp`` rows (and their bias); row-parallel ones (``wo``, ``w2``)
  keep ``dim1 / tp`` columns (bias replicated); ``tok_embeddings`` is split by
  vocabulary rows; stacked experts split their FFN width; norms, learned
  positions, the router and MLA's down-projections are replicated. With fewer
  KV heads than TP ranks (``kv_replicate``), every rank keeps one whole KV head.
- **Expert parallel**: stacked expert weights keep ``num_experts / ep`` experts.
- **Pipeline parallel** (``stage_layers``): the layers are cut into p x v chunks
  (``chunk_sizes``: equal where p x v divides L, else with the embedding and the head counted
  as a layer each on the first and last chunk); stage k of p holds chunk k, and interleaved
  with v chunks per rank, chunks ``k, k+p, ..., k+(v-1)p``. Embeddings live on
  the first stage, the final norm and the output on the last (a tied output is
  a second copy there when p > 1). The zero-bubble V (``v_shape``, v = 2) gives
  rank k chunks ``k`` and ``2p - 1 - k``: rank 0 holds the first and the last
  chunk, the embeddings and the head.
- **ZeRO-1/2/3** (``zero_units`` / ``flat_shard_numel``): parameters are
  grouped into units -- ``embeddings``, each block, ``head`` (final norm +
  output) -- each flattened into one buffer padded to a multiple of the shard
  count N; a rank owns ``ceil(unit_numel / N)`` elements of every unit. The
  full (unsharded) flat buffer of a unit is ``ceil(unit_numel / N) * N``.
  With ep > 1 the routed-expert weights of a block form their own unit,
  sharded over the ``dp / ep`` ranks that hold the same experts.
- **FSDP2** ``fully_shard`` (``dim0_shard_numel``): every parameter is split
  on dim 0 into N chunks padded to ``ceil(dim0 / N)`` rows; a rank holds
  ``ceil(dim0 / N) * prod(rest)`` elements of each in its params' and grads'
  storage; optimizer states are the unpadded chunk (``dim0_chunk_numel``),
  so the last ranks may hold less.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache

from parlab.errors import UsageError
from parlab.models.spec import ModelSpec

_COL = ("wq", "wk", "wv", "w1", "w3", "wq_b", "wkv_b")
_ROW = ("wo", "w2")


def flat_shard_numel(numel: int, shards: int) -> int:
    """Elements a rank owns of a flat buffer of ``numel`` padded to a multiple of ``shards``."""
    return math.ceil(numel / shards) if numel else 0


def gradient_buckets(nbytes: list[int], bucket_bytes: int) -> list[list[int]]:
    """Bucketed DDP's buckets: indices into ``nbytes`` (gradients in backward order).

    A bucket takes gradients in order and closes once it holds at least
    ``bucket_bytes``; a gradient is never split. One all-reduce per bucket.
    """
    buckets: list[list[int]] = []
    current: list[int] = []
    size = 0
    for i, b in enumerate(nbytes):
        current.append(i)
        size += b
        if size >= bucket_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def dim0_shard_numel(shape: tuple[int, ...], shards: int) -> int:
    """Elements a rank holds of one parameter under FSDP2: ``ceil(dim0 / shards)`` padded rows."""
    if not shape:
        return 1
    return math.ceil(shape[0] / shards) * math.prod(shape[1:])


def dim0_chunk_numel(shape: tuple[int, ...], shards: int, index: int) -> int:
    """Elements of chunk ``index`` of ``torch.chunk(dim 0, shards)``, without padding.

    FSDP2 stores params and grads padded (``dim0_shard_numel``) but the optimizer's
    states are ``zeros_like`` of the unpadded local tensor: these many elements.
    """
    if not shape:
        return 1 if index == 0 else 0
    c = math.ceil(shape[0] / shards)
    rows = max(0, min(c, shape[0] - index * c))
    return rows * math.prod(shape[1:])


def tp_rules(
    *,
    tp: int,
    heads: int,
    kv_heads: int | None,
    ffn: int,
    vocab: int,
    expert_ffn: int | None = None,
    kv_replicate: bool = True,
) -> list[tuple[str, str]]:
    """The tensor-parallel rules, one ``(rule, "" or why it fails)`` each: whole query heads
    per rank; KV heads split, or (``kv_replicate``, fewer KV heads than ranks) one replicated
    per rank; FFN columns, expert FFN columns and vocabulary rows split evenly. ``kv_heads``
    None: MLA (no KV heads to split). The one home of these rules: the ledger
    (``check_tp``) and the layout's constraint table (``parlab.layout.constraints``) ask it."""
    out = [("heads % tp == 0", "" if heads % tp == 0 else
            f"heads = {heads} is not divisible by tp = {tp}: choose a tp dividing it")]  # fmt: skip
    if kv_heads is not None:
        why = ""
        if kv_heads < tp:
            if not kv_replicate:
                why = f"kv_heads = {kv_heads} is fewer than tp = {tp}: allow KV-head replication or lower tp"
            elif tp % kv_heads:
                why = f"tp = {tp} is not a multiple of kv_heads = {kv_heads}: cannot replicate"
        elif kv_heads % tp:
            why = f"kv_heads = {kv_heads} is not divisible by tp = {tp}"
        out.append(("kv_heads vs tp", why))
    for rule, value, name in (
        ("ffn % tp == 0", ffn, "ffn_hidden"),
        ("expert ffn % tp == 0", expert_ffn, "moe.expert_ffn_hidden"),
        ("vocab % tp == 0", vocab, "vocab_size"),
    ):
        if value is not None:
            why = f"{name} = {value} is not divisible by tp = {tp}" if value % tp else ""
            out.append(
                (rule, why + (": pad the vocabulary" if why and name == "vocab_size" else ""))
            )
    return out


def check_tp(spec: ModelSpec, tp: int, *, kv_replicate: bool = True) -> None:
    """``UsageError`` naming the field when ``spec`` cannot be split over ``tp`` ranks
    (``tp_rules``)."""
    if tp == 1:
        return
    rules = tp_rules(
        tp=tp, heads=spec.heads, kv_heads=None if spec.mla is not None else spec.n_kv_heads,
        ffn=spec.ffn_hidden, vocab=spec.vocab_size,
        expert_ffn=spec.moe.expert_ffn_hidden if spec.moe is not None else None,
        kv_replicate=kv_replicate,
    )  # fmt: skip
    for _, why in rules:
        if why:
            raise UsageError(why)


@lru_cache(maxsize=4096)
def chunk_sizes(layers: int, chunks: int) -> tuple[int, ...]:
    """Layers of each of ``chunks`` model chunks (pipeline stages x virtual stages, in model
    order): equal where ``chunks`` divides ``layers``; otherwise the embedding and the output
    head each count as one layer, as Megatron's options to account for the embedding and the
    loss in the pipeline split and Llama 3's 405B (126 layers on 16 stages:
    7, then 14 stages of 8, then 7) count them: ``layers + 2`` slots shared as evenly as they
    go (the extra slots to the first and last chunk, then to those after the first), the first
    and the last chunk one layer short. ``UsageError`` where a chunk would hold no layer."""
    if chunks < 1 or layers < 1:
        raise UsageError(f"{layers} layers over {chunks} chunks: give at least one of each")
    if layers % chunks == 0:
        return (layers // chunks,) * chunks
    base, extra = divmod(layers + 2, chunks)
    sizes = [base] * chunks
    # the extra slots to the first and the last chunk first (they give one to the embedding
    # and the head), then to the chunks after the first
    for c in [0, chunks - 1, *range(1, chunks - 1)][:extra]:
        sizes[c] += 1
    sizes[0] -= 1
    sizes[-1] -= 1
    if min(sizes) < 1:
        raise UsageError(
            f"layers = {layers} over {chunks} chunks leaves a chunk with no layer: "
            "use fewer pipeline or virtual stages"
        )
    assert sum(sizes) == layers
    return tuple(sizes)


def check_pp(spec: ModelSpec, pp: int, virtual: int = 1) -> None:
    """``UsageError`` when the layers cannot give each of ``pp * virtual`` chunks one."""
    chunk_sizes(spec.layers, pp * virtual)


def check_ep(spec: ModelSpec, ep: int) -> None:
    if ep == 1:
        return
    if spec.moe is None:
        raise UsageError(f"ep = {ep} needs a MoE model; {spec.name} has no experts")
    if spec.moe.num_experts % ep:
        raise UsageError(f"moe.num_experts = {spec.moe.num_experts} is not divisible by ep = {ep}")


def tp_local_shape(
    spec: ModelSpec, name: str, shape: tuple[int, ...], tp: int, ep: int = 1
) -> tuple[int, ...]:
    """The shape of parameter ``name`` on one TP (and EP) rank."""
    parts = name.split(".")
    leaf, owner = parts[-1], parts[-2] if len(parts) > 1 else ""
    if owner == "experts":  # stacked [E, F, H] / [E, H, F]
        e = shape[0] // ep
        if leaf == "w2":
            return (e, shape[1], shape[2] // tp)
        return (e, shape[1] // tp, shape[2])
    if tp == 1:
        return shape
    if owner in ("wk", "wv") and spec.mla is None and spec.n_kv_heads < tp:
        return (spec.d_head, *shape[1:])  # one replicated KV head per rank
    if owner in _COL or owner in ("output", "tok_embeddings"):
        return (shape[0] // tp, *shape[1:])
    if owner in _ROW and leaf == "weight":
        return (shape[0], shape[1] // tp)
    return shape


@lru_cache(maxsize=4096)
def _starts(layers: int, chunks: int) -> tuple[int, ...]:
    """The first layer of each chunk."""
    return (0, *itertools.accumulate(chunk_sizes(layers, chunks)))[:-1]


def stage_layers(
    layers: int, pp: int, stage: int, virtual: int = 1, *, v_shape: bool = False
) -> list[int]:
    """The layer ids pipeline rank ``stage`` holds (interleaved when ``virtual`` > 1: chunks
    ``stage, stage + pp, ...``; with ``v_shape``, the zero-bubble V's chunks ``stage`` and
    ``2 pp - 1 - stage``), each chunk as ``chunk_sizes`` splits the layers."""
    sizes = chunk_sizes(layers, pp * virtual)
    starts = _starts(layers, pp * virtual)
    out: list[int] = []
    for c in range(virtual):
        chunk = (stage if c == 0 else 2 * pp - 1 - stage) if v_shape else stage + c * pp
        out += list(range(starts[chunk], starts[chunk] + sizes[chunk]))
    return out


@dataclass(frozen=True, kw_only=True)
class UnitSize:
    """Sizes of one unit of a ``Holding``."""

    name: str
    """Unit name (``embeddings``, ``layers.<i>``, ``layers.<i>.experts``, ``head``)."""
    numel: int
    """Elements of its parameters."""
    matmul: int
    """Elements of its 2-D+ weights outside the embeddings (what autocast casts)."""
    shapes: tuple[tuple[tuple[int, ...], int], ...]
    """``(shape, how many)`` of its parameters."""

    @property
    def expert(self) -> bool:
        return self.name.endswith(".experts")


@dataclass(frozen=True, kw_only=True)
class Holding:
    """Parameters one rank holds on one pipeline stage, after TP/EP, grouped into ZeRO units."""

    units: tuple[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]], ...]
    """``(unit name, ((param name, local shape), ...))`` in forward order; with ep > 1 the routed
    experts of a block form a unit ``layers.<i>.experts``."""
    sizes: tuple[UnitSize, ...] = field(init=False, repr=False, compare=False)
    """Per-unit sizes, computed once."""
    groups: tuple[tuple[UnitSize, int], ...] = field(init=False, repr=False, compare=False)
    """Identical units counted once: ``(a representative unit, how many)``."""

    def __post_init__(self) -> None:
        memo: dict[tuple[bool, tuple[tuple[int, ...], ...]], tuple[int, int, tuple]] = {}
        out = []
        for name, ps in self.units:
            key = (name == "embeddings", tuple(sh for _, sh in ps))
            if key not in memo:
                numel = sum(math.prod(sh) for sh in key[1])
                mm = 0 if key[0] else sum(math.prod(sh) for sh in key[1] if len(sh) >= 2)
                memo[key] = (numel, mm, tuple(Counter(key[1]).items()))
            numel, mm, counts = memo[key]
            out.append(UnitSize(name=name, numel=numel, matmul=mm, shapes=counts))
        object.__setattr__(self, "sizes", tuple(out))
        groups: dict[tuple[str, tuple], list] = {}
        for u in out:
            kind = (
                u.name if u.name in ("embeddings", "head") else ("experts" if u.expert else "block")
            )
            key = (kind, u.shapes)
            if key in groups:
                groups[key][1] += 1
            else:
                groups[key] = [u, 1]
        object.__setattr__(self, "groups", tuple((u, c) for u, c in groups.values()))

    @property
    def numel(self) -> int:
        """Elements of every held parameter."""
        return sum(u.numel for u in self.sizes)

    @property
    def matmul_numel(self) -> int:
        """Elements of every 2-D+ weight outside the embeddings."""
        return sum(u.matmul for u in self.sizes)

    def unit_numels(self, *, experts: bool | None = None) -> list[int]:
        """Elements per unit (``experts``: only expert units / only the others / all)."""
        return [u.numel for u in self.sizes if experts is None or experts == u.expert]

    def shape_counts(self, *, experts: bool | None = None) -> Counter[tuple[int, ...]]:
        """How many parameters of each shape."""
        c: Counter[tuple[int, ...]] = Counter()
        for u in self.sizes:
            if experts is None or experts == u.expert:
                for sh, k in u.shapes:
                    c[sh] += k
        return c

    def shapes(self, *, experts: bool | None = None) -> list[tuple[int, ...]]:
        """Every held parameter's local shape, in order."""
        out = []
        for name, ps in self.units:
            if experts is None or experts == name.endswith(".experts"):
                out += [sh for _, sh in ps]
        return out

    @property
    def tensors(self) -> int:
        return sum(len(ps) for _, ps in self.units)


@lru_cache(maxsize=4096)
def holding(
    spec: ModelSpec,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    stage: int = 0,
    virtual: int = 1,
    vocab_parallel: bool = True,
    v_shape: bool = False,
) -> Holding:
    """What a rank of pipeline ``stage`` holds under ``tp``/``ep`` (cached; specs are hashable).

    ``vocab_parallel=False``: the embeddings and the output layer stay whole on every TP rank
    (torch's ``parallelize_module`` plan over the blocks only); True: split over the
    vocabulary, as parlab's TP and Megatron do. ``v_shape``: the zero-bubble V (two chunks per
    rank, ``stage`` and ``2 pp - 1 - stage``): rank 0 holds the embeddings and the head."""
    vtp = tp if vocab_parallel else 1
    layer_ids = stage_layers(spec.layers, pp, stage, virtual, v_shape=v_shape)
    by_block: dict[bool, list[tuple[str, tuple[int, ...]]]] = {}
    units: list[tuple[str, tuple[tuple[str, tuple[int, ...]], ...]]] = []
    head = spec._norm_shapes("norm", spec.hidden)
    if not spec.tied_embeddings or pp > 1:
        head.append(("output.weight", (spec.vocab_size, spec.hidden)))
    if stage == 0:
        emb = [("tok_embeddings.weight", (spec.vocab_size, spec.hidden))]
        if spec.position == "learned":
            emb.append(("pos_embeddings.weight", (spec.max_seq_len, spec.hidden)))
        units.append(
            ("embeddings", tuple((n, tp_local_shape(spec, n, s, vtp, ep)) for n, s in emb))
        )
    for i in layer_ids:
        kind = spec.is_moe_layer(i)
        if kind not in by_block:
            by_block[kind] = [
                (n, tp_local_shape(spec, n, s, tp, ep)) for n, s in spec.block_shapes(i)
            ]
        params = by_block[kind]
        if ep == 1:  # one unit per block, experts included (as ZeRO's default units)
            units.append((f"layers.{i}", tuple((f"layers.{i}.{n}", s) for n, s in params)))
            continue
        dense = tuple((f"layers.{i}.{n}", s) for n, s in params if ".experts." not in f".{n}")
        units.append((f"layers.{i}", dense))
        exp = tuple((f"layers.{i}.{n}", s) for n, s in params if ".experts." in f".{n}")
        units.append((f"layers.{i}.experts", exp))
    if stage == (0 if v_shape else pp - 1):
        units.append(("head", tuple((n, tp_local_shape(spec, n, s, vtp, ep)) for n, s in head)))
    return Holding(units=tuple(units))


@lru_cache(maxsize=65536)
def unit_dim0_numel(shapes: tuple[tuple[tuple[int, ...], int], ...], shards: int) -> int:
    """Elements a rank holds of a unit under FSDP2 (sum of ``dim0_shard_numel``)."""
    return sum(k * dim0_shard_numel(sh, shards) for sh, k in shapes)


def zero_units(spec: ModelSpec) -> list[tuple[str, int]]:
    """ZeRO units of the whole model (no TP/PP): ``(name, numel)`` in forward order."""
    return [(u.name, u.numel) for u in holding(spec).sizes]

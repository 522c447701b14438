"""The analytic layout of a model on a device mesh: no process group, instant.

Given the degrees of the axes (``pp, dp, cp, tp`` outermost first, ``ep``
splitting ``dp``; see ``parlab.topology``) and a model's shape, it answers:

- the constraint table: every rule a layout must satisfy, each valid or not
  with the reason (checked first, from the raw degrees, so a broken layout is
  explained rather than refused);
- the rank -> coordinate table and the rank groups of every axis, listed the
  way Megatron's ``initialize_model_parallel`` docstring lists them;
- what each rank holds: its pipeline stage's layers, its attention heads (and
  KV heads, GQA-aware), its FFN columns, its vocabulary rows, and its
  sequence chunks -- with causal load balancing, CP rank ``i`` holds chunks
  ``i`` and ``2*cp-1-i`` of ``2*cp`` equal chunks, so every rank does the same
  amount of causal attention work.

Nothing crosses the wire here; ``parlab.parallel`` executes what this module
describes.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.ledger.sharding import chunk_sizes, tp_rules
from parlab.models import get_spec  # type: ignore[attr-defined]
from parlab.topology import AXES, Topology

WHY_ORDER = (
    "axis order pp, dp, cp, tp (outermost first): TP is innermost so its ranks are "
    "consecutive and share the fastest links (it all-reduces or all-gathers/reduce-scatters "
    "activations in every layer); CP next (K/V blocks every attention layer); DP exchanges "
    "gradients once per step; PP is outermost: it sends one activation per micro-batch per "
    "stage boundary and tolerates the slowest links."
)


@dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The dimensions of a Llama-style model that a layout cuts."""

    name: str
    """Model name (catalog name or preset)."""
    layers: int
    """Transformer blocks."""
    heads: int
    """Query heads."""
    kv_heads: int
    """Key/value heads (GQA: fewer than ``heads``)."""
    hidden: int
    """Model width."""
    ffn: int
    """FFN inner width (columns of w1/w3)."""
    vocab: int
    """Vocabulary size (rows of the embedding and the output projection)."""

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


def _attr(spec: Any, *names: str) -> int:
    for n in names:
        v = getattr(spec, n, None)
        if v is not None:
            return int(v)
    raise AssertionError(f"model spec {spec!r} has none of {names}")


def shape_of(spec: Any) -> ModelShape:
    """A ``ModelShape`` from a ``parlab.models`` spec (or any object with the usual names)."""
    if isinstance(spec, ModelShape):
        return spec
    heads = _attr(spec, "n_heads", "heads", "num_attention_heads")
    return ModelShape(
        name=str(getattr(spec, "name", "model")),
        layers=_attr(spec, "n_layers", "layers", "num_hidden_layers"),
        heads=heads,
        kv_heads=int(
            getattr(spec, "n_kv_heads", None)
            or getattr(spec, "kv_heads", None)
            or getattr(spec, "num_key_value_heads", None)
            or heads
        ),
        hidden=_attr(spec, "hidden", "dim", "hidden_size", "d_model"),
        ffn=_attr(spec, "ffn_hidden", "ffn_dim", "ffn", "intermediate_size"),
        vocab=_attr(spec, "vocab_size", "vocab"),
    )


def model_shape(name: str) -> ModelShape:
    """The shape of a catalog model or preset, from ``parlab.models``."""
    return shape_of(get_spec(name))


@dataclass(frozen=True, kw_only=True)
class Constraint:
    """One row of the constraint table."""

    name: str
    """The rule, e.g. ``heads % tp == 0``."""
    ok: bool
    """Whether this layout satisfies it."""
    detail: str
    """The numbers, and the reason or the fix."""


def constraints(
    *,
    world: int,
    degrees: dict[str, int],
    shape: ModelShape,
    seq: int | None = None,
    sequence_parallel: bool = False,
    gpus_per_node: int | None = None,
    vpp: int = 1,
) -> list[Constraint]:
    """Every rule, checked on the raw degrees (before a ``Topology`` can refuse them)."""
    pp, dp, cp, tp = (int(degrees.get(a, 1)) for a in AXES)
    ep = int(degrees.get("ep", 1))
    rows: list[Constraint] = []

    def add(name: str, ok: bool, detail: str) -> None:
        rows.append(Constraint(name=name, ok=ok, detail=detail))

    prod = pp * dp * cp * tp
    add(
        "world == pp*dp*cp*tp",
        prod == world,
        f"{pp}*{dp}*{cp}*{tp} = {prod} vs world {world}"
        + ("" if prod == world else f": choose degrees whose product is {world}"),
    )
    for rule, why in tp_rules(
        tp=tp, heads=shape.heads, kv_heads=shape.kv_heads, ffn=shape.ffn, vocab=shape.vocab
    ):
        add(rule, not why, why or f"splits over tp {tp}: {_per_rank(rule, shape, tp)}")
    split = split_text(shape.layers, pp, vpp)
    add(
        "layers >= pp*vpp (a layer per chunk)",
        not split.startswith("no "),
        f"{shape.layers} layers over {pp} stages x {vpp} chunks: {split}",
    )
    if seq is not None:
        if cp > 1:
            add(
                "seq % (2*cp) == 0",
                seq % (2 * cp) == 0,
                f"seq {seq} into {2 * cp} chunks (causal load balancing: chunk i and 2*cp-1-i)",
            )
        if sequence_parallel:
            local = seq // cp
            add(
                "seq/cp % tp == 0 (SP)",
                seq % cp == 0 and local % tp == 0,
                f"sequence parallel splits the {local} local tokens over tp {tp}",
            )
    elif cp > 1 or sequence_parallel:
        add("seq given", False, "CP and SP cut the sequence: give --seq")
    add(
        "ep divides dp",
        dp % ep == 0,
        f"ep {ep}, dp {dp}: experts are sharded over data-parallel ranks",
    )
    if gpus_per_node is not None:
        add(
            "tp <= gpus per node",
            tp <= gpus_per_node,
            f"tp {tp}, {gpus_per_node} GPUs per node: TP talks every layer, keep it on NVLink",
        )
        inner = tp * cp
        add(
            "tp*cp <= gpus per node (advice)",
            True,
            f"tp*cp = {inner}"
            + (
                ": CP ring stays inside a node"
                if inner <= gpus_per_node
                else ": CP ring crosses nodes (allowed; K/V blocks go over the slower links)"
            ),
        )
    if vpp > 1:
        add("vpp needs pp > 1", pp > 1, f"interleaving {vpp} chunks per rank needs pp > 1")
    return rows


def _span(total: int, parts: int, i: int) -> tuple[int, int]:
    """[start, stop) of part ``i`` of ``total`` split in ``parts`` equal parts."""
    size = total // parts
    return i * size, (i + 1) * size


def cp_chunks(cp: int, index: int, *, load_balance: bool = True) -> list[int]:
    """The sequence chunks CP rank ``index`` holds: ``[i, 2cp-1-i]`` of ``2cp``, or ``[i]`` of ``cp``."""
    return [index, 2 * cp - 1 - index] if load_balance else [index]


def _per_rank(rule: str, shape: ModelShape, tp: int) -> str:
    """What each rank keeps under one tensor-parallel rule."""
    if rule.startswith("heads"):
        return f"{shape.heads // tp} query heads per rank"
    if rule.startswith("kv"):
        kv = shape.kv_heads
        return f"{kv // tp} KV heads per rank" if kv >= tp else "one replicated KV head per rank"
    if rule.startswith("ffn"):
        return f"{shape.ffn // tp} FFN columns per rank"
    return f"{shape.vocab // tp} vocabulary rows per rank"


def stage_layers(layers: int, pp: int, vpp: int = 1) -> list[range]:
    """Layer range of each virtual stage ``s = chunk * pp + rank`` (``pp * vpp`` stages), as
    ``parlab.ledger.sharding.chunk_sizes`` cuts them."""
    sizes = chunk_sizes(layers, pp * vpp)
    starts = [sum(sizes[:s]) for s in range(len(sizes))]
    return [range(a, a + n) for a, n in zip(starts, sizes, strict=True)]


def split_text(layers: int, pp: int, vpp: int = 1) -> str:
    """The stage split in words: ``8 per chunk``, or the uneven counts (``7, 8 x 14, 7``), or
    ``no ...`` where a chunk would hold no layer."""
    try:
        sizes = chunk_sizes(layers, pp * vpp)
    except UsageError as exc:
        return f"no split: {exc}"
    if len(set(sizes)) == 1:
        return f"{sizes[0]} per chunk"
    runs: list[list[int]] = []
    for n in sizes:
        if runs and runs[-1][0] == n:
            runs[-1][1] += 1
        else:
            runs.append([n, 1])
    text = ", ".join(str(n) if k == 1 else f"{n} x {k}" for n, k in runs)
    return f"uneven, layers per chunk {text} (embedding and head counted as a layer each)"


def holdings(
    topo: Topology,
    shape: ModelShape,
    *,
    seq: int | None = None,
    vpp: int = 1,
    ranks: int | None = None,
) -> list[dict[str, Any]]:
    """What each rank holds: layers, heads, KV heads, FFN columns, vocab rows, sequence chunks."""
    stages = stage_layers(shape.layers, topo.pp, vpp)
    out = []
    for rank in range(topo.world_size if ranks is None else ranks):
        c = topo.coords(rank)
        my = [stages[k * topo.pp + c["pp"]] for k in range(vpp)]
        h0, h1 = _span(shape.heads, topo.tp, c["tp"])
        k0, k1 = _span(shape.kv_heads, topo.tp, c["tp"])
        f0, f1 = _span(shape.ffn, topo.tp, c["tp"])
        v0, v1 = _span(shape.vocab, topo.tp, c["tp"])
        entry: dict[str, Any] = {
            "rank": rank,
            "coords": c,
            "stages": [k * topo.pp + c["pp"] for k in range(vpp)],
            "layers": [[r.start, r.stop - 1] for r in my],
            "embedding": c["pp"] == 0,
            "output_head": c["pp"] == topo.pp - 1,
            "heads": [h0, h1 - 1],
            "kv_heads": [k0, k1 - 1],
            "ffn_columns": [f0, f1 - 1],
            "vocab_rows": [v0, v1 - 1],
        }
        if topo.cp > 1:
            chunks = cp_chunks(topo.cp, c["cp"])
            entry["seq_chunks"] = chunks
            if seq is not None:
                size = seq // (2 * topo.cp)
                entry["seq_tokens"] = [[i * size, (i + 1) * size - 1] for i in chunks]
        out.append(entry)
    return out


def describe(
    *,
    world: int,
    degrees: dict[str, int],
    shape: ModelShape,
    seq: int | None = None,
    sequence_parallel: bool = False,
    gpus_per_node: int | None = None,
    vpp: int = 1,
) -> dict[str, Any]:
    """The whole analytic layout as JSON; raises ``UsageError`` naming the failing rows."""
    rows = constraints(
        world=world,
        degrees=degrees,
        shape=shape,
        seq=seq,
        sequence_parallel=sequence_parallel,
        gpus_per_node=gpus_per_node,
        vpp=vpp,
    )
    failing = [r for r in rows if not r.ok]
    if failing:
        raise LayoutError(failing, rows)
    topo = Topology(world_size=world, gpus_per_node=gpus_per_node, **degrees)
    shown = min(world, RANKS_SHOWN)
    groups = {a: _groups(topo, a) for a in (*AXES, "ep")}
    ranks = []
    for r in range(shown):
        c = topo.coords(r)
        ranks.append({"rank": r, **c, **({"node": r // gpus_per_node} if gpus_per_node else {})})
    return {
        "model": asdict(shape),
        "world_size": world,
        "mesh": {**topo.degrees, "ep": topo.ep},
        "axis_order": list(AXES),
        "why_order": WHY_ORDER,
        "seq": seq,
        "sequence_parallel": sequence_parallel,
        "vpp": vpp,
        "stage_split": split_text(shape.layers, topo.pp, vpp),
        "ranks": ranks,
        "groups": groups,
        "holdings": holdings(topo, shape, seq=seq, vpp=vpp, ranks=shown),
        "ranks_shown": shown,
        "constraints": [asdict(r) for r in rows],
    }


RANKS_SHOWN = 1024
"""The rank table and the holdings list their first this many ranks (a layout of a million
ranks is the same pattern repeated); the groups per axis their first ``GROUPS_SHOWN``."""
GROUPS_SHOWN = 64


def _groups(topo: Topology, axis: str) -> list[list[int]]:
    """The first ``GROUPS_SHOWN`` rank groups of ``axis`` (all of them on small meshes)."""
    if topo.world_size <= RANKS_SHOWN:
        return topo.groups(axis)
    size = {"ep": topo.ep}.get(axis) or getattr(topo, axis)
    out = []
    for r in range(topo.world_size):
        c = topo.coords(r)
        if c.get(axis if axis != "ep" else "dp", 0) % size == 0 and len(out) < GROUPS_SHOWN:
            out.append([g for g in _group_of(topo, r, axis)])
        if len(out) >= GROUPS_SHOWN:
            break
    return out


def _group_of(topo: Topology, rank: int, axis: str) -> list[int]:
    """The ranks of ``axis``'s group that starts at ``rank`` (rank order pp, dp, cp, tp)."""
    stride = {"tp": 1, "cp": topo.tp, "dp": topo.tp * topo.cp, "ep": topo.tp * topo.cp,
              "pp": topo.tp * topo.cp * topo.dp}[axis]  # fmt: skip
    size = topo.ep if axis == "ep" else getattr(topo, axis)
    return [rank + i * stride for i in range(size)]


class LayoutError(UsageError):
    """A layout that breaks one or more rows of the constraint table."""

    def __init__(self, failing: list[Constraint], rows: list[Constraint]) -> None:
        self.failing = failing
        self.rows = rows
        text = "; ".join(f"{r.name} fails ({r.detail})" for r in failing)
        super().__init__(f"layout breaks the constraint table: {text}")

"""The one topology object: named parallel axes, passed explicitly, never global.

``Topology`` holds the degrees of each axis and answers, by arithmetic alone
(no process group), which coordinate a rank has and which ranks share an axis.
``build_mesh`` turns it into a torch ``DeviceMesh`` (skipping size-1 axes), the
only place a mesh is made from it.

Axis order, outermost to innermost: ``pp, dp, cp, tp``. TP is innermost so
that its ranks are consecutive and share the fastest links (NVLink inside a
node): it communicates every layer. PP is outermost: it sends only activations
between stages, once per micro-batch, and tolerates the slowest links. ``ep``
(expert parallel) is not an extra factor of the world: it splits the ``dp``
axis (experts are sharded over data-parallel ranks, as in torchtitan and
DeepSpeed-MoE), so ``ep`` must divide ``dp``.

Example (world 16, pp 2, dp 2, tp 4)::

    rank = ((pp * dp_deg + dp) * cp_deg + cp) * tp_deg + tp
    tp groups: [0,1,2,3] [4,5,6,7] [8,9,10,11] [12,13,14,15]
    dp groups: [0,4] [1,5] [2,6] [3,7] [8,12] [9,13] [10,14] [11,15]
    pp groups: [0,8] [1,9] ... [7,15]
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError

AXES = ("pp", "dp", "cp", "tp")
"""Mesh axes, outermost first."""


@dataclass(frozen=True, kw_only=True)
class Topology:
    """Degrees of the parallel axes over ``world_size`` ranks."""

    world_size: int
    """Total ranks; must equal pp x dp x cp x tp."""
    dp: int = 1
    """Data parallel (DDP replicas, or ZeRO/FSDP shards)."""
    tp: int = 1
    """Tensor parallel (heads and FFN columns)."""
    pp: int = 1
    """Pipeline parallel (layer stages)."""
    cp: int = 1
    """Context parallel (sequence chunks)."""
    ep: int = 1
    """Expert parallel: a split of the dp axis; must divide dp."""
    gpus_per_node: int | None = None
    """Ranks per node, when known: TP must fit inside one node."""

    def __post_init__(self) -> None:
        for name in ("world_size", "dp", "tp", "pp", "cp", "ep"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise UsageError(
                    f"{name} = {value!r}: every degree must be a whole number of at least 1"
                )
        product = self.pp * self.dp * self.cp * self.tp
        if product != self.world_size:
            raise UsageError(
                f"pp x dp x cp x tp = {self.pp}x{self.dp}x{self.cp}x{self.tp} = {product}, "
                f"not the world size {self.world_size}: choose degrees whose product is {self.world_size}"
            )
        if self.dp % self.ep:
            raise UsageError(
                f"ep = {self.ep} does not divide dp = {self.dp}: expert parallelism splits the dp axis"
            )
        if self.gpus_per_node is not None and self.tp > self.gpus_per_node:
            raise UsageError(
                f"tp = {self.tp} is larger than the {self.gpus_per_node} GPUs of a node: keep TP within a node"
            )

    @classmethod
    def from_degrees(cls, world_size: int | None = None, **degrees: int) -> Topology:
        """Build from degrees; ``world_size`` defaults to their product."""
        d = {k: int(v) for k, v in degrees.items() if v is not None}
        if world_size is None:
            world_size = d.get("pp", 1) * d.get("dp", 1) * d.get("cp", 1) * d.get("tp", 1)
        return cls(world_size=world_size, **d)

    @property
    def degrees(self) -> dict[str, int]:
        """Axis -> degree, outermost first (all four axes)."""
        return {a: getattr(self, a) for a in AXES}

    @property
    def mesh_axes(self) -> dict[str, int]:
        """Axis -> degree for the axes larger than 1 (what ``build_mesh`` makes)."""
        return {a: d for a, d in self.degrees.items() if d > 1}

    def coords(self, rank: int) -> dict[str, int]:
        """The coordinate of ``rank`` on every axis (and ``ep``, its index inside its dp group)."""
        if not 0 <= rank < self.world_size:
            raise UsageError(f"rank {rank} is outside 0..{self.world_size - 1}")
        out: dict[str, int] = {}
        rest = rank
        for axis in reversed(AXES):
            deg = getattr(self, axis)
            out[axis] = rest % deg
            rest //= deg
        out = {a: out[a] for a in AXES}
        out["ep"] = out["dp"] % self.ep
        return out

    def rank_of(self, **coords: int) -> int:
        """The rank at a coordinate (axes left out are 0)."""
        rank = 0
        for axis in AXES:
            c = coords.get(axis, 0)
            deg = getattr(self, axis)
            if not 0 <= c < deg:
                raise UsageError(f"{axis} coordinate {c} is outside 0..{deg - 1}")
            rank = rank * deg + c
        return rank

    def groups(self, axis: str) -> list[list[int]]:
        """The rank groups along ``axis`` (ranks that differ only in that coordinate).

        ``ep`` groups are runs of ``ep`` consecutive dp coordinates.
        """
        if axis == "ep":
            out = []
            for g in self.groups("dp"):
                out += [g[i : i + self.ep] for i in range(0, len(g), self.ep)]
            return out
        if axis not in AXES:
            raise UsageError(f"unknown axis {axis!r}: use one of {', '.join((*AXES, 'ep'))}")
        others = [a for a in AXES if a != axis]
        groups = []
        for fixed in itertools.product(*(range(getattr(self, a)) for a in others)):
            base = dict(zip(others, fixed, strict=True))
            groups.append([self.rank_of(**base, **{axis: i}) for i in range(getattr(self, axis))])
        return sorted(groups)

    def group_of(self, axis: str, rank: int) -> list[int]:
        """The group along ``axis`` that holds ``rank``."""
        for g in self.groups(axis):
            if rank in g:
                return g
        raise AssertionError("every rank is in one group per axis")

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "mesh": {**self.degrees, "ep": self.ep}}

    def build_mesh(self, device_type: str) -> Any:
        """A torch ``DeviceMesh`` over the axes larger than 1 (a 1-D ``dp`` mesh when all are 1).

        Needs an initialised default process group.
        """
        from torch.distributed.device_mesh import init_device_mesh  # lazy: torch

        axes = self.mesh_axes or {"dp": 1}
        return init_device_mesh(
            device_type, tuple(axes.values()), mesh_dim_names=tuple(axes.keys())
        )

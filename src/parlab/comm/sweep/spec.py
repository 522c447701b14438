"""What a collectives sweep measures: ``SweepSpec`` (nccl-tests' options, the mesh axis, the
launcher) and the environment defaults its ranks get.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from parlab.comm import ops as O
from parlab.comm.bench import VIAS
from parlab.errors import UsageError
from parlab.topology import AXES, Topology
from parlab.units import parse_degrees

GRAPH_ENV = (("NCCL_GRAPH_MIXING_SUPPORT", "0"),)
"""What ``--graph`` sweeps set on the ranks unless the environment already does. NCCL's
graph-mixing support (on by default) fences every captured collective with NCCL-internal
events so that graphs can run beside eager NCCL calls; the sweep never overlaps the two (it
synchronises the device between replays and its eager bookkeeping), and on 2xH200 the
support tripled a small all_reduce's time per op in a replayed graph (about 15 us against
5 us; benchmarks/collectives_small_probe.py). nccl-tests' ``-G`` runs nothing beside its
graphs either."""
FR_ENV = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""torch's flight recorder (on by default since torch 2.6) records every collective before
issuing it: bookkeeping that is not the collective. Sweeps turn it off
(``TORCH_FR_BUFFER_SIZE=0``) unless either name is set. On 2xH200 it made no measurable
difference to the small all_reduce (mean 38.1 us per op off, 40.5 us on;
benchmarks/collectives_vs_nccl_tests.py results)."""


def rank_env(graph: bool, environ: dict[str, str] | None = None) -> tuple[tuple[str, str], ...]:
    """The environment defaults a sweep's ranks get (``LaunchConfig.env_defaults``)."""
    environ = dict(os.environ) if environ is None else environ
    out: list[tuple[str, str]] = []
    if not any(k in environ for k in FR_ENV):
        out.append((FR_ENV[0], "0"))
    if graph:
        out.extend(GRAPH_ENV)
    return tuple(out)


def parse_mesh(text: str | None) -> dict[str, int] | None:
    """``dp=2,tp=4`` -> ``{"dp": 2, "tp": 4}`` (``parlab.units.parse_degrees``)."""
    return parse_degrees(text, AXES, "--mesh", "dp=2,tp=4") if text else None


@dataclass(frozen=True, kw_only=True)
class SweepSpec:
    """What to measure: nccl-tests' options plus parlab's mesh axis and launcher."""

    ops: tuple[str, ...]
    """Ops in run order (``parlab.comm.ops.OPS`` names)."""
    minbytes: int = 8
    """Smallest size (nccl-tests -b)."""
    maxbytes: int = 1 << 20
    """Largest size (nccl-tests -e)."""
    stepfactor: int = 2
    """Multiplicative step between sizes (nccl-tests -f)."""
    dtype: str = "float"
    """Element type (nccl-tests -d)."""
    warmup: int = 5
    """Untimed iterations per size (nccl-tests -w)."""
    iters: int = 20
    """Timed iterations per size (nccl-tests -n)."""
    inplace: bool = False
    """In-place buffers for the ops that have both forms (all_gather, reduce_scatter)."""
    graph: bool = False
    """Capture each timed loop in a CUDA graph and time its replays (nccl-tests -G); GPUs only."""
    via: str = "torch"
    """Who issues the ops: ``torch`` (c10d) or ``nccl`` (NCCL through ctypes; GPUs only)."""
    mesh: dict[str, int] | None = None
    """Mesh degrees (``Topology`` axes) when measuring a sub-group."""
    axis: str | None = None
    """The mesh axis whose groups run the collectives (None: the whole world)."""
    nproc: int = 2
    """Ranks (torchrun --nproc-per-node)."""
    backend: str = "auto"
    """``auto``, ``nccl`` or ``gloo``."""
    timeout_s: float = 300.0
    """Process-group timeout, seconds."""

    def __post_init__(self) -> None:
        if not self.ops:
            raise UsageError("no ops to measure: pass --op all or a list")
        O.size_range(self.minbytes, self.maxbytes, self.stepfactor)
        O.parse_dtype(self.dtype)
        if self.warmup < 0:
            raise UsageError(f"-w/--warmup-iters {self.warmup} is negative: use 0 or more")
        if self.iters < 1:
            raise UsageError(f"-n/--iters {self.iters} must be at least 1")
        if self.nproc < 1:
            raise UsageError(f"--nproc {self.nproc} is below 1: run at least one rank")
        if self.via not in VIAS:
            raise UsageError(f"--via {self.via!r} is not one of {', '.join(VIAS)}: pick one")
        if self.via == "nccl" and set(self.ops) == {"barrier"}:
            raise UsageError(
                "--op barrier has no NCCL call to issue directly: measure it with --via torch"
            )
        if self.axis is not None and not self.mesh:
            raise UsageError(f"--axis {self.axis} needs --mesh (e.g. --mesh dp=2,tp=4)")
        if self.mesh:
            Topology(world_size=self.nproc, **self.mesh)  # degrees must multiply to nproc
            if self.axis is None:
                raise UsageError("--mesh needs --axis naming the axis to measure (e.g. --axis tp)")
            if self.axis not in self.mesh:
                raise UsageError(
                    f"--axis {self.axis} is not in --mesh {self.mesh_text}: "
                    f"use one of {', '.join(self.mesh)}"
                )
            if self.mesh[self.axis] < 2:
                raise UsageError(
                    f"axis {self.axis} has degree 1: nothing crosses the wire; pick an axis of 2+"
                )

    @property
    def mesh_text(self) -> str:
        return ",".join(f"{k}={v}" for k, v in (self.mesh or {}).items())

    @property
    def group_size(self) -> int:
        """n, the ranks of each group the collectives run over."""
        return self.mesh[self.axis] if self.mesh and self.axis else self.nproc

    @property
    def sizes(self) -> list[int]:
        return O.size_range(self.minbytes, self.maxbytes, self.stepfactor)

    def plan(self) -> list[tuple[str, int, int]]:
        """``(op, requested, rounded)`` for every measurement the ranks will make, in order."""
        elem = O.parse_dtype(self.dtype).itemsize
        n = self.group_size
        out = []
        for op in self.ops:
            if op == "barrier":
                if self.via == "torch":  # NCCL has no barrier call: not run with --via nccl
                    out.append((op, 0, 0))
                continue
            if op == "send_recv" and n < 2:
                continue
            out.extend((op, s, r) for s, r in O.op_sizes(op, self.sizes, n, elem))
        return out

"""The latency-bandwidth (alpha-beta) cost model of the collectives: analytic, no process group.

A message of S bytes over one link costs ``alpha + S * beta``: ``alpha`` is the
per-step latency (seconds), ``beta`` the time per byte (1 / bandwidth per
direction). Each algorithm is a number of latency steps and a number of bytes
through the busiest link, so over n ranks

    t = k_alpha(n) * alpha + k_beta(n) * S * beta

with S as ``parlab.comm.ops`` defines it (the whole gathered/scattered buffer
for all-gather, reduce-scatter and all-to-all). The coefficients
(Thakur, Rabenseifner & Gropp 2005; Patarasuk & Yuan 2009; NCCL's
double binary trees, Jeaugey 2019):

================== ==================== ====================== ==========================
op                 ring k_alpha         ring k_beta            tree k_alpha / k_beta
================== ==================== ====================== ==========================
all_reduce         2(n-1)               2(n-1)/n               2 log2 n / 2 (reduce + bcast)
all_gather         n-1                  (n-1)/n                log2 n / (n-1)/n (rec. doubling)
reduce_scatter     n-1                  (n-1)/n                log2 n / (n-1)/n (rec. halving)
all_to_all         n-1 (pairwise)       (n-1)/n                log2 n / (log2 n)/2 (Bruck)
broadcast, reduce  n-1 (pipelined chain) 1                     log2 n / 1 (pipelined tree)
send_recv          1                    1                      1 / 1
barrier            2(n-1)               0                      2 log2 n / 0
================== ==================== ====================== ==========================

(log2 n rounds up.) For the ring, k_beta equals nccl-tests' busbw factor, so a
fitted ``beta`` is 1 / (the busbw the op tends to at large S), and
``1 / beta`` compares directly with a link's per-direction bandwidth.

Hierarchical (``hierarchical_time``): g GPUs per node on an intra-node link,
m nodes on a network link. All-reduce is reduce-scatter inside the node,
all-reduce of S/g across nodes, all-gather inside the node; all-gather and
reduce-scatter run the inter-node step on S/g then the intra-node step on S;
all-to-all sends (g-1)/n of S over the node's link and (n-g)/n of S over the
network; broadcast/reduce pipeline a chain across nodes then within each node.
With m = 1 (or g = 1) every formula reduces to the flat ring.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from parlab.errors import UsageError
from parlab.hardware import catalog

ALGORITHMS = ("ring", "tree")
OPS = (
    "all_reduce", "all_gather", "reduce_scatter", "all_to_all", "all_to_all_uneven",
    "broadcast", "reduce", "send_recv", "barrier",
)  # fmt: skip
"""The ops this model prices (``parlab.comm.ops`` names; no torch needed here)."""


@dataclass(frozen=True, kw_only=True)
class Link:
    """One class of link between ranks, in alpha-beta terms."""

    alpha_s: float | None
    """Latency per algorithm step, seconds; None: unknown (the latency term is left out)."""
    beta_s_per_byte: float
    """Seconds per byte per direction (1 / bandwidth)."""
    source: str = ""
    """Where the numbers come from (a calibration run id, the catalog, ...)."""

    def __post_init__(self) -> None:
        if self.beta_s_per_byte <= 0:
            raise ValueError(f"beta {self.beta_s_per_byte} must be positive (seconds per byte)")
        if self.alpha_s is not None and self.alpha_s < 0:
            raise ValueError(f"alpha {self.alpha_s} must not be negative (seconds)")

    @classmethod
    def from_bandwidth(cls, bw_bytes_per_s: float, alpha_s: float | None, source: str) -> Link:
        """A link of ``bw_bytes_per_s`` per direction."""
        return cls(alpha_s=alpha_s, beta_s_per_byte=1.0 / bw_bytes_per_s, source=source)

    @property
    def bandwidth(self) -> float:
        """Bytes/s per direction."""
        return 1.0 / self.beta_s_per_byte


def _log2(n: int) -> int:
    return math.ceil(math.log2(n)) if n > 1 else 0


def coefficients(op: str, n: int, algorithm: str = "ring") -> tuple[float, float]:
    """``(k_alpha, k_beta)`` for ``op`` over ``n`` ranks (see the module table)."""
    if op not in OPS:
        raise UsageError(f"unknown op {op!r}: use one of {', '.join(OPS)}")
    if algorithm not in ALGORITHMS:
        raise UsageError(f"unknown algorithm {algorithm!r}: use ring or tree")
    if n < 1:
        raise UsageError(f"n = {n}: a collective needs at least one rank")
    if n == 1:
        return 0.0, 0.0
    frac = (n - 1) / n
    lg = _log2(n)
    ring = algorithm == "ring"
    if op == "all_reduce":
        return (2 * (n - 1), 2 * frac) if ring else (2 * lg, 2.0)
    if op in ("all_gather", "reduce_scatter"):
        return (n - 1, frac) if ring else (lg, frac)
    if op in ("all_to_all", "all_to_all_uneven"):
        return (n - 1, frac) if ring else (lg, lg / 2)
    if op in ("broadcast", "reduce"):
        return (n - 1, 1.0) if ring else (lg, 1.0)
    if op == "send_recv":
        return 1.0, 1.0
    assert op == "barrier"
    return (2 * (n - 1), 0.0) if ring else (2 * lg, 0.0)


def collective_time(op: str, nbytes: float, n: int, link: Link, algorithm: str = "ring") -> float:
    """Predicted seconds for one ``op`` of ``nbytes`` over ``n`` ranks on ``link``.

    The latency term is left out when ``link.alpha_s`` is unknown (a bandwidth-only
    lower bound).
    """
    ka, kb = coefficients(op, n, algorithm)
    alpha = link.alpha_s or 0.0
    return ka * alpha + kb * nbytes * link.beta_s_per_byte


def busbw(op: str, nbytes: float, n: int, seconds: float) -> float:
    """nccl-tests' bus bandwidth (bytes/s) of one ``op`` of ``nbytes`` that took ``seconds``."""
    from parlab.comm.ops import busbw_factor  # lazy: torch

    return nbytes / seconds * busbw_factor(op, n) if seconds > 0 else 0.0


def hierarchical_time(
    op: str,
    nbytes: float,
    *,
    gpus_per_node: int,
    nodes: int,
    intra: Link,
    inter: Link,
    algorithm: str = "best",
) -> float:
    """Predicted seconds for ``op`` over ``gpus_per_node x nodes`` ranks, two link classes.

    All-reduce's step between nodes runs as a ring (``2(m - 1)`` latency steps) or a tree
    (``2 log2 m`` latency steps, ``2 S`` through the busiest link: NCCL's double binary tree); ``best`` takes the faster of the two, as NCCL's tuner picks between them by size and
    node count (at thousands of nodes the ring's latency dominates all but the largest
    messages). The other ops run their ring."""
    if algorithm == "best" and op == "all_reduce" and nodes > 1 and gpus_per_node >= 1:
        kw = dict(gpus_per_node=gpus_per_node, nodes=nodes, intra=intra, inter=inter)
        return min(hierarchical_time(op, nbytes, algorithm=a, **kw) for a in ALGORITHMS)
    g, m = gpus_per_node, nodes
    if g < 1 or m < 1:
        raise UsageError(f"gpus_per_node {g} and nodes {m} must be at least 1")
    n = g * m
    a1, b1 = intra.alpha_s or 0.0, intra.beta_s_per_byte
    a2, b2 = inter.alpha_s or 0.0, inter.beta_s_per_byte
    S = float(nbytes)
    tree = algorithm == "tree" and op == "all_reduce"
    if m == 1:
        return collective_time(op, S, g, intra)
    if g == 1:
        return collective_time(op, S, m, inter, "tree" if tree else "ring")

    def ring_rs(k: int, size: float, a: float, b: float) -> float:
        return (k - 1) * a + (k - 1) / k * size * b

    if op == "all_reduce":
        between = (
            collective_time(op, S / g, m, inter, "tree") if tree else 2 * ring_rs(m, S / g, a2, b2)
        )
        return 2 * ring_rs(g, S, a1, b1) + between
    if op in ("all_gather", "reduce_scatter"):
        return ring_rs(m, S / g, a2, b2) + ring_rs(g, S, a1, b1)
    if op in ("all_to_all", "all_to_all_uneven"):
        return (g - 1) * a1 + (g - 1) / n * S * b1 + (n - g) * a2 + (n - g) / n * S * b2
    if op in ("broadcast", "reduce"):
        return (m - 1) * a2 + (g - 1) * a1 + S * max(b1, b2)
    if op == "send_recv":
        return a2 + S * b2  # the ring crosses a node boundary: the slowest hop sets the pace
    if op == "barrier":
        return 2 * (g - 1) * a1 + 2 * (m - 1) * a2
    raise UsageError(f"unknown op {op!r}: use one of {', '.join(OPS)}")


def link_peak(environment: dict, ranks: list[int] | None = None) -> tuple[float | None, str]:
    """The topology's per-direction peak (bytes/s) between ``ranks``, and where it comes from.

    From the environment snapshot's interconnect (``parlab env``: NVLink count x
    per-link speed), the slowest pair among ``ranks`` (a ring is as fast as its
    slowest link); else the catalog's link bandwidth for the GPU; else unknown.
    """
    hw = (environment or {}).get("hardware") or {}
    gpus = hw.get("gpus") or []
    if not gpus:
        return None, "no GPU: no link peak"
    inter = hw.get("interconnect") or {}
    matrix = inter.get("per_direction_bw")
    ranks = list(range(len(gpus))) if ranks is None else ranks
    if matrix and ranks and all(r < len(matrix) for r in ranks):
        pairs = [matrix[i][j] for i in ranks for j in ranks if i != j]
        if pairs and all(p for p in pairs):
            src = inter.get("per_link_bw_source") or inter.get("source") or "interconnect"
            return float(min(pairs)), f"parlab env interconnect ({src})"
    spec = catalog.lookup(gpus[0]["name"])
    if spec is not None:
        return spec.link_bw, f"catalog {spec.name} {spec.link} link bandwidth"
    return None, f"unknown GPU {gpus[0]['name']!r}: no link peak"

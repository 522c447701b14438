"""Pipeline schedules as data: per-rank action lists, a simulator, a step x rank grid.

An ``Action`` is (stage, F|B, micro-batch), written like PyTorch's pipelining
does: ``1F0`` is stage 1, forward, micro-batch 0. A schedule is one list of
actions per pipeline rank; rank ``r`` holds stages ``r, r+p, ..., r+(v-1)p``
(``v`` = virtual stages per rank, 1 unless interleaved). Nothing here touches
a process group: ``pipeline.run_schedule`` executes these lists with send/recv,
``simulate`` replays them with fixed action times to get the timeline and the
bubble, and the tests check both.

Bubble (idle time over the step, same for every rank, forward ``t_f`` and
backward ``t_b`` per micro-batch per whole-model stage):

| schedule | idle / step time | idle / compute time |
|---|---|---|
| GPipe, 1F1B | (p-1)/(m+p-1) | (p-1)/m |
| interleaved 1F1B (v chunks) | (p-1)/(v*m+p-1) | (p-1)/(v*m) |

1F1B has GPipe's bubble but keeps at most ``p - r`` micro-batches' activations
alive on rank ``r`` (GPipe keeps all ``m``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError
from parlab.ledger.activations import bubble_fraction

SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


@dataclass(frozen=True, kw_only=True)
class Action:
    """One unit of pipeline work."""

    stage: int
    """Stage index (virtual stage with interleaving)."""
    kind: str
    """``F`` (forward) or ``B`` (backward)."""
    mb: int
    """Micro-batch index."""

    def __str__(self) -> str:
        return f"{self.stage}{self.kind}{self.mb}"


def _check(p: int, m: int, v: int) -> None:
    if p < 1 or m < 1 or v < 1:
        raise UsageError(f"pp {p}, micro-batches {m}, vpp {v}: each must be at least 1")


def gpipe(p: int, m: int) -> list[list[Action]]:
    """All forwards, then all backwards (Huang et al. 2019)."""
    _check(p, m, 1)
    return [
        [Action(stage=r, kind="F", mb=i) for i in range(m)]
        + [Action(stage=r, kind="B", mb=i) for i in range(m)]
        for r in range(p)
    ]


def one_f_one_b(p: int, m: int) -> list[list[Action]]:
    """PipeDream-flush 1F1B: ``p-r-1`` warm-up forwards, then alternate, then drain."""
    _check(p, m, 1)
    out = []
    for r in range(p):
        warm = min(p - r - 1, m)
        acts = [Action(stage=r, kind="F", mb=i) for i in range(warm)]
        for i in range(m - warm):
            acts += [Action(stage=r, kind="F", mb=warm + i), Action(stage=r, kind="B", mb=i)]
        acts += [Action(stage=r, kind="B", mb=i) for i in range(m - warm, m)]
        out.append(acts)
    return out


def interleaved_1f1b(p: int, m: int, v: int) -> list[list[Action]]:
    """Megatron's interleaved 1F1B: rank r runs stages r + k*p, k < v; needs m % p == 0."""
    _check(p, m, v)
    if m % p:
        raise UsageError(
            f"interleaved 1F1B needs micro-batches ({m}) divisible by pp ({p}): choose m = k*{p}"
        )
    total = m * v
    group = p * v

    def mb_of(k: int) -> int:
        return (k // group) * p + k % p

    out = []
    for r in range(p):

        def fwd(k: int, r: int = r) -> Action:
            return Action(stage=((k % group) // p) * p + r, kind="F", mb=mb_of(k))

        def bwd(k: int, r: int = r) -> Action:
            return Action(stage=(v - 1 - (k % group) // p) * p + r, kind="B", mb=mb_of(k))

        warm = min((p - r - 1) * 2 + (v - 1) * p, total)
        acts = [fwd(k) for k in range(warm)]
        for i in range(total - warm):
            acts += [fwd(warm + i), bwd(i)]
        acts += [bwd(k) for k in range(total - warm, total)]
        out.append(acts)
    return out


def build(name: str, p: int, m: int, v: int = 1) -> list[list[Action]]:
    """The schedule called ``name`` (one of ``SCHEDULES``)."""
    if name == "gpipe":
        return gpipe(p, m)
    if name == "1f1b":
        return one_f_one_b(p, m)
    if name == "interleaved-1f1b":
        return interleaved_1f1b(p, m, v)
    raise UsageError(f"unknown schedule {name!r}: use one of {', '.join(SCHEDULES)}")


def n_stages(schedule: list[list[Action]]) -> int:
    return 1 + max(a.stage for acts in schedule for a in acts)


@dataclass(frozen=True, kw_only=True)
class Timeline:
    """A simulated run of a schedule."""

    spans: list[list[tuple[float, float, Action]]]
    """Per rank: (start, end, action) in execution order."""
    makespan: float
    """Time from the first start to the last end."""

    def bubble(self) -> float:
        """Idle time over the step, averaged over ranks."""
        busy = [sum(e - s for s, e, _ in spans) for spans in self.spans]
        return 1.0 - sum(busy) / (len(busy) * self.makespan)

    def peak_in_flight(self) -> list[int]:
        """Per rank: most micro-batches forwarded but not yet backwarded at once."""
        out = []
        for spans in self.spans:
            alive, peak = 0, 0
            for _, _, a in spans:
                alive += 1 if a.kind == "F" else -1
                peak = max(peak, alive)
            out.append(peak)
        return out


def simulate(schedule: list[list[Action]], *, t_f: float = 1.0, t_b: float = 2.0) -> Timeline:
    """Replay the per-rank lists with fixed times per action (per virtual stage: ``t/v``).

    Dependencies: ``sF i`` needs ``(s-1)F i``; ``sB i`` needs ``sF i`` and
    ``(s+1)B i``. Raises ``ValueError`` if the lists deadlock (a wrong schedule).
    """
    p = len(schedule)
    stages = n_stages(schedule)
    v = stages // p
    done: dict[tuple[int, str, int], float] = {}
    free = [0.0] * p
    pos = [0] * p
    spans: list[list[tuple[float, float, Action]]] = [[] for _ in range(p)]
    remaining = sum(len(a) for a in schedule)
    while remaining:
        progressed = False
        for r in range(p):
            while pos[r] < len(schedule[r]):
                a = schedule[r][pos[r]]
                deps = []
                if a.kind == "F" and a.stage > 0:
                    deps.append((a.stage - 1, "F", a.mb))
                if a.kind == "B":
                    deps.append((a.stage, "F", a.mb))
                    if a.stage < stages - 1:
                        deps.append((a.stage + 1, "B", a.mb))
                if any(d not in done for d in deps):
                    break
                start = max([free[r], *(done[d] for d in deps)])
                end = start + (t_f if a.kind == "F" else t_b) / v
                done[(a.stage, a.kind, a.mb)] = end
                spans[r].append((start, end, a))
                free[r] = end
                pos[r] += 1
                remaining -= 1
                progressed = True
        if not progressed:
            stuck = {r: str(schedule[r][pos[r]]) for r in range(p) if pos[r] < len(schedule[r])}
            raise ValueError(f"schedule deadlocks: ranks wait on {stuck}")
    return Timeline(spans=spans, makespan=max(free))


def formula(name: str, p: int, m: int, v: int = 1) -> dict[str, float]:
    """The analytic bubble: ``of_step`` (idle / step time) and ``of_compute`` (idle / busy)."""
    idle = bubble_fraction(p, m, v if name == "interleaved-1f1b" else 1)
    return {"of_step": idle / (1 + idle), "of_compute": idle}


def grid(schedule: list[list[Action]], *, t_f: float = 1.0, t_b: float = 1.0) -> list[list[str]]:
    """Step x rank cells (``""`` = idle) from a simulation with unit-sized actions."""
    tl = simulate(schedule, t_f=t_f, t_b=t_b)
    v = n_stages(schedule) // len(schedule)
    unit = min(t_f, t_b) / v
    steps = round(tl.makespan / unit)
    cells = [[""] * len(schedule) for _ in range(steps)]
    for r, spans in enumerate(tl.spans):
        for s, e, a in spans:
            for k in range(round(s / unit), round(e / unit)):
                cells[k][r] = str(a)
    return cells


def format_grid(schedule: list[list[Action]], **kw: Any) -> str:
    """The grid as text: one line per step, one column per rank (as torch's pipelining prints)."""
    cells = grid(schedule, **kw)
    width = max(4, *(len(c) for row in cells for c in row))
    head = "step  " + " ".join(f"{'rank ' + str(r):>{width}}" for r in range(len(schedule)))
    lines = [head]
    for k, row in enumerate(cells):
        lines.append(f"{k:>4}  " + " ".join(f"{c or '.':>{width}}" for c in row))
    return "\n".join(lines)

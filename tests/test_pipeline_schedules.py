"""Pipeline schedules as data: completeness, no deadlock, bubble = formula, memory, the grid."""

from __future__ import annotations

import pytest

from parlab.errors import UsageError
from parlab.parallel.pipeline_schedules import (
    build,
    format_grid,
    formula,
    one_f_one_b,
    simulate,
)

CASES = [("gpipe", p, m, 1) for p in (1, 2, 4) for m in (1, 4, 8)]
CASES += [("1f1b", p, m, 1) for p in (1, 2, 4) for m in (1, 4, 8)]
CASES += [("interleaved-1f1b", p, m, v) for p in (2, 4) for m in (4, 8) for v in (2, 3)]


@pytest.mark.parametrize(("name", "p", "m", "v"), CASES)
def test_schedule_complete_and_matches_formula(name: str, p: int, m: int, v: int) -> None:
    sched = build(name, p, m, v)
    assert len(sched) == p
    for r, acts in enumerate(sched):
        want = {(s, k, i) for s in range(r, p * v, p) for k in "FB" for i in range(m)}
        assert sorted((a.stage, a.kind, a.mb) for a in acts) == sorted(want)
    for t_f, t_b in ((1.0, 1.0), (1.0, 2.0)):
        tl = simulate(sched, t_f=t_f, t_b=t_b)
        assert tl.bubble() == pytest.approx(formula(name, p, m, v)["of_step"], abs=1e-9)


def test_1f1b_keeps_fewer_microbatches_alive_than_gpipe() -> None:
    assert simulate(build("gpipe", 4, 8)).peak_in_flight() == [8, 8, 8, 8]
    assert simulate(build("1f1b", 4, 8)).peak_in_flight() == [4, 3, 2, 1]


def test_grid_prints_steps_by_rank() -> None:
    text = format_grid(one_f_one_b(2, 2))
    lines = text.splitlines()
    assert lines[0].split() == ["step", "rank", "0", "rank", "1"]
    assert lines[1].split() == ["0", "0F0", "."]
    assert lines[2].split() == ["1", "0F1", "1F0"]
    assert len(lines) == 1 + 6  # (m + p - 1) * 2 unit steps


def test_bad_schedules_are_refused() -> None:
    with pytest.raises(UsageError, match="divisible by pp"):
        build("interleaved-1f1b", 4, 6, 2)
    with pytest.raises(UsageError, match="unknown schedule"):
        build("zero-bubble", 2, 4)
    broken = build("1f1b", 2, 2)
    broken[1] = list(reversed(broken[1]))
    with pytest.raises(ValueError, match="deadlocks"):
        simulate(broken)


def _lockstep_bubble(name: str, p: int, m: int, v: int, t_f: float, t_b: float) -> float:
    """Replay ``lockstep`` slots the way the executor waits: a rank starts its slot-t
    action after its own previous action and after every message it receives at slot t."""
    from parlab.parallel.pipeline import _message, lockstep
    from parlab.parallel.pipeline_schedules import n_stages

    sched = build(name, p, m, v)
    slots = lockstep(sched)
    n = n_stages(sched)
    free, busy, end_of = [0.0] * p, [0.0] * p, {}
    for t in range(len(slots.starts[0])):
        ready = list(free)
        for q in range(p):
            a = slots.ends[q][t]
            msg = _message(a, n) if a is not None else None
            if msg is not None:
                dst = msg[1] % p
                ready[dst] = max(ready[dst], end_of[(q, str(a))])
        for r in range(p):
            a = slots.starts[r][t]
            if a is not None:
                d = (t_f if a.kind == "F" else t_b) / v
                end_of[(r, str(a))] = ready[r] + d
                free[r] = ready[r] + d
                busy[r] += d
    return 1 - sum(busy) / (p * max(free))


@pytest.mark.parametrize(
    ("name", "p", "m", "v"),
    [("gpipe", 2, 8, 1), ("1f1b", 2, 8, 1), ("1f1b", 4, 8, 1), ("interleaved-1f1b", 2, 8, 2)],
)
def test_executor_lockstep_adds_no_bubble(name: str, p: int, m: int, v: int) -> None:
    from parlab.parallel.pipeline import lockstep

    starts = lockstep(build(name, p, m, v)).starts
    for r, acts in enumerate(build(name, p, m, v)):
        assert [a for a in starts[r] if a is not None] == acts  # each rank keeps its order
    want = formula(name, p, m, v)["of_step"]
    assert _lockstep_bubble(name, p, m, v, 1.0, 2.0) == pytest.approx(want, abs=1e-9)

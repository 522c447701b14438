"""T1 -- collectives and topology."""

from __future__ import annotations

import re

from _lib import CPU, Exercise, Page, block, cmd, find, link, metric, run, shown, table, val

from parlab.comm.model import coefficients
from parlab.comm.ops import busbw_factor

OPS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "send_recv")


def _full_sweep():  # type: ignore[no-untyped-def]
    sweeps = [d for d in find("collectives-2*", world_size=2)
              if d.workload.get("kind") == "collectives-sweep" and "-e 8GiB" in d.command]  # fmt: skip
    return sweeps[-1]


def _rows(doc) -> dict[str, dict[int, dict]]:  # type: ignore[no-untyped-def]
    out: dict[str, dict[int, dict]] = {}
    for r in doc.workload["measurements"]:
        out.setdefault(r["op"], {})[int(r["size"])] = r
    return out


def mechanism() -> str:
    rows = []
    for n in (2, 4, 8, 64):
        k = coefficients("all_reduce", n)[1]
        rows.append([str(n), f"{k:.3f}", val(k * 2**30, "B"), f"{busbw_factor('all_gather', n):.3f}"])
    sweep = _full_sweep()
    r = _rows(sweep)["all_reduce"][2**30]
    n = int(r["group_size"])
    algbw = r["size"] / r["time_s"]
    return f"""
A collective is one call every rank of a group makes together. What each one exchanges:

- **all-reduce**: every rank ends with the sum of everyone's buffer (DDP's gradients);
- **reduce-scatter**: every rank ends with its 1/n slice of the sum (ZeRO-2/3's gradients);
- **all-gather**: every rank ends with everyone's slices side by side (ZeRO-3/FSDP's
  parameters before a layer runs);
- **all-to-all**: rank i sends its j-th slice to rank j (MoE's token dispatch, T4);
- **broadcast** / **send-recv**: one rank's buffer to all, or to one (pipeline stages, T3).

**Ring all-reduce traffic.** On a ring, an all-reduce of S bytes is a reduce-scatter (n - 1
steps of S/n bytes) followed by an all-gather (n - 1 more): each rank sends, and receives,

    2 (n - 1) / n x S bytes.

That factor is why bytes on the wire barely depend on the group size:

{table(["ranks n", "2(n-1)/n", "sent per rank for S = 1 GiB", "all-gather's (n-1)/n"], rows)}

**algbw and busbw.** Timing one call of S bytes gives the *algorithm bandwidth*
algbw = S / t. It is not comparable across ops or group sizes: an all-reduce moves almost 2S
per rank, an all-gather S (n - 1)/n. nccl-tests therefore reports the *bus bandwidth*
busbw = algbw x the op's factor (all-reduce 2(n-1)/n; all-gather, reduce-scatter,
all-to-all (n-1)/n with S the whole gathered buffer; broadcast, reduce, send/recv 1): the
bytes per second each rank's link actually carries, the number to hold against the link's
peak. parlab uses the same factors and the same size convention (`parlab explain busbw`).
Worked on the 2 x H200 sweep ({link(sweep)}): all_reduce of S = 1 GiB took
t = {val(r["time_s"], "s")}, so algbw = 1 GiB / t = {algbw / 1e9:.1f} GB/s, and busbw =
algbw x 2({n}-1)/{n} = {algbw * busbw_factor("all_reduce", n) / 1e9:.1f} GB/s (at n = 2 the
factor is 1; at n = 8 it would be 1.75).

**Latency and bandwidth.** Each call also pays a fixed cost (launch, synchronisation, the
first byte across): t(S) ~ alpha + k x S / B, the alpha-beta model `parlab collectives --fit`
fits on a sweep. Under a few hundred KiB the alpha term is the time: the number of calls
matters, not their bytes.
"""


def runs() -> str:
    sweep = _full_sweep()
    by = _rows(sweep)
    env = find("env-precheck-*")[-1]
    link_bw = metric(env, "link_bw_per_direction").value
    nccl = []
    for s in (8, 2**16, 2**20, 2**24, 2**26, 2**28, 2**30, 2**33):
        if s in by["all_reduce"]:
            r = by["all_reduce"][s]
            nccl.append([f"{s:,}", f"{r['count']:,}", r["type"], f"{r['time_s'] * 1e6:,.1f}",
                         f"{r['algbw'] / 1e9:.2f}", f"{r['busbw'] / 1e9:.2f}", str(r["wrong"])])  # fmt: skip
    peaks = []
    for op in OPS:
        size, r = max(by[op].items(), key=lambda kv: kv[1]["busbw"])
        peaks.append([op, f"{r['busbw'] / 1e9:.1f} GB/s", val(size, "B"),
                      f"{100 * r['busbw'] / link_bw:.0f} %"])  # fmt: skip
    cal = [d for d in find("collectives-calibration-*") if "all_reduce.alpha" in d.metrics][-1]
    cpu = find("collectives-2*", CPU)[-1]
    return f"""
On GPUs, `parlab env` records the machine and its links; `parlab collectives` sweeps every op
over sizes, the way nccl-tests does, and checks every result (#wrong); `--fit` fits alpha and
beta on a sweep:

```bash
{cmd("env")}
{cmd("sweep")}
{cmd("calibrate")}
```

The 2 x H200 machine ({link(env)}): NVLink {val(link_bw, "B/s")} per direction. The sweep
({link(sweep)}), all_reduce rows in nccl-tests' format (time in us, bandwidths in GB/s):

{table(["size (B)", "count", "type", "time", "algbw", "busbw", "#wrong"], nccl)}

Each op's best busbw in that sweep, against the link:

{table(["op", "peak busbw", "at size", "of the link"], peaks)}

The fit ({link(cal)}): all_reduce alpha = {val(metric(cal, "all_reduce.alpha").value, "s")},
bandwidth {val(metric(cal, "all_reduce.bandwidth").value, "B/s")}.

What a layout puts on the wire is analytic (`parlab.ledger.traffic`): per strategy, each
collective, its payload, its count per step, and whether compute waits for it:

{block("explain-fsdp", shown(run("explain-fsdp"), drop=("note:", "document:", "wrote")))}

On the CPU the same sweep runs over gloo (`{cpu.command}`, {link(cpu)}): #wrong =
{int(metric(cpu, "wrong_total").value or 0)} over every op, all_reduce peaking at
{val(metric(cpu, "all_reduce.busbw_peak").value, "B/s")}: it proves the exchange, not the speed.
"""


def why() -> str:
    by = _rows(_full_sweep())
    ar, ag = by["all_reduce"], by["all_gather"]
    big = max(ar)
    t8, t1m = ar[8]["time_s"], ar[2**20]["time_s"]
    same = [(s, ar[s], ag[2 * s]) for s in (2**26, 2**28, 2**30) if 2 * s in ag]
    pairs = "; ".join(f"all_reduce {val(s, 'B')} {a['time_s'] * 1e3:.2f} ms against all_gather "
                      f"{val(2 * s, 'B')} {g['time_s'] * 1e3:.2f} ms" for s, a, g in same)  # fmt: skip
    return f"""
- **busbw climbs with size, then flattens below the link.** Small calls are all alpha: an
  8-byte all_reduce took {t8 * 1e6:.1f} us and a 1 MiB one {t1m * 1e6:.1f} us, the same fixed
  cost, so their busbw is near zero. Only from tens of MiB does the bandwidth term dominate;
  at {val(big, "B")} all_reduce reaches {ar[big]["busbw"] / 1e9:.0f} GB/s. The plateau under the
  NVLink figure is NCCL's, not parlab's: nccl-tests on the same machine measures the same
  within a few percent (`benchmarks/results/collectives_vs_nccl_tests.txt`).
- **all_gather and reduce_scatter stay below all_reduce even in busbw.** busbw already
  corrects for what each op moves (at n = 2 an all-gather of S sends S/2 per rank, an
  all-reduce S), so an ideal ring would give every op the same busbw at large sizes. Set
  against each other at equal bytes per rank (an all-gather of 2S moves what an all-reduce of
  S moves): {pairs}. The all-gather is slower for the same bytes; nccl-tests shows the same
  ordering on this machine, so it is NCCL's implementation here, not the size convention.
- **Latency decides small messages**: a DDP bucket of 1 MiB costs about as much as one of
  8 bytes; T5 comes back to this when it sweeps bucket sizes.
"""


def _ddp_bytes(out: str) -> float:
    m = re.search(r"bytes per step ([\d.]+) GiB", out)
    assert m, "no bytes per step"
    return float(m.group(1)) * 2**30


def _ex_ddp(out: str) -> str:
    s = _ddp_bytes(out)
    k8, k2 = coefficients("all_reduce", 8)[1], coefficients("all_reduce", 2)[1]
    return (f"The wire table counts {val(s, 'B')} per step (nccl-tests' size: the fp32 gradients, "
            f"in 25 MiB buckets). Each rank sends 2(n-1)/n of it: {k8:.2f} x = {val(k8 * s, 'B')} "
            f"at n = 8, against {k2:.2f} x = {val(k2 * s, 'B')} at n = 2. Eight ranks move 1.75x "
            "the bytes per rank, not 4x: the ring's traffic hardly grows with n.")  # fmt: skip


def _check_ddp(out: str) -> None:
    from parlab.models import get_spec

    grads = get_spec("1.3b").num_active_params() * 4
    assert abs(_ddp_bytes(out) - grads) / grads < 0.01 and "all-reduce" in out


def _ex_busbw(out: str) -> str:
    s, t, n = 2**30, 3.3e-3, 8
    algbw = s / t
    return (f"algbw = 1 GiB / 3.3 ms = {algbw / 1e9:.0f} GB/s; busbw = algbw x 2(8-1)/8 = "
            f"{algbw * busbw_factor('all_reduce', n) / 1e9:.0f} GB/s. The busbw is the number to "
            "hold against each GPU's link.")  # fmt: skip


def _check_busbw(out: str) -> None:
    assert "2(n-1)/n" in out and busbw_factor("all_reduce", 8) == 1.75


EXERCISES = [
    Exercise(question="DDP trains 1.3b on 8 ranks. How many bytes does the wire table count per "
             "step, and how many does each rank actually send? Compare with 2 ranks.",
             command="explain-ddp-8", answer=_ex_ddp, check=_check_ddp),
    Exercise(question="An all_reduce of 1 GiB over 8 GPUs takes 3.3 ms. What are its algbw and "
             "busbw?", command="explain-busbw", answer=_ex_busbw, check=_check_busbw),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T1",
        title="collectives and topology",
        question="What do all-reduce, all-gather, reduce-scatter and all-to-all exchange, and what "
        "do they cost on this machine's links?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

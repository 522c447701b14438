"""T2 -- training state: replicated to sharded."""

from __future__ import annotations

import re

from _lib import (
    CPU,
    Exercise,
    Page,
    block,
    cmd,
    configs_of,
    link,
    med,
    run,
    shown,
    spread,
    table,
    val,
)

from parlab.comm.ops import busbw_factor
from parlab.ledger.predict import predict
from parlab.ledger.traffic import traffic
from parlab.models import get_spec
from parlab.topology import Topology

MODEL, SEQ, MB = "1.3b", 4096, 2
STRATEGIES = ("ddp", "zero1", "zero2", "zero3", "fsdp")
_OP = {"all-reduce": "all_reduce", "all-gather": "all_gather", "reduce-scatter": "reduce_scatter"}


def _wire(strategy: str, n: int) -> tuple[float, float]:
    """(bytes per step as nccl-tests counts them, bytes each rank sends) for ``strategy``."""
    items = traffic(get_spec(MODEL), Topology(world_size=n, dp=n), strategy, micro_batch=MB,
                    seq_len=SEQ)  # fmt: skip
    size = sum(i.total_bytes for i in items)
    sent = sum(i.total_bytes * busbw_factor(_OP[i.collective], i.group_size) for i in items)
    return size, sent


def _gpu_job() -> dict:  # type: ignore[type-arg]
    return configs_of("train-*-1.3b-*", model=MODEL, seq=SEQ, global_batch=4, world_size=2)


def _series() -> list[tuple[str, dict[str, float]]]:
    """Runs made minutes apart (a gap under 10 minutes), default knobs: (start, strategy ->
    tokens/s per GPU), for the series that ran at least three of the strategies."""
    import datetime as dt

    when = lambda d: dt.datetime.fromisoformat(d.created.replace("Z", "+00:00"))  # noqa: E731
    runs = sorted((d for c in _gpu_job().values() for d in c.docs), key=when)
    groups: list[list] = []  # type: ignore[type-arg]
    for d in runs:
        if groups and (when(d) - when(groups[-1][-1])).total_seconds() < 600:
            groups[-1].append(d)
        else:
            groups.append([d])
    out = []
    for g in groups:
        names = _gpu_job()
        by = {lbl: c for lbl, c in names.items() if lbl in STRATEGIES}
        row = {lbl: d.metric("tokens_per_s_per_gpu") for d in g for lbl, c in by.items()
               if any(x.run_id == d.run_id for x in c.docs)}  # fmt: skip
        if len(row) >= 3:
            out.append((g[0].created[:16].replace("T", " "), row))
    return out


def _one_gpu() -> dict:  # type: ignore[type-arg]
    return configs_of("train-*-1.3b-*", model=MODEL, seq=SEQ, global_batch=2, world_size=1)


def mechanism() -> str:
    spec = get_spec(MODEL)
    rows = []
    for s in STRATEGIES:
        led = predict(spec, strategy=s, topology=Topology(world_size=2, dp=2), seq_len=SEQ,
                      micro_batch=MB)  # fmt: skip
        size2, sent2 = _wire(s, 2)
        size8, sent8 = _wire(s, 8)
        rows.append([s, *(val(led.value(k), "B") for k in ("params", "grads", "optimizer")),
                     val(size2, "B"), val(sent2, "B"), val(sent8, "B")])  # fmt: skip
    return f"""
Data parallelism gives every rank its own slice of the batch; the ranks must then agree on
the gradients. What differs between strategies is what each rank keeps, and what it therefore
has to fetch or send:

- **DDP** keeps everything (params P, grads G, optimizer state O) and all-reduces the
  gradients, bucket by bucket, while backward still runs.
- **ZeRO-1** shards O: each rank steps only its 1/N of the parameters, so the gradients are
  reduce-scattered (each rank receives the sum of its slice) and the updated parameters
  all-gathered back. A reduce-scatter plus an all-gather is an all-reduce cut in two: the
  same bytes as DDP.
- **ZeRO-2** also frees the gradients of the slices a rank does not own, as soon as they are
  reduced.
- **ZeRO-3 / FSDP** also shard P: a layer's parameters are all-gathered just before its
  forward, freed, and gathered again before its backward. One more all-gather per step.

For {MODEL} ({spec.num_active_params() / 1e9:.2f} B parameters, fp32 params and grads, bf16
compute) the ledger and the wire table (`parlab.ledger.traffic`) give, per rank:

{table(["strategy", "params", "grads", "optimizer", "collective size per step (N = 2)",
        "bytes each rank sends (N = 2)", "bytes each rank sends (N = 8)"], rows)}

The size column counts payloads the way nccl-tests does; the bytes a rank sends are size x the
op's factor from T1: 2(N-1)/N for the all-reduce, (N-1)/N for all-gather and reduce-scatter.
ZeRO-3's size is twice DDP's (a fp32 reduce-scatter of 4P plus two bf16 all-gathers of 2P
each = 8P, against DDP's fp32 all-reduce of 4P), yet each rank sends the same bytes:
(N-1)/N x 8P = 2(N-1)/N x 4P, at any N.
"""


def _gpu_rows(job: dict) -> list[list[str]]:  # type: ignore[type-arg]
    rows = []
    for label in ("ddp", "zero1", "zero2", "zero3", "fsdp", "zero1 dtype=bf16-master"):
        c = job.get(label)
        if c is None:
            continue
        d = c.nearest("tokens_per_s_per_gpu")
        rows.append([label, str(len(c.docs)), spread(c.spread("tokens_per_s_per_gpu"), "tokens/s"),
                     val(med(c, "peak_memory"), "B"), val(med(c, "state_bytes.optimizer"), "B"),
                     val(med(c, "comm_bytes_per_step"), "B"), val(med(c, "comm_time"), "s"),
                     link(d)])  # fmt: skip
    return rows


def runs() -> str:
    job = _gpu_job()
    cpu = configs_of("train-*-tiny-*", CPU)
    cpu_rows = [[s, val(med(c, "state_bytes.optimizer"), "B"), val(med(c, "comm_bytes_per_step"), "B"),
                 link(c.docs[-1])] for s, c in cpu.items()]  # fmt: skip
    return f"""
The ledger of one layout, and what it puts on the wire:

{block("ledger-zero3", shown(run("ledger-zero3"), drop=("wrote",)))}

Then the real runs, side by side (`{cmd("project-state")}` runs the set; one run is, for
example, `{cmd("train-zero2")}`). On the 2 x H200 machine, {MODEL}, sequence {SEQ}, global batch
4 (2 per GPU), medians over the repeats of each configuration (comm time: the step's
collectives replayed alone, one after another):

{table(["strategy", "runs", "tokens/s per GPU", "peak memory", "optimizer state",
        "collective size / step", "comm time", "nearest run"], _gpu_rows(job))}

Runs made minutes apart are the fairest comparison (the machine and the code were the same);
tokens/s per GPU of the series that ran most of the strategies:

{table(["series started", *STRATEGIES], [[when, *(val(row[s], "tokens/s") if s in row else "-"
                                              for s in STRATEGIES)] for when, row in _series()])}

On the CPU (`parlab demo`: the tiny model on 2 gloo ranks), the same state arithmetic:

{table(["strategy", "optimizer state per rank", "collective size / step", "document"], cpu_rows)}
"""


def why() -> str:
    job, one = _gpu_job(), _one_gpu()
    ddp, z3, z1, z1m = job["ddp"], job["zero3"], job["zero1"], job["zero1 dtype=bf16-master"]
    d1, f1 = one["ddp"], one["fsdp"]
    size_ddp, sent_ddp = _wire("ddp", 2)
    size_z3, sent_z3 = _wire("zero3", 2)
    t = lambda c: med(c, "tokens_per_s_per_gpu")  # noqa: E731
    leads = "; ".join(f"{when}: ZeRO-3 {val(row['zero3'], 'tokens/s')} against DDP "
                      f"{val(row['ddp'], 'tokens/s')} ({100 * (row['zero3'] / row['ddp'] - 1):+.1f} %)"
                      for when, row in _series() if "zero3" in row and "ddp" in row)  # fmt: skip
    return f"""
- **Memory falls less than the states do.** From DDP to ZeRO-3 the optimizer state per GPU
  halves ({val(med(ddp, "state_bytes.optimizer"), "B")} to
  {val(med(z3, "state_bytes.optimizer"), "B")}), and so do params and grads, but the peak goes
  from {val(med(ddp, "peak_memory"), "B")} to {val(med(z3, "peak_memory"), "B")}: the
  activations are not sharded by any of these strategies (T0), and they are the same on
  every rank.
- **ZeRO-3 is faster than DDP while its collectives are twice the size.** In every series
  that ran both, minutes apart: {leads} (the medians over all repeats mix series and are
  closer: ZeRO-3 {val(t(z3), "tokens/s")}, DDP {val(t(ddp), "tokens/s")} per GPU). Yet ZeRO-3
  runs {val(med(z3, "comm_bytes_per_step"), "B")} of collectives per step against DDP's
  {val(med(ddp, "comm_bytes_per_step"), "B")}. Three things in the documents explain it:
  1. *The bytes each rank sends are the same*: {val(sent_z3, "B")} against {val(sent_ddp, "B")}
     (size {val(size_z3, "B")} x 1/2, against {val(size_ddp, "B")} x 2(2-1)/2; see the
     mechanism). Replayed alone, the step's collectives take
     {val(med(z3, "comm_time"), "s")} for ZeRO-3 and {val(med(ddp, "comm_time"), "s")} for DDP.
  2. *Both hide most of it behind compute* (T5), so communication does not decide the order.
  3. *The compute differs.* On one GPU, with no communication at all, FSDP still beats DDP:
     {val(t(f1), "tokens/s")} against {val(t(d1), "tokens/s")} (medians of {len(f1.docs)} and
     {len(d1.docs)} runs). DDP runs its forward under autocast over fp32 weights, so every
     matmul casts its weight to bf16 on every step (the ledger's `autocast_weight_copies`
     item); ZeRO-3 and FSDP all-gather the weights already in bf16 and run without autocast.
     Changing only the precision recipe shows it: ZeRO-1 with bf16 weights and an fp32 master
     copy (no autocast) reaches {val(t(z1m), "tokens/s")}, against {val(t(z1), "tokens/s")} for
     the same ZeRO-1 under autocast.
- **Repeats differ.** The ranges in the table come from runs made hours apart on the same
  machine; compare medians, and compare runs of one series when the gap is a few percent.
"""


def _optimizer(out: str) -> float:
    m = re.search(r"│ optimizer\s+│\s+([\d.]+) (GiB|MiB)", out)
    assert m, "no optimizer row"
    return float(m.group(1)) * {"GiB": 2**30, "MiB": 2**20}[m.group(2)]


def _ddp_optimizer() -> int:
    return predict(get_spec(MODEL), strategy="ddp", topology=Topology(world_size=4, dp=4),
                   seq_len=SEQ, micro_batch=MB).value("optimizer")  # fmt: skip


def _ex_zero1(out: str) -> str:
    o, full = _optimizer(out), _ddp_optimizer()
    return (f"{val(o, 'B')} per rank, a quarter of DDP's {val(full, 'B')} (2 fp32 moments x "
            f"{get_spec(MODEL).num_active_params() / 1e9:.2f} B parameters / 4; ZeRO pads the "
            "flat shards, so it is a hair over a quarter). Params and grads stay whole.")  # fmt: skip


def _check_zero1(out: str) -> None:
    o, full = _optimizer(out), _ddp_optimizer()
    assert abs(4 * o - full) / full < 0.01


def _ex_zero3(out: str) -> str:
    size = float(re.search(r"bytes per step ([\d.]+) GiB", out).group(1)) * 2**30  # type: ignore[union-attr]
    ddp_size, ddp_sent = _wire("ddp", 8)
    return (f"The collectives add up to {val(size, 'B')} per step, twice DDP's {val(ddp_size, 'B')}; "
            f"each rank sends (8-1)/8 of it, {val(size * 7 / 8, 'B')}, exactly what DDP's "
            f"all-reduce sends, 2(8-1)/8 x {val(ddp_size, 'B')} = {val(ddp_sent, 'B')}.")  # fmt: skip


def _check_zero3(out: str) -> None:
    size = float(re.search(r"bytes per step ([\d.]+) GiB", out).group(1)) * 2**30  # type: ignore[union-attr]
    _, ddp_sent = _wire("ddp", 8)
    assert abs(size * 7 / 8 - ddp_sent) / ddp_sent < 0.01


EXERCISES = [
    Exercise(question="How much optimizer state does each rank keep under ZeRO-1 on 4 ranks, "
             "against DDP's?", command="ledger-zero1-4", answer=_ex_zero1, check=_check_zero1),
    Exercise(question="On 8 ranks, does ZeRO-3 make each rank send more bytes than DDP?",
             command="explain-zero3-8", answer=_ex_zero3, check=_check_zero3),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T2",
        title="training state: replicated to sharded",
        question="How do params, grads and optimizer state go from replicated (DDP) to sharded "
        "(ZeRO-1/2/3, FSDP), and what does each cost in memory, time and traffic?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

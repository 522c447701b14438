"""T3 -- model internals: PP, TP, CP."""

from __future__ import annotations

import re

from _lib import CPU, Exercise, Page, block, cmd, configs_of, find, link, med, metric, run, shown
from _lib import table, val

from parlab.doctor.cases.idle import bubble_formula
from parlab.ledger.traffic import traffic
from parlab.models import get_spec
from parlab.topology import Topology

MODEL, SEQ = "1.3b", 4096


def _pair(prefix: str, stamp: str | None = None):  # type: ignore[no-untyped-def]
    """The newest split run of a model-internal preset, and the one-GPU run of its series on
    the same batch (None when that series has none)."""
    runs = [d for d in find(f"mi-{prefix}-2*") if d.status == "ok"
            and (stamp is None or stamp in d.run_id)]  # fmt: skip
    d = runs[-1]
    series = d.run_id.rsplit("-", 2)[-2]
    same = {k: d.workload.get(k) for k in ("global_batch", "seq")}
    single = [s for s in find(f"mi-single-*-{series}-*", **same) if s.status == "ok"]
    return d, (single[-1] if single else None)


def _tp_items(sp: bool):  # type: ignore[no-untyped-def]
    return traffic(get_spec(MODEL), Topology(world_size=2, tp=2), "ddp", micro_batch=2,
                   seq_len=SEQ, sp=sp, loss_parallel=True)  # fmt: skip


def mechanism() -> str:
    spec = get_spec(MODEL)
    per = 2 * SEQ * spec.hidden * 2
    items = _tp_items(False)
    rows = [[i.collective, i.phase, val(i.payload_bytes, "B"), str(i.count_per_step), i.note]
            for i in items]  # fmt: skip
    total = sum(i.total_bytes for i in items)
    bub = [[str(p), str(m), f"{100 * bubble_formula(p, m):.1f} %", f"{100 * (p - 1) / m:.1f} %"]
           for p, m in ((2, 4), (2, 8), (4, 8), (4, 32), (8, 64))]  # fmt: skip
    return f"""
Data parallelism (T2) copies the model; the three cuts below split one model's work.

**Tensor parallelism (TP) cuts every layer's matrices.** Attention's heads and the MLP's
columns are split over the t ranks of the TP group (Megatron's column-parallel then
row-parallel pair), so each rank holds 1/t of every block's weights and computes 1/t of its
matmuls. The price: the row-parallel output is a partial sum, so after attention and after
the MLP the group all-reduces the activations, b x s x h elements; backward does the same for
their gradients. That is 2 all-reduces per layer forward and 2 backward, each on the critical
path: the next matmul needs the sum. For {MODEL} with b = 2, s = {SEQ}, h = {spec.hidden} in
bf16, one all-reduce carries 2 x {SEQ} x {spec.hidden} x 2 B = {val(per, "B")}, and the wire
table of tp = 2 is:

{table(["collective", "phase", "payload", "per step", "what"], rows)}

{val(total, "B")} per step, all blocking. Sequence parallelism (SP) replaces each all-reduce by
a reduce-scatter and an all-gather of the same bytes, so the norms and dropouts between them
run on 1/t of the sequence: it saves activation memory, not traffic.

**Pipeline parallelism (PP) cuts the stack of layers** into p stages on p ranks, which pass
one micro-batch's activation (b x s x h) forward and its gradient back. Little traffic, but
a stage waits while the pipeline fills and drains: with m micro-batches per step, the idle
share of a GPipe or 1F1B step is

    bubble = (p - 1) / (m + p - 1)      (relative to the useful time: (p - 1) / m)

and interleaving v chunks per rank divides it by about v. GPipe runs all m forwards before
any backward and so keeps m micro-batches' activations; 1F1B starts backward as soon as it
can and keeps at most p.

{table(["stages p", "micro-batches m", "bubble (p-1)/(m+p-1)", "(p-1)/m"], bub)}

**Context parallelism (CP) cuts the sequence**: each of c ranks holds s/c tokens, and
attention's keys and values travel around a ring (c - 1 steps of send/recv per attention
layer) so every query block still sees every earlier key. It lets sequences fit that one GPU
cannot hold.

A device mesh composes them: `parlab layout` prints which ranks form each group; TP goes
innermost (consecutive ranks, the fastest links), PP outermost.
"""


def _mi_rows() -> list[list[str]]:
    rows = []
    for prefix, what in (("tp2", "TP 2"), ("tp2-sp", "TP 2 + SP"), ("pp2-gpipe", "PP 2 GPipe"),
                         ("pp2-1f1b", "PP 2 1F1B"), ("pp2-interleaved", "PP 2 interleaved"),
                         ("cp2-ring", "CP 2 ring")):  # fmt: skip
        d, one = _pair(prefix)
        single = val(metric(one, "peak_memory").value, "B") if one else "-"
        comm = next((m for k, m in d.metrics.items() if k.startswith("comm_bytes_per_step.")), None)
        rows.append([what, f"{d.workload.get('global_batch')} x {d.workload.get('seq')}",
                     f"{metric(d, 'speedup_vs_single').value:.2f}x",
                     f"{100 * (metric(d, 'scaling_efficiency').value or 0):.0f} %",
                     val(metric(d, "peak_memory").value, "B"), single,
                     val(comm.value, comm.unit) if comm else "-", link(d)])  # fmt: skip
    return rows


def runs() -> str:
    cpu_pp = find("mi-pp2-1f1b-*", CPU)[-1]
    cpu_one = find("mi-single-pp2-1f1b-*", CPU)[-1]
    return f"""
The layout of a mesh, analytic:

{block("layout", shown(run("layout"), first=45))}

Then real runs, each split against one GPU running the same global batch
(`{cmd("project-mi")}` on the CPU; `--preset gpu` on 2 GPUs). On the 2 x H200 machine, the
newest series:

{table(["layout", "batch x seq", "speed-up over one GPU", "scaling efficiency",
        "peak memory per GPU", "one GPU's peak", "bytes per step", "document"], _mi_rows())}

On the CPU the point is correctness: the pipeline's final loss is
{val(metric(cpu_pp, "loss_last").value, "nats")} ({link(cpu_pp)}), the one-rank run's on the
same batch {val(metric(cpu_one, "loss_last").value, "nats")} ({link(cpu_one)}).
"""


def _stage_work() -> tuple[float, float]:
    """Matmul parameters of PP 2's first and last stage (layers, plus the LM head on the last)."""
    s = get_spec(MODEL)
    kv = (s.kv_heads or s.heads) * (s.head_dim or s.hidden // s.heads)
    layer = s.hidden * (s.hidden + 2 * kv) + s.hidden * s.hidden + 3 * s.hidden * s.ffn_hidden
    half = s.layers // 2 * layer
    return half, half + s.vocab_size * s.hidden


def why() -> str:
    tp, tp_one = _pair("tp2")
    pp, _ = _pair("pp2-1f1b")
    gp, _ = _pair("pp2-gpipe", pp.run_id.rsplit("-", 2)[-2]) if find(
        f"mi-pp2-gpipe-{pp.run_id.rsplit('-', 2)[-2]}-*") else _pair("pp2-gpipe")  # fmt: skip
    prof = find("profile-tp2-nosp-*")[-1]
    fsdp2 = configs_of("train-*-1.3b-*", model=MODEL, seq=SEQ, global_batch=4, world_size=2)["fsdp"]
    fsdp1 = configs_of("train-*-1.3b-*", model=MODEL, seq=SEQ, global_batch=2, world_size=1)["fsdp"]
    eff_dp = med(fsdp2, "tokens_per_s_per_gpu") / med(fsdp1, "tokens_per_s_per_gpu")
    bub = metric(pp, "pp_bubble")
    first, last = (bub.per_rank or [None, None])[:2]
    w0, w1 = _stage_work()
    m = int(pp.workload.get("microbatches") or 1)
    cp, _ = _pair("cp2-ring")
    long = [d for d in find("mi-cp2-ring-long-*") if d.status == "ok"][-1]
    oom = [d for d in find("mi-single-cp2-ring-long-*") if d.failure and d.failure.kind == "oom"]
    long_one_why = f"{oom[-1].failure.kind}, {link(oom[-1])}" if oom else "no one-GPU run"
    return f"""
- **"TP buys memory, not much speed", beside a 1.41x speed-up: both hold, and the documents
  say which matters.** TP 2 runs the same batch {metric(tp, "speedup_vs_single").value:.2f}x
  faster than one GPU ({link(tp)}): strong scaling, the wall-clock answer. But two GPUs
  deliver {100 * (metric(tp, "scaling_efficiency").value or 0):.0f} % of twice one GPU's
  throughput; each TP rank does {100 - 100 * (metric(tp, "scaling_efficiency").value or 0):.0f} % less useful work than the lone GPU. Spending the second
  GPU on data parallelism instead keeps far more: FSDP on 2 GPUs, each with one GPU's batch,
  runs at {100 * eff_dp:.0f} % of one GPU's tokens/s per GPU (T2's runs). What TP bought is
  memory: {val(metric(tp, "peak_memory").value, "B")} per GPU against
  {val(metric(tp_one, "peak_memory").value, "B") if tp_one else "-"} on one. The reason is the
  mechanism: its all-reduces sit between matmuls, so nothing hides them; the profile of TP 2
  shows {metric(prof, "overlap_fraction").value:.0f} % of its communication overlapped and
  {metric(prof, "exposed_comm_fraction").value:.1f} % of the step exposed ({link(prof)}).
- **PP idles where the formula says, and more on the first stage.** With p = 2 and m = {m},
  (p - 1)/(m + p - 1) = {100 * bubble_formula(2, m):.1f} %; the last stage measured
  {100 * (last or 0):.1f} %, the first {100 * (first or 0):.1f} %. The formula assumes equal
  stages, and these are not: the last stage also runs the LM head, {w1 / w0:.2f}x the first
  stage's matmul parameters ({w1 / 1e6:,.0f} M against {w0 / 1e6:,.0f} M). A pipeline runs at
  the pace of its slowest stage, so the first one waits that difference on top of the bubble.
- **1F1B and GPipe take the same time, not the same memory**: {val(metric(pp, "peak_memory").value, "B")}
  against {val(metric(gp, "peak_memory").value, "B")} per GPU. GPipe keeps all {m}
  micro-batches' activations before the first backward; 1F1B at most p = 2.
- **CP is slow here, and that is not what it is for.** At {cp.workload.get("seq"):,} tokens CP 2
  gains {metric(cp, "speedup_vs_single").value:.2f}x while its ring moves
  {val(metric(cp, "comm_bytes_per_step.cp").value, "B")} of keys and values per step. What it
  buys shows at {long.workload.get("seq"):,} tokens: one GPU ran out of memory
  ({long_one_why}), CP 2 trained at {val(metric(long, "tokens_per_s_per_gpu").value, "tokens/s")}
  per GPU with {val(metric(long, "peak_memory").value, "B")} each ({link(long)}).
"""


def _groups(out: str, axis: str) -> list[list[int]]:
    m = re.search(rf"^  {axis} \(\d+, \d+ groups\): (.+)$", out, re.M)
    assert m, f"no {axis} groups"
    return [[int(x) for x in g.split(",")] for g in re.findall(r"\[([\d,]+)\]", m.group(1))]


def _ex_groups(out: str) -> str:
    tp = next(g for g in _groups(out, "tp") if 5 in g)
    dp = next(g for g in _groups(out, "dp") if 5 in g)
    pp = next(g for g in _groups(out, "pp") if 5 in g)
    return (f"TP group {tp} (four consecutive ranks: the fastest links, since TP exchanges "
            f"activations in every layer), DP group {dp}, PP group {pp} (the outermost axis: "
            "stages sit furthest apart, they send the least).")  # fmt: skip


def _check_groups(out: str) -> None:
    tp = next(g for g in _groups(out, "tp") if 5 in g)
    assert tp == [4, 5, 6, 7] and any(5 in g for g in _groups(out, "dp"))


def _ex_bubble(out: str) -> str:
    need = next(m for m in range(1, 1000) if bubble_formula(4, m) < 0.05)
    return (f"(4 - 1)/(8 + 4 - 1) = 3/11 = {100 * bubble_formula(4, 8):.1f} % of the step. Under 5 % "
            f"needs (p - 1)/(m + p - 1) < 0.05, m > 57: m = {need} micro-batches (or interleaving, "
            "which divides the bubble by about the number of chunks per rank).")  # fmt: skip


def _check_bubble(out: str) -> None:
    assert "(p-1)/(m+p-1)" in out and abs(bubble_formula(4, 8) - 3 / 11) < 1e-12


EXERCISES = [
    Exercise(question="On 16 ranks as pp 2 x dp 2 x tp 4, which ranks share rank 5's TP group, "
             "its DP group and its PP group?", command="layout-16", answer=_ex_groups,
             check=_check_groups),
    Exercise(question="A pipeline of p = 4 stages runs m = 8 micro-batches per step. What share "
             "of the step idles, and how many micro-batches bring it under 5 %?",
             command="explain-bubble", answer=_ex_bubble, check=_check_bubble),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T3",
        title="model internals: PP, TP, CP",
        question="What do pipeline, tensor and context parallelism cut (layers, heads and "
        "features, sequence), what does each cost, and how do they compose on a device mesh?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

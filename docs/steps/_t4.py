"""T4 -- dynamic routing: experts and replicas."""

from __future__ import annotations

import re

from _lib import CPU, Exercise, Page, block, cmd, find, link, metric, run, shown, table, val

from parlab.ledger import kv_cache_bytes
from parlab.models import get_spec
from parlab.report.groups import Config, configs, job_title, jobs


def mval(doc, name: str) -> str:  # type: ignore[no-untyped-def]
    """A document's metric in its own unit."""
    m = metric(doc, name)
    return val(m.value, m.unit)


def _moe_job() -> list:  # type: ignore[type-arg]
    """The newest MoE runs with a capacity limit: uniform and skewed laws of one layer."""
    laws = [d for d in find("moe-ep2-*") if d.workload.get("kind") in ("uniform", "zipf")
            and d.layout.get("capacity_factor")]  # fmt: skip
    return max(jobs(laws).values(), key=lambda g: (len(configs(g)), g[-1].created))


def _serving_job() -> list[Config]:
    runs = [d for d in find("serve-bench-*") if d.status == "ok" and d.metric("p99_ttft_ms")]
    job = max(jobs(runs).values(), key=lambda g: (len(configs(g)), len(g)))
    return configs(job)


def mechanism() -> str:
    uni = next(d for d in reversed(_moe_job()) if d.workload.get("kind") == "uniform")
    k, h = uni.layout["top_k"], uni.workload["hidden"]
    tok, experts, cf = uni.workload["tokens_per_rank"], uni.layout["experts"], uni.layout["capacity_factor"]
    ep = uni.layout["world_size"]
    elem = 2 if uni.workload.get("dtype") == "bf16" else 4
    vol = tok * k * h * elem
    cap = int(cf * tok * k / experts)
    s13, s8 = get_spec("1.3b"), get_spec("llama3.1-8b")
    kv = [[s.name, str(s.layers), str(s.kv_heads or s.heads), str(s.head_dim or s.hidden // s.heads),
           f"{kv_cache_bytes(s, batch=1, seq_len=1):,}"] for s in (s13, s8)]  # fmt: skip
    return f"""
Some work is routed at run time, token by token or request by request, and the route decides
the load.

**Experts (MoE).** A router scores every token against E experts and sends it to its top k.
With expert parallelism the experts live on ep ranks, so each layer does two all-to-alls:
*dispatch* (every token's hidden vector to the ranks of its experts) and *combine* (the
experts' outputs back). The buffer one rank hands to a dispatch is

    tokens per rank x k x hidden x bytes

and, with uniform routing, (ep - 1)/ep of it crosses the wire. In the 2 x H200 run
({link(uni)}): {tok:,} x {k} x {h} x {elem} B = {val(vol, "B")}, of which
{val(vol * (ep - 1) / ep, "B")} leave each rank. The run measured a dispatch of
{val(metric(uni, "dispatch_bytes").value, "B")}.

A **capacity factor** bounds what an expert keeps from each source rank:

    capacity = capacity factor x tokens x k / E = {cf} x {tok:,} x {k} / {experts} = {cap:,}

(the run's `capacity` metric: {int(metric(uni, "capacity").value or 0):,}); assignments beyond it are
dropped (the residual connection carries the token on). Uniform routing fits under a factor
a little above 1; skewed routing does not, and the rank that holds the hot experts does the
most expert compute: the slowest rank sets the layer's time.

**Replicas (serving).** A replica answers a request in two phases: *prefill* runs the whole
prompt through the model in one pass and writes its keys and values into the KV cache;
*decode* then produces one token per step, reading the cache. The cache costs, per token,

    KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes

{table(["model", "layers", "KV heads", "head dim", "KV bytes per token (bf16)"], kv)}

Grouped-query attention (8 KV heads for 32 query heads) is why an 8 B model caches fewer bytes
per token than this 1.3 B one. The user-facing times are vLLM's:

- TTFT (time to first token) = queueing + prefill;
- TPOT (time per output token) = (end-to-end latency - TTFT) / (output tokens - 1), per
  request: the decode speed it saw.

A router spreads requests over replicas: round robin, random, least outstanding requests,
power of two choices, or cache-aware (send a prompt where its prefix is already cached).
Load-blind choices build queues on one replica, and queues are what fatten TTFT's tail.
"""


def _moe_rows() -> list[list[str]]:
    rows = []
    for c in configs(_moe_job()):
        d = c.docs[-1]
        rows.append([c.label, f"{100 * (metric(d, 'overflow_rate').value or 0):.1f} %",
                     f"{metric(d, 'slowest_rank_excess').value:.1f} %",
                     ", ".join(f"{int(v):,}" for v in metric(d, "rank_load_max_over_mean").per_rank or []),
                     mval(d, "a2a_busbw"),
                     val(metric(d, "layer_time").value, "s"), link(d)])  # fmt: skip
    return rows


def _serving_rows() -> list[list[str]]:
    rows = []
    for c in _serving_job():
        p99 = c.spread("p99_ttft_ms")
        rows.append([c.label, str(len(c.docs)), f"{c.spread('median_ttft_ms').median:.1f}",
                     f"{p99.median:.1f} ({p99.lo:.0f} to {p99.hi:,.0f})",
                     f"{c.spread('mean_tpot_ms').median:.2f}",
                     f"{100 * c.spread('cache_hit_rate').median:.0f} %",
                     link(c.nearest("p99_ttft_ms"))])  # fmt: skip
    return rows


def runs() -> str:
    job = _moe_job()
    same = {k: job[0].layout.get(k) for k in ("experts", "top_k")}
    sw = [d for d in find("moe-ep2-*-capacity-sweep.json") if all(
        d.layout.get(k) == v for k, v in same.items())][-1]  # fmt: skip
    cfs = sorted({float(k.rsplit("_cf", 1)[1]) for k in sw.metrics if "_cf" in k})
    laws = sorted({k.split("overflow_rate_", 1)[1].rsplit("_cf", 1)[0] for k in sw.metrics
                   if k.startswith("overflow_rate_")})  # fmt: skip
    sweep_rows = [[law, *(f"{100 * (sw.metric(f'overflow_rate_{law}_cf{cf:g}') or 0):.1f} %"
                          for cf in cfs)] for law in laws]  # fmt: skip
    cpu = find("moe-ep2-*-uniform.json", CPU)[-1]
    kvx = find("serve-kvxfer-*")[-1]
    serving = _serving_job()
    return f"""
```bash
{cmd("project-moe")}
{cmd("project-serving")}
```

**MoE on the 2 x H200 machine** ({job_title(job[0])}), one run per routing law:

{table(["routing", "assignments dropped", "slowest rank over the mean", "assignments per rank",
        "all-to-all busbw", "layer time", "document"], _moe_rows())}

The capacity sweep of the same layer ({link(sw)}), routing only: assignments dropped per
capacity factor.

{table(["routing", *(f"cf {cf:g}" for cf in cfs)], sweep_rows)}

On the CPU the expert-parallel layer's output matches the unsharded layer's to
{metric(cpu, "unsharded_max_abs_diff").value:g} (max abs difference, {link(cpu)}).

**Serving on the 2 x H200 machine**: {job_title(serving[0].docs[0])}, two replicas behind the
router, each policy repeated (medians over the repeats; p99's range across them in brackets;
times in ms):

{table(["policy", "runs", "p50 TTFT", "p99 TTFT (range)", "TPOT", "prefix cache hits",
        "nearest run"], _serving_rows())}

Moving a prompt's KV cache between GPUs (prefill on one, decode on another) is a send of
KV bytes per token x tokens: {mval(kvx, "kv_transfer_bandwidth")} once large,
{mval(kvx, "kv_transfer_base")} fixed cost ({link(kvx)}).

The simulator (`parlab serve sim`, analytic) shows what a queue does to TTFT:

{block("sim-50", shown(run("sim-50"), drop=("wall_s",)))}
"""


def why() -> str:
    job = _moe_job()
    newest = {c.label: c.docs[-1] for c in configs(job)}
    z = next(d for d in newest.values() if d.workload.get("kind") == "zipf")
    u = next(d for d in newest.values() if d.workload.get("kind") == "uniform")
    routed = z.workload["per_expert_routed"]
    total = sum(routed)
    cap_e = int(metric(z, "capacity").value or 0) * int(z.layout["world_size"])
    loads = metric(z, "rank_load_max_over_mean").per_rank or [0, 0]
    comp = metric(z, "expert_compute_time").per_rank or [0, 0]
    serving = _serving_job()
    meds = [c.spread("p99_ttft_ms").median for c in serving]
    widest = max(serving, key=lambda c: c.spread("p99_ttft_ms").hi - c.spread("p99_ttft_ms").lo)
    w = widest.spread("p99_ttft_ms")
    ca = next((c for c in serving if "cache_aware" in c.label), None)
    rr = next((c for c in serving if "round_robin" in c.label), None)
    n_req = serving[0].docs[0].workload.get("num_requests")
    doc = serving[0].nearest("mean_tpot_ms")
    out_len = doc.workload["dataset_params"]["output_len"]
    tpot = (doc.metric("mean_e2el_ms") - doc.metric("mean_ttft_ms")) / (out_len - 1)
    return f"""
- **A capacity factor sized for uniform routing cannot absorb skew.** Under
  {z.workload["name"]} the hottest expert was routed {routed[0]:,} of {total:,} assignments
  ({100 * routed[0] / total:.0f} %) and may keep {cap_e:,}; {100 * (metric(z, "overflow_rate").value or 0):.1f} %
  of all assignments were dropped. The sweep shows even a factor of 2 drops a fifth of them:
  only a load-balancing loss (or bias) that flattens the router's choices fixes it.
- **The slowest rank is the one holding the hot experts.** Experts 0 to
  {len(routed) // 2 - 1} live on rank 0, which received {int(loads[0]):,} assignments against
  {int(loads[1]):,}; its expert compute took {comp[0] * 1e3:.2f} ms against {comp[1] * 1e3:.2f} ms,
  and the whole layer waits for it ({metric(z, "slowest_rank_excess").value:.1f} % over the mean).
- **The all-to-all slows down under skew** ({mval(z, "a2a_busbw")} against
  {mval(u, "a2a_busbw")} uniform): its splits are uneven, and it lasts as long as its largest
  transfer.
- **The serving policies are not told apart by this trace.** At {n_req} requests the p99 is
  about the slowest request, so one slow request moves it: {widest.label}'s p99 ranged from
  {w.lo:.0f} to {w.hi:,.0f} ms over {w.n} repeats, while the policies' medians differ by
  {max(meds) - min(meds):.0f} ms. Cache-aware routing did what it is for (prefix hits
  {100 * ca.spread("cache_hit_rate").median:.0f} % against round robin's
  {100 * rr.spread("cache_hit_rate").median:.0f} %), but at this load queues barely form, so
  shorter prefills hardly show in TTFT. A longer trace, or a rate near the replicas' capacity,
  is what separates policies (see the exercise).
- **TPOT is the decode step.** With every request producing {out_len} tokens,
  (mean E2E - mean TTFT) / {out_len - 1} = {tpot:.2f} ms, the measured mean TPOT
  ({doc.metric("mean_tpot_ms"):.2f} ms, {link(doc)}).
"""


def _kv(out: str, name: str) -> int:
    row = re.search(rf"│ {re.escape(name)}\s+│[^│]+│[^│]+│\s+(\d+) │\s+(\d+) │\s+(\d+) / (\d+) │", out)
    assert row, f"no {name} row"
    layers, hidden, heads, kv = (int(x) for x in row.groups())
    return 2 * layers * kv * (hidden // heads) * 2


def _ex_kv(out: str) -> str:
    b8, b13 = _kv(out, "llama3.1-8b"), _kv(out, "1.3b") if "│ 1.3b" in out else kv_cache_bytes(
        get_spec("1.3b"), batch=1, seq_len=1)  # fmt: skip
    return (f"2 x 32 layers x 8 KV heads x 128 x 2 B = {b8:,} bytes per token ({val(b8, 'B')}), "
            f"less than the 1.3b's {b13:,} (16 KV heads of 24 layers, no GQA). 40 GiB hold "
            f"{40 * 2**30 // b8:,} tokens: 80 requests of 4,096.")  # fmt: skip


def _check_kv(out: str) -> None:
    assert _kv(out, "llama3.1-8b") == kv_cache_bytes(get_spec("llama3.1-8b"), batch=1, seq_len=1)


def _sim(out: str, key: str) -> float:
    m = re.search(rf"^\s*{key}: ([\d.e+]+)$", out, re.M)
    assert m, f"no {key}"
    return float(m.group(1))


def _ex_sim(out: str) -> str:
    low = run("sim-50")
    return (f"The replicas complete {_sim(out, 'request_throughput'):.0f} requests/s at most, so at "
            f"200/s a queue grows for the whole run: p99 TTFT {_sim(out, 'p99_ttft_ms') / 1e3:.1f} s, "
            f"against {_sim(low, 'p99_ttft_ms'):.1f} ms at 50/s. TPOT only doubles "
            f"({_sim(low, 'mean_tpot_ms'):.1f} to {_sim(out, 'mean_tpot_ms'):.1f} ms): the decode "
            "batches are fuller, but a request that got in decodes at the same pace. Overload "
            "shows in TTFT first.")  # fmt: skip


def _check_sim(out: str) -> None:
    low = run("sim-50")
    assert _sim(out, "request_throughput") < 150 and _sim(out, "p99_ttft_ms") > 100 * _sim(
        low, "p99_ttft_ms") / 10  # fmt: skip


EXERCISES = [
    Exercise(question="How many bytes of KV cache does llama3.1-8b need per token in bf16, and "
             "how many tokens fit in 40 GiB?", command="models", answer=_ex_kv, check=_check_kv),
    Exercise(question="Four simulated replicas serve at most about 86 requests/s. What happens to "
             "TTFT and TPOT when requests arrive at 200/s?", command="sim-200", answer=_ex_sim,
             check=_check_sim),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T4",
        title="dynamic routing: experts and replicas",
        question="Token-to-expert and request-to-replica routing: what do capacity, locality and "
        "the long tail cost?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

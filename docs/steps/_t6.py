"""T6 -- admission and decision. The planner's output is generated here from its command, so
the page follows the planner as it changes."""

from __future__ import annotations

import os
import re

from _lib import GPU, PAGES, Exercise, Page, block, cmd, configs_of, find, link, med, run, shown
from _lib import table, val

from parlab.hardware.catalog import require
from parlab.models import get_spec
from parlab.models.flops import training_flops_per_token
from parlab.report.figures import accuracy_points
from parlab.report.format import prediction_error


def _top(out: str) -> str:
    m = re.search(r"^Top choice: (.+)$", out, re.M)
    assert m, "no top choice"
    return m.group(1).strip()


def _row(out: str, name: str) -> list[str]:
    m = re.search(rf"^│ \S+\s+│ {re.escape(name)}\s+│(.+)│$", out, re.M)
    assert m, f"no row {name}"
    return [c.strip() for c in m.group(1).split("│")]


def mechanism() -> str:
    spec = get_spec("1.3b")
    peak = require("H200").peak_flops["bf16"] or 0.0
    tokens, gpus, mfu = 4 * 4096, 2, 0.4
    fpt = training_flops_per_token(spec, 4096)
    t = tokens * fpt / (gpus * peak * mfu)
    return f"""
Everything before this step explains one mechanism; T6 puts them together to choose.

**Admission.** `parlab plan` enumerates every layout of a model on a cluster (data parallel
strategy, tp, pp, cp, micro-batch, recompute) and rejects, with a reason, each one that cannot
run: a degree that does not divide the heads or the layers, a global batch that is not a
multiple of dp x micro-batch, a predicted peak over the GPU's memory (T0's ledger).

**Estimate.** For each admitted layout it predicts a step:

    step = compute + exposed communication + pipeline bubble
    compute = tokens x FLOP per token / (GPUs x peak FLOP/s x MFU)

with FLOP per token = 6N + 12 L H Q T (weights, plus attention over the sequence), the wire
table of T1 and T2 timed by the alpha-beta model, only the blocking part counted as exposed
(T5), and T3's bubble. For 1.3b at 4 x 4096 tokens on 2 H200s ({peak / 1e12:.0f} TFLOP/s bf16
dense, `parlab.hardware.catalog`) with an
assumed MFU of {mfu}: {tokens:,} x {fpt / 1e9:.1f} GFLOP / ({gpus} x {peak * mfu / 1e12:.0f} TFLOP/s)
= {t:.3f} s of compute.

**The Pareto front.** A layout that is both slower and hungrier than another is never the
right choice; the ones left (faster, or leaner) are the front of throughput against peak
memory, and the choice among them is the cost you accept.

**Decision.** `parlab decide` then picks among *measured* runs of one job: it leaves out the
runs it cannot compare like with like (another GPU, another workload, another evidence
level), rejects failures and slower runs with their reasons, and records each prediction's
error, so the next plan can be judged. `parlab doctor` reads the same documents for known
failure patterns.
"""


def _measured_ranking() -> list[tuple[str, float]]:
    job = configs_of("train-*-1.3b-*", model="1.3b", seq=4096, global_batch=4, world_size=2)
    strategies = ("ddp", "zero1", "zero2", "zero3", "fsdp")
    return sorted(((s, med(job[s], "tokens_per_s_per_gpu")) for s in strategies if s in job),
                  key=lambda x: -x[1])  # fmt: skip


def _doctor() -> str:
    from parlab.doctor import diagnose

    diag = diagnose(GPU)
    rows = [[f.case, f.strength, f"[`{os.path.basename(f.document)}`]"
             f"({os.path.relpath(GPU / f.document, PAGES)}) `{f.evidence_level}`", f.summary]
            for f in diag.findings]  # fmt: skip
    return table(["case", "strength", "document", "what the fields say"], rows)


def runs() -> str:
    dec = [d for d in find("decide-par-training-state-*") if d.decision is not None][-1]
    assert dec.decision is not None
    chosen = next((d for d in find("train-*") if d.run_id == dec.decision.chosen), None)
    job = configs_of("train-*-1.3b-*", model="1.3b", seq=4096, global_batch=4, world_size=2)
    name = next((lbl for lbl, c in job.items() if any(d.run_id == dec.decision.chosen
                                                      for d in c.docs)), None)  # fmt: skip
    kinds: dict[str, int] = {}
    for r in dec.decision.rejected:
        kinds[r.get("kind", "?")] = kinds.get(r.get("kind", "?"), 0) + 1
    return f"""
The plan is analytic and quick; it is generated here from its command, so it follows the
planner as the planner changes:

{block("plan", shown(run("plan"), first=34))}

Then measure the candidates (T2), and decide among the measured runs:

```bash
{cmd("decide")}
{cmd("doctor")}
{cmd("report")}
```

The newest training-state decision over the 2 x H200 documents ({link(dec)}) chose
{name or (chosen.layout.get("strategy") if chosen else dec.decision.chosen)}
({link(chosen) if chosen else "its run is not committed"}), rejecting
{len(dec.decision.rejected)} runs ({", ".join(f"{n} {k}" for k, n in sorted(kinds.items()))}):
"{dec.decision.reason}"

What `parlab doctor results` finds in the same documents:

<details><summary>The doctor's findings, one row per document</summary>

{_doctor()}

</details>
"""


def why() -> str:
    out = run("plan")
    top = _top(out)
    ranked = _measured_ranking()
    best, best_tps = ranked[0]
    top_strategy = top.split()[0]
    mine = dict(ranked).get(top_strategy)
    agree = top_strategy == best
    pts = accuracy_points([d for _, d in __import__("_lib").docs(GPU)])
    step = pts.get(("step_time", "real-training"), [])
    errs = [e for _, p, m in step if (e := prediction_error(p, m)) is not None]
    within = sum(abs(e) <= 0.10 for e in errs)
    verdict = (f"{best} measured fastest too" if agree else
               f"the measured runs of the same job rank {best} first "
               f"({val(best_tps, 'tokens/s')} per GPU) and {top_strategy} at "
               f"{val(mine, 'tokens/s') if mine else 'not measured'}")  # fmt: skip
    return f"""
- **The planner and the measurements {"agree" if agree else "disagree"}.** The plan's top choice
  is `{top}`; {verdict}. The plan assumes the same MFU for every layout, so it cannot see a
  cost that is not communication or memory, such as T2's autocast casts under DDP. That is
  why a plan is checked against runs before it is trusted, and why runs carry the prediction
  they were made with.
- **Predicted step times, against the runs that recorded one before they ran:** {within} of
  {len(errs)} within 10 % (error = (measured - predicted) / predicted, the sign
  `docs/accuracy.md` uses; `parlab report` draws them all).
- **A decision is only as good as its comparison.** `parlab decide` compares runs of one job;
  runs that differ in workload, GPU or evidence level are left out and named, and the
  rejected ones carry their reason (slower by how much, over memory by how much, failed how).
- **The doctor's findings are read from fields, not guessed**: each row names the document
  and the fields behind it, with a strength; a weak one says what would confirm it.
"""


def _ex_plan(out: str) -> str:
    top = _top(out)
    cells = _row(out, top)
    front = "is" if re.search(rf"^│ \d+\* +│ {re.escape(top)}", out, re.M) else "is not"
    return (f"`{top}`, predicted at {cells[0]} per step and {cells[4]} tokens/s per GPU, with "
            f"{cells[6]} peak per GPU; it {front} on the Pareto front (marked *). The other rows "
            "marked * trade throughput for memory: each is the fastest at its memory.")  # fmt: skip


def _check_plan(out: str) -> None:
    top = _top(out)
    assert _row(out, top) and "Pareto front:" in out


def _ex_plan8(out: str) -> str:
    totals = re.search(r"^\s*totals: (.+)$", out, re.M)
    assert totals
    return (f"`{_top(out)}`. The rejections ({totals.group(1).strip()}) are of two kinds: a global "
            "batch that dp x micro-batch does not divide, and a predicted peak over the 80 GB of an "
            "H100 (DDP replicates 16 bytes per parameter: 128 GB of states alone for 8 B "
            "parameters, T0).")  # fmt: skip


def _check_plan8(out: str) -> None:
    assert _top(out) and re.search(r"totals: .*memory \d+", out)


EXERCISES = [
    Exercise(question="What does the planner choose for 1.3b on 2 x H200 at global batch 4, and "
             "is its choice on the Pareto front?", command="plan", answer=_ex_plan,
             check=_check_plan),
    Exercise(question="Plan Llama-3.1-8B on 8 x H100 at global batch 16. What is chosen, and why "
             "are so many layouts rejected?", command="plan-8", answer=_ex_plan8,
             check=_check_plan8),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T6",
        title="admission and decision",
        question="Which candidate to ship, and why; what it costs; and what the evidence says "
        "is wrong?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

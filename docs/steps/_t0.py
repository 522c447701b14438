"""T0 -- constraints: why one GPU is not enough."""

from __future__ import annotations

import re

from _lib import Exercise, Page, block, find, link, metric, run, shown, table, val

from parlab.ledger import activations as act
from parlab.ledger.predict import predict
from parlab.models import get_spec
from parlab.topology import Topology

MODEL, SEQ, N = "llama3.1-8b", 4096, 8
STRATEGIES = (
    ("ddp", "P + G + O: everything replicated"),
    ("zero1", "P + G + O / N"),
    ("zero2", "P + (G + O) / N"),
    ("zero3", "(P + G + O) / N"),
    ("fsdp", "(P + G + O) / N"),
)


def _row(out: str, item: str) -> float:
    """Bytes of ``item`` in a ``parlab fit``/``ledger`` table."""
    m = re.search(rf"│ {item}\s+│\s+([\d.]+) (GiB|MiB|KiB)", out)
    assert m, f"no {item} row"
    return float(m.group(1)) * {"GiB": 2**30, "MiB": 2**20, "KiB": 2**10}[m.group(2)]


def _fewest(out: str) -> tuple[int, str, float, float]:
    """(GPUs, best candidate, its peak, its activations) from ``parlab fit``'s candidates."""
    n = re.search(r"split candidates that fit on (\d+) x", out)
    assert n, "no candidate table"
    row = r"┡[━╇]+┩\n│ (.+?)\s+│\s+([\d.]+) GiB │\s+[\d.]+ GiB │\s+([\d.]+) GiB"
    first = re.search(row, out[n.end() :])
    assert first, "no candidate row"
    return int(n.group(1)), first.group(1).strip(), float(first.group(2)), float(first.group(3))


def mechanism() -> str:
    spec = get_spec(MODEL)
    params = spec.num_active_params()
    rows = []
    for s, formula in STRATEGIES:
        led = predict(spec, strategy=s, topology=Topology(world_size=N, dp=N), seq_len=SEQ)
        rows.append([s, formula, f"{led.state_bytes() / params:g}",
                     val(led.state_bytes(), "B")])  # fmt: skip
    terms = act.layer_terms(spec, 0, seq_len=SEQ, r=4, e=2, autocast=True)
    per_tok = act.layer_bytes_per_token(terms, r=4, hidden=spec.hidden)
    term_rows = [[t.name, f"{t.bytes_per_token:,.0f}", f"{t.bytes_per_token / spec.hidden:.1f}"]
                 for t in terms]  # fmt: skip
    total = per_tok * SEQ * spec.layers
    return f"""
Training keeps three kinds of state per parameter, and one kind of state per token.

**State per parameter.** Under the usual mixed-precision recipe (fp32 parameters, bf16
compute, AdamW) every parameter costs P = 4 bytes (the fp32 weight), G = 4 bytes (its fp32
gradient) and O = 8 bytes (AdamW's two fp32 moments): 16 bytes per parameter, replicated on
every data-parallel rank. ZeRO and FSDP shard those terms over the N ranks of the data
parallel group. The ledger (`parlab.ledger.predict`) computes them for {MODEL}
({params / 1e9:.2f} B parameters) at N = {N}:

{table(["strategy", "per rank", "bytes per parameter (N = 8)", f"state per rank, {MODEL}"], rows)}

**State per token (activations).** Backward needs what forward computed, so each block keeps
its inputs and intermediates until its backward has run. For one {MODEL} block in bf16 (with
the fp32 residual stream that autocast keeps) the ledger counts, per token:

{table(["saved tensor", "bytes per token", "x hidden"], term_rows)}

That is {per_tok:,.0f} bytes per token per layer ({per_tok / spec.hidden:.1f} x hidden).
One sequence of {SEQ} tokens through {spec.layers} layers keeps
{per_tok:,.0f} x {SEQ} x {spec.layers} = {val(total, "B")}: activations grow with batch x
sequence x layers, and no data-parallel sharding touches them.

**The peak** is the largest sum of what is alive at one moment: during forward and backward
the states plus the activations; at the optimizer step the states plus the optimizer's
temporaries (the activations are gone by then). One GPU must hold that peak; splitting the
model lowers it and adds communication: every split names what it sends, how often, and
where the ranks must wait for each other (its sync points).
"""


def runs() -> str:
    out = run("fit")
    gpu = find("train-fsdp-8b-*", world_size=2)[-1]
    meas = [["measured peak memory per GPU", val(metric(gpu, "peak_memory").value, "B")],
            ["the ledger's prediction, recorded before the run",
             val(gpu.predictions["peak_memory"].value, "B")],
            ["optimizer state per GPU (sharded over 2)",
             val(metric(gpu, "state_bytes.optimizer").value, "B")],
            ["tokens/s per GPU", val(metric(gpu, "tokens_per_s_per_gpu").value, "tokens/s")]]  # fmt: skip
    return f"""
Every answer starts analytic: `parlab fit` prints the single-GPU ledger, whether it fits, and
the split candidates with what each one adds.

{block("fit", shown(out, first=40))}

On the 2 x H200 machine, the fitted candidate ran for real (`{gpu.command}`), and its peak can
be set against the prediction written into its document before it started ({link(gpu)}):

{table(["quantity", "value"], meas)}
"""


def why() -> str:
    out = run("fit")
    spec = get_spec(MODEL)
    params = spec.num_active_params()
    p, g, o = (_row(out, k) for k in ("params", "grads", "optimizer"))
    tmp, peak = _row(out, "optimizer_temporaries"), _row(out, r"peak")
    overhead, acts = _row(out, "allocator_overhead"), _row(out, "activations")
    n, best, best_peak, best_acts = _fewest(out)
    spec_acts = act.layer_bytes_per_token(
        act.layer_terms(spec, 0, seq_len=SEQ, r=4, e=2, autocast=True), r=4, hidden=spec.hidden
    ) * SEQ * spec.layers
    return f"""
- **The optimizer state is the largest item**: {val(o, "B")} = {params / 1e9:.2f} B parameters
  x 8 bytes (two fp32 moments), twice the weights themselves.
- **The peak is at the optimizer step, not in backward**: params + grads + optimizer +
  AdamW's one state-sized temporary + overhead = {val(p, "B")} + {val(g, "B")} +
  {val(o, "B")} + {val(tmp, "B")} + {val(overhead, "B")} = {val(p + g + o + tmp + overhead, "B")}
  (the printed peak is {val(peak, "B")}). The {val(acts, "B")} of activations are freed
  before the step, so they do not add to this peak: making activations smaller (recompute)
  would not make this model fit on one GPU; sharding the states would.
- **The fewest GPUs is {n}, with {best} at {best_peak:.2f} GiB per GPU**, not 150.58 / {n}.
  A pipeline stage holds 1/p of the layers' states, but under 1F1B the first stage keeps up
  to p micro-batches in flight: p micro-batches x (L/p layers) = the activations of all L
  layers for one micro-batch. Its activations, {best_acts:.2f} GiB, are the single GPU's
  {val(spec_acts, "B")} of block activations: cutting layers divides the states, not the
  activations.
- **Splitting adds traffic and sync points**: the candidates' table gives each split's bytes
  per step and how many times per step a rank must wait; the lines under it name each
  exchange. Pipeline splits send little (one activation per micro-batch per boundary);
  sharded data parallelism moves about the whole model's states every step, but can hide
  most of it behind compute (T2, T5).
"""


def _ex_h200(out: str) -> str:
    n, best, peak, _ = _fewest(out)
    need = _row(out, "peak")
    cap = re.search(r"one H200 \(([\d.]+) GiB\)", out)
    assert cap
    return (f"No: one H200 holds {cap.group(1)} GiB and the single-GPU peak is {val(need, 'B')}. "
            f"It needs {n} H200s; the best candidate is {best} at {peak:.2f} GiB per GPU.")  # fmt: skip


def _check_h200(out: str) -> None:
    n, _, peak, _ = _fewest(out)
    cap = float(re.search(r"one H200 \(([\d.]+) GiB\)", out).group(1))  # type: ignore[union-attr]
    assert "does not fit on one H200" in out and n >= 2 and peak <= cap


def _ex_optimizer(out: str) -> str:
    o = _row(out, "optimizer")
    return (f"The optimizer state, {val(o, 'B')}: ZeRO-1 over 4 GPUs keeps {val(o / 4, 'B')} "
            f"per GPU and saves {val(o * 3 / 4, 'B')} on each, with the same traffic as DDP "
            "(a reduce-scatter and an all-gather move what one all-reduce moves).")  # fmt: skip


def _check_optimizer(out: str) -> None:
    params = get_spec(MODEL).num_active_params()
    o = _row(out, "optimizer")
    others = [_row(out, k) for k in ("params", "grads", "activations")]
    assert o > max(others) and abs(o - 8 * params) / o < 0.01


EXERCISES = [
    Exercise(question="Does Llama-3.1-8B train on one H200 at sequence 4096? If not, how many "
             "H200s does it need, and with which split?", command="fit-h200",
             answer=_ex_h200, check=_check_h200),
    Exercise(question="In the one-H100 ledger, which item would you shard first, and how much "
             "would ZeRO-1 over 4 GPUs save on each GPU?", command="fit",
             answer=_ex_optimizer, check=_check_optimizer),
]  # fmt: skip


def page() -> Page:
    return Page(
        step="T0",
        title="constraints: why one GPU is not enough",
        question="Why can one GPU not hold this model, or not train it fast enough, and what "
        "does splitting it add?",
        mechanism=mechanism(),
        runs=runs(),
        why=why(),
        exercises=EXERCISES,
    )

"""How exactly the ledger predicts what the training-state runs hold and move.

For every PAR-TRAINING-STATE training document in a results folder (default
``results/``), or -- with ``--cpu`` -- for fresh runs of each strategy on 2
gloo CPU ranks (the tiny model, AdamW, through ``parlab.runtime.testing``),
one row per run: per-rank state bytes of each item (params, grads,
optimizer; the largest rank) measured from the real tensors against the
ledger, the comm meter's bytes per step against the ledger's wire table, and
peak memory against the ledger's peak, twice:

- **recorded**: the prediction written into the document before the run (what
  the ledger said then; documents are never rewritten);
- **revised**: the current ledger recomputed for the same workload, revised
  after the measurement, with the knobs that describe what the run's loop does
  (``revised_peak``): ``logits_held`` (``parlab train`` keeps the model's output
  in ``logits`` through backward), ``ddp_old_buckets`` for torch DDP over NCCL
  (its first-iteration buckets outlive the bucket rebuild), ``recompute =
  'op-selective'`` for ``--recompute selective`` (op-level checkpointing), and
  ``reshard_after_forward`` as the run set it. ``torch.compile`` runs get no
  revised peak: the ledger does not model what compile changes.

Targets (issue 5): state bytes and comm bytes equal the ledger exactly
(error 0); peak memory within 5 % on GPUs (CUDA allocator, ``real-training``
documents). On CPU the peak is tracked tensor bytes -- shown, but the 5 %
target is for GPUs only. Errors are ``(measured - predicted) / predicted``.

``--markdown PATH`` also writes the accuracy report (``docs/accuracy.md``):
peak memory, step time and comm bytes, predicted against measured, for every
GPU run under the folder (training state and model internals; the step time and
which side sets it through ``benchmarks/plan_accuracy.py``), and what misses and
why -- every number in it computed here from the documents and the current code.

Run: ``.venv/bin/python benchmarks/ledger_state_accuracy.py [RESULTS_DIR | --cpu]
[--markdown docs/accuracy.md]``. Output starts with the versions and devices;
Ctrl-C prints the rows so far.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

PEAK_TARGET = 0.05
ITEMS = ("params", "grads", "optimizer")
GIB = 2**30


def rel(measured: float | None, predicted: float | None) -> float | None:
    if measured is None or not predicted:
        return None
    return (measured - predicted) / predicted


def err(measured: float | None, predicted: float | None) -> str:
    e = rel(measured, predicted)
    return "-" if e is None else f"{e:+.2%}"


def backend_of(doc: Any) -> str:
    """``nccl`` for GPU documents (``real-training``), ``gloo`` for the CPU ones."""
    return "nccl" if doc.evidence_level == "real-training" else "gloo"


def revised_peak(doc: Any, *, as_eager: bool = False) -> tuple[int | None, str]:
    """The current ledger's peak for the run of ``doc`` (a ``parlab train`` document), and the
    knobs it used; None (with the reason) where the ledger has no model for the run
    (``as_eager``: a compiled run as if it ran eager, what the ledger counts)."""
    from parlab.ledger import Implementation, models_compiled, predict
    from parlab.models import get_spec
    from parlab.projects.training_state import ledger_strategy
    from parlab.topology import Topology

    w, lay = doc.workload, doc.layout
    knobs = lay.get("knobs", {})
    compiled = bool(knobs.get("compile")) and not as_eager
    if str(lay["strategy"]).startswith("deepspeed-"):
        return None, "DeepSpeed: the recorded prediction (its buffers and partitions)"
    backend = backend_of(doc)
    name = str(lay["strategy"])
    strategy = ledger_strategy(name)
    world = int(lay["world_size"])
    dp = int((lay.get("mesh") or {}).get("dp", world))
    recompute = str(knobs.get("recompute") or "none")
    recompute = "op-selective" if recompute == "selective" else recompute
    optimizer = str(w.get("optimizer") or "adamw")
    optimizer = "adamw-fused" if optimizer == "adamw" and backend == "nccl" else optimizer
    # torch DDP over NCCL, before the loop released the first step's buckets: they may be
    # held through the second step (a race; the item is their upper bound)
    torch_ddp = name == "ddp" and backend == "nccl" and knobs.get("ddp_first_buckets") != "released"
    shard = None
    if strategy == "fsdp-hybrid":
        shard = int(knobs.get("hybrid_shard") or max(1, world // 2))
    dtype = {"fp32": "fp32", "bf16-master": "bf16-master"}.get(knobs.get("dtype"), "bf16-mixed")
    spec = get_spec(str(w.get("preset") or w["model"]["name"]))
    if compiled and not models_compiled(spec, dtype=dtype, strategy=strategy, recompute=recompute):
        return (
            None,
            "torch.compile: not modelled (the ledger's compiled blocks: dense SwiGLU, no autocast)",
        )
    # runs before the model called F.rms_norm record no norm_kernel: the explicit RMSNorm;
    # compiled blocks keep what the ledger's compiled terms say, whatever their norm's code
    kernel = "compiled" if compiled else str(knobs.get("norm_kernel") or "explicit")
    # parlab train's loop as the document records it (``projects.training_state.implementation``)
    impl = Implementation(
        norm_kernel=kernel,
        bucket_view=True,
        logits_held=True,
        ddp_old_buckets=torch_ddp,
        ddp_one_rank=name in ("ddp", "ddp-bucket"),
        ddp_rebuild=name == "ddp",
    )
    led = predict(
        spec,
        strategy=strategy,
        topology=Topology(world_size=world, dp=dp),
        micro_batch=int(w["global_batch"]) // dp,
        seq_len=int(w["seq"]),
        dtype=dtype,
        optimizer=optimizer,
        recompute=recompute,
        shard_size=shard,
        reshard_after_forward=bool(knobs.get("reshard_after_forward", True)),
        impl=impl,
    )
    used = ["logits_held"]
    if torch_ddp:
        used.append("ddp_old_buckets")
    if name in ("ddp", "ddp-bucket") and dp == 1:
        used.append("ddp_one_rank")
    if name == "ddp":
        used.append("ddp_rebuild")
    if recompute == "op-selective":
        used.append("recompute=op-selective")
    if not knobs.get("reshard_after_forward", True):
        used.append("reshard_after_forward=False")
    return led.peak_bytes, ", ".join(used)


def revised_comm(doc: Any) -> int | None:
    """The current wire table's bytes per step for ``doc``'s run (None under compile)."""
    from parlab.ledger.traffic import traffic
    from parlab.models import get_spec
    from parlab.projects.training_state import ledger_strategy
    from parlab.topology import Topology

    w, lay = doc.workload, doc.layout
    knobs = lay.get("knobs", {})
    name = str(lay["strategy"])
    if knobs.get("compile") or name.endswith("-naive"):
        return None
    strategy = ledger_strategy(name)
    world = int(lay["world_size"])
    dp = int((lay.get("mesh") or {}).get("dp", world))
    shard = None
    if strategy == "fsdp-hybrid":
        shard = int(knobs.get("hybrid_shard") or max(1, world // 2))
    wire = traffic(
        get_spec(str(w.get("preset") or w["model"]["name"])),
        Topology(world_size=world, dp=dp),
        strategy,
        micro_batch=int(w["global_batch"]) // dp,
        seq_len=int(w["seq"]),
        dtype={"fp32": "fp32", "bf16-master": "bf16-master"}.get(knobs.get("dtype"), "bf16-mixed"),
        shard_size=shard,
        bucket_bytes=int(float(knobs.get("bucket_mb", 25.0)) * 2**20),
        reshard_after_forward=bool(knobs.get("reshard_after_forward", True)),
    )
    return sum(x.total_bytes for x in wire)


def revised_model_internal_peak(doc: Any) -> int | None:
    """The current ledger's peak for a ``parlab project model-internal`` document, through the
    project's own ``predictions`` on the run's configuration rebuilt from the document (a
    single-GPU baseline's schedule, which its layout does not record, from its label; parlab's
    SP as the run had it: ``sp_gather="per-linear"`` where the document records no
    ``sp_saved_input``, ``parlab.plan.fit.runs.implementation_of``)."""
    from parlab.plan.fit.runs import implementation_of
    from parlab.projects.model_internal import RunConfig, predictions

    w, lay = doc.workload, doc.layout
    mesh = lay.get("mesh") or {}
    label = str(lay.get("strategy") or "")
    sched = lay.get("pp_schedule") or ("gpipe" if "gpipe" in label else "1f1b")
    try:
        cfg = RunConfig(
            name=label,
            model=str(w["model"]),
            nproc=int(lay["world_size"]),
            tp=int(mesh.get("tp", 1)),
            pp=int(mesh.get("pp", 1)),
            cp=int(mesh.get("cp", 1)),
            sp=bool(lay.get("sequence_parallel")),
            cp_variant=str(lay.get("cp_variant") or "ring"),
            impl=str(lay.get("implementation") or "parlab"),
            schedule=str(sched).removesuffix("-torch"),  # the project's own names
            vpp=int(lay.get("vpp") or 1),
            micro_batch=int(w["micro_batch"]),
            microbatches=int(w.get("microbatches") or 1),
            seq=int(w["seq"]),
            dtype=str(w.get("dtype") or "fp32"),
        )
        # runs before the model called F.rms_norm record no norm_kernel: the explicit RMSNorm;
        # compiled blocks where the metered step ran them (``metered_step``)
        norm = str(lay.get("norm_kernel") or "explicit")
        if lay.get("compile") and lay.get("metered_step") == "compiled":
            norm = "compiled"
        preds, _ = predictions(cfg, backend_of(doc), norm, implementation_of(doc).sp_gather)
    except (ValueError, KeyError, TypeError):
        return None
    p = preds.get("peak_memory")
    return None if p is None else int(p.value)


# SP runs made before parlab's SP shared one contiguous gathered input between its linears
# (commit 02e7fd8) record no ``sp_saved_input``: each of wq/wk/wv and w1/w3 saved its own copy,
# what the ledger's ``sp_gather="per-linear"`` counts (``revised_model_internal_peak``)
OLD_SP = "SP before 02e7fd8: each linear saved its own gathered copy (sp_gather=per-linear)"


COMPILED = "torch.compile: the ledger's compiled blocks (SwiGLU's silu output recomputed)"

# model-internal runs with torch.compile before their metered step ran compiled: that step ran
# under parlab's comm meter, a dispatch mode under which a compiled block runs its original code
EAGER_METERED = (
    "torch.compile's blocks ran eager in the step whose peak the run reports (under the comm "
    "meter's dispatch mode; documents without layout.metered_step): the eager ledger"
)


def current_peak(doc: Any) -> tuple[int | None, str]:
    """The current ledger's peak for any GPU training document (training state: ``revised_peak``;
    model internals: the project's ``predictions`` on the rebuilt configuration), and a note:
    ``not modelled: <why>`` where the ledger cannot describe what the run held (the value is
    then None, or shown but not the model's claim), ``bound: <why>`` where an item is an upper
    bound, '' otherwise."""
    lay = doc.layout
    if doc.project == "PAR-MODEL-INTERNAL":
        if lay.get("pp_schedule") == "zbv":
            return None, (
                "not modelled: torch's zero-bubble V (rank 0 holds the first and last stages, "
                "weight gradients deferred)"
            )
        old_sp = lay.get("sequence_parallel") and lay.get("implementation", "parlab") == "parlab"
        note = OLD_SP if old_sp and not lay.get("sp_saved_input") else ""
        if lay.get("compile"):
            compiled = lay.get("metered_step") == "compiled"
            note = COMPILED if compiled else EAGER_METERED
        return revised_model_internal_peak(doc), note
    knobs = lay.get("knobs", {})
    if doc.workload.get("host_probe"):
        value, _ = revised_peak(doc)
        return value, (
            "not modelled: the run's host-probe steps (workload.host_probe, from parlab "
            "train's former --host-probe) ran before it inside the memory meter"
        )
    if knobs.get("compile"):
        value, used = revised_peak(doc)
        if value is not None:
            return value, COMPILED
        eager, _ = revised_peak(doc, as_eager=True)
        return eager, f"not modelled: {used} (the eager ledger shown)"
    value, used = revised_peak(doc, as_eager=True)
    if value is None:
        return None, "not modelled: DeepSpeed's engine (its own buckets and partitions)"
    if "ddp_old_buckets" in used:
        return value, (
            "bound: torch DDP's first-iteration buckets, held or not by a race (parlab train "
            "now releases them)"
        )
    return value, ""


def training_documents(folder: Path) -> list[Any]:
    from parlab.contract import read_results
    from parlab.projects.training_state import PROJECT

    if not folder.is_dir():
        return []
    entries, _ = read_results(folder)
    return [
        e.doc
        for e in entries
        if e.doc.project == PROJECT
        and e.doc.status == "ok"
        and e.doc.run_id.startswith("train-")  # the profile documents hold no state bytes
    ]


def rows_from_documents(folder: Path) -> list[dict[str, Any]]:
    from parlab.projects.training_state import run_label

    out = []
    for d in training_documents(folder):
        row: dict[str, Any] = {"run": run_label(d), "level": d.evidence_level, "doc": d}
        for name in (*(f"state_bytes.{i}" for i in ITEMS), "comm_bytes_per_step", "peak_memory"):
            p = d.predictions.get(name)
            row[name] = (d.metric(name), None if p is None else p.value)
        row["revised_peak"], row["revised_knobs"] = revised_peak(d)
        row["revised_comm"] = revised_comm(d)
        out.append(row)
    return out


def rows_from_cpu_runs() -> list[dict[str, Any]]:
    from parlab.projects.training_state import TrainConfig, ledger_predictions, train_rank
    from parlab.runtime.testing import run_ranks

    out = []
    try:
        for s, n in (("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("fsdp", 2),
                     ("fsdp-hybrid", 4)):  # fmt: skip
            cfg = TrainConfig(strategy=s, model="tiny", nproc=n, steps=1, warmup=1, seq=32)
            res = run_ranks(train_rank, n, **cfg.to_json())
            preds, _ = ledger_predictions(cfg, "gloo")
            row: dict[str, Any] = {"run": f"{s} tiny x{n}", "level": "cpu-mechanism"}
            for i in ITEMS:
                row[f"state_bytes.{i}"] = (
                    max(r["state_bytes"][i] for r in res),
                    preds[f"state_bytes.{i}"].value,
                )
            row["comm_bytes_per_step"] = (
                max(r["comm_bytes_per_step"] for r in res),
                preds["comm_bytes_per_step"].value,
            )
            row["peak_memory"] = (max(r["peak_memory"] for r in res), preds["peak_memory"].value)
            row["revised_peak"], row["revised_knobs"] = None, "-"
            row["revised_comm"] = None
            out.append(row)
            print(f"  measured {row['run']}", flush=True)
    except KeyboardInterrupt:
        print("interrupted: showing what was measured")
    return out


def print_table(rows: list[dict[str, Any]]) -> None:
    from parlab.units import format_bytes

    def b(x: float | None) -> str:
        return format_bytes(x) if x is not None else "-"

    head = f"{'run':<30} {'level':<14}"
    for col in (*ITEMS, "comm/step"):
        head += f" {col + ' meas':>14} {'ledger':>12} {'err':>7}"
    head += f" {'peak meas':>11} {'recorded':>11} {'err':>8} {'revised':>11} {'err':>8}"
    print(head)
    worst: dict[str, float] = {}
    for r in rows:
        line = f"{r['run']:<30} {r['level']:<14}"
        for key in (*(f"state_bytes.{i}" for i in ITEMS), "comm_bytes_per_step"):
            m, p = r[key]
            line += f" {b(m):>14} {b(p):>12} {err(m, p):>7}"
        m, p = r["peak_memory"]
        rev = r["revised_peak"]
        line += f" {b(m):>11} {b(p):>11} {err(m, p):>8} {b(rev):>11} {err(m, rev):>8}"
        print(line)
        if r["level"] == "real-training":
            for k, pred in (("recorded", p), ("revised", rev)):
                e = rel(m, pred)
                if e is not None:
                    worst[k] = max(worst.get(k, 0.0), abs(e))
    print()
    for r in rows:
        if r["level"] == "real-training":
            print(f"  revised {r['run']}: {r['revised_knobs']}")
    if not worst:
        print("no real-training documents: the 5 % peak-memory target applies to GPU runs only")
    else:
        for k, v in worst.items():
            print(
                f"worst GPU peak-memory error, {k} prediction: {v:.2%} (target {PEAK_TARGET:.0%})"
            )
        # the newest run of each configuration: what the current code and loop measure
        newest = {r["run"]: r for r in rows if r["level"] == "real-training"}
        cur = [
            (abs(e), name)
            for name, r in newest.items()
            if (e := rel(r["peak_memory"][0], r["revised_peak"])) is not None
        ]
        if cur:
            e, name = max(cur)
            within = sum(1 for x, _ in cur if x <= PEAK_TARGET)
            print(
                f"newest run of each configuration, revised prediction: {within} of {len(cur)} "
                f"within {PEAK_TARGET:.0%}; worst {e:.2%} ({name})"
            )
        none = [r["run"] for r in rows if r["level"] == "real-training" and not r["revised_peak"]]
        if none:
            print(f"no revised prediction (not modelled): {', '.join(none)}")
        print(
            "recorded: the ledger's prediction written into the document before the run; "
            "revised: the current ledger for the same workload, revised after the measurement"
        )


# ---------------------------------------------------------------------------
# The accuracy report (docs/accuracy.md)


def _gib(x: float | None) -> str:
    return "-" if x is None else f"{x / GIB:.2f} GiB"


def _pct(e: float | None) -> str:
    return "-" if e is None else f"{e:+.1%}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:.0f} ms"


def _comm_pairs(doc: Any) -> tuple[float | None, float | None]:
    """(measured, recorded prediction) of the bytes per step the ledger's wire table covers."""
    if "comm_bytes_per_step" in doc.predictions:
        return doc.metric("comm_bytes_per_step"), doc.predictions["comm_bytes_per_step"].value
    keys = [k for k in doc.predictions if k.startswith("comm_bytes_per_step.")]
    if not keys:
        return None, None
    meas = [doc.metric(k) for k in keys]
    if any(m is None for m in meas):
        return None, sum(doc.predictions[k].value for k in keys)
    return sum(meas), sum(doc.predictions[k].value for k in keys)  # type: ignore[arg-type]


def markdown(folder: Path) -> str:
    import plan_accuracy as pa

    train = rows_from_documents(folder)
    gpu_train = [r for r in train if r["level"] == "real-training"]
    from parlab.plan.fit.runs import recompute_of

    rows, ctx = pa.rows_of(folder)
    runs = [r.doc for r in rows]
    lines: list[str] = []
    add = lines.append
    add("# Accuracy: what parlab predicted against what the GPUs measured")
    add("")
    add(
        "Generated by `.venv/bin/python benchmarks/ledger_state_accuracy.py results/ "
        "--markdown docs/accuracy.md` from the documents under `results/` and the current "
        "code; edit the script, not this file. Errors are (measured - predicted) / predicted: "
        "positive means the run needed more than predicted. Evidence: every measured number "
        "is `real-training` (2 x H200, NCCL, CUDA allocator high-water mark for peak memory); "
        "every prediction is `analytic`."
    )
    add("")
    add("## 1. Training state (DDP, ZeRO-1/2/3, FSDP): peak memory")
    add("")
    add(
        "*Recorded*: the ledger's prediction written into the document before the run "
        "(documents are never rewritten). *Revised*: the current ledger recomputed for the "
        "same workload, revised after the measurement; the knobs column says what it "
        "models of the run's loop."
    )
    add("")
    add("| run | peak measured | recorded | error | revised | error | revised with |")
    add("|---|---|---|---|---|---|---|")
    for r in gpu_train:
        m, p = r["peak_memory"]
        rev = r["revised_peak"]
        add(
            f"| {r['run']} | {_gib(m)} | {_gib(p)} | {_pct(rel(m, p))} | {_gib(rev)} | "
            f"{_pct(rel(m, rev))} | {r['revised_knobs']} |"
        )
    add("")
    add("## 2. Training state: state bytes and comm bytes per step")
    add("")
    add(
        "State bytes: counted from the real tensors after the last step (largest rank). Comm "
        "bytes: every collective of the metered step, as nccl-tests counts the payload, "
        "against the ledger's wire table (revised: recomputed with the run's "
        "`reshard_after_forward`)."
    )
    add("")
    add(
        "| run | params err | grads err | optimizer err | comm measured | recorded | error | "
        "revised | error |"
    )
    add("|---|---|---|---|---|---|---|---|---|")
    for r in gpu_train:
        errs = [_pct(rel(*r[f"state_bytes.{i}"])) for i in ITEMS]
        m, p = r["comm_bytes_per_step"]
        rc = r["revised_comm"]
        add(
            f"| {r['run']} | {' | '.join(errs)} | {_gib(m)} | {_gib(p)} | {_pct(rel(m, p))} | "
            f"{_gib(rc)} | {_pct(rel(m, rc))} |"
        )
    add("")
    add("## 3. Every GPU training run: step time, peak memory, comm bytes")
    add("")
    add(
        "Step time: the roofline fitted on the lab's runs (`benchmarks/plan_accuracy.py`, "
        "`docs/planner.md`), GEMM, attention and memory-bound work timed apart, with each "
        "collective's overlap, its efficiencies fitted on stated runs "
        "(`parlab.plan.fit.calibrate`): the GPU's time. The column is out of sample -- for a "
        "run the fit used, the fit redone without every repeat of its configuration. *Sets*: "
        "which side sets the run's step, measured (`benchmarks/plan_accuracy.py`'s docstring: "
        "the run's phase timing, else a host probe of its configuration, else GPU). Peak "
        "memory and comm bytes: the predictions each document recorded before its run "
        "(model-internal runs: the ledger and its wire table for the run's mesh), and the "
        "peak revised by the current ledger (training state: section 1; model internals: the "
        "project's own `predictions` on the run's configuration). Profiled runs are left out "
        "(the profiler's overhead is in their step time)."
    )
    add("")
    add(
        "| run | sets | step measured | roofline | error | peak measured | recorded | error | "
        "revised | error | comm measured | recorded | error | note |"
    )
    add("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    revised = {r["doc"].run_id: r["revised_peak"] for r in gpu_train}
    for r in rows:
        d = r.doc
        meas, roof = d.metric("step_time"), r.pred
        pm = d.predictions.get("peak_memory")
        peak, peak_p = d.metric("peak_memory"), (pm.value if pm is not None else None)
        cm, cp = _comm_pairs(d)
        rv = revised.get(d.run_id)
        if d.project == "PAR-MODEL-INTERNAL":
            rv = revised_model_internal_peak(d)
        note = r.note.replace("cal: ", "calibrates ")
        if not note and r.side.gpu and not r.ok:
            note = pa.repeat_note(d, runs, ctx["rf"]["out"])  # a repeat the model meets, if any
        if recompute_of(d) == "op-selective" and roof is not None:
            rc_s = pa.recompute_s(d, ctx["rf"]["roof"], ctx["cal"])
            if rc_s is not None:
                note += f": recompute {_ms(rc_s)} of the predicted {_ms(roof)}"
        sets = "GPU" if r.side.gpu else f"host ({r.side.rule})"
        add(
            f"| {d.run_id} | {sets} | {_ms(meas)} | {_ms(roof)} | {_pct(rel(meas, roof))} | "
            f"{_gib(peak)} | {_gib(peak_p)} | {_pct(rel(peak, peak_p))} | {_gib(rv)} | "
            f"{_pct(rel(peak, rv))} | {_gib(cm)} | {_gib(cp)} | {_pct(rel(cm, cp))} | {note} |"
        )
    add("")
    add("## 4. What misses, and why")
    add("")
    ddp = next((r for r in gpu_train if r["run"] == "ddp 1.3b"), None)
    z1 = next((r for r in gpu_train if r["run"] == "zero1 1.3b"), None)
    if ddp and z1:
        add("### torch DDP 1.3B: the candidates, sized for this run")
        add("")
        add(
            "1.364B parameters, vocabulary 32,000, sequence 4,096, micro-batch 2 (8,192 tokens "
            "per rank), 24 layers, hidden 2,048; bf16 autocast over fp32 parameters, fp32 "
            "gradients, fused AdamW, `gradient_as_bucket_view`. Sizes from the ledger's items "
            "and the model spec; the excess to explain is the DDP run's over ZeRO-1's (same "
            "loop, dtypes and optimizer, no torch DDP)."
        )
        add("")
        add("| candidate | size | explains the DDP-only excess? |")
        add("|---|---|---|")
        for name, size, verdict in ddp_candidates(ddp, z1):
            add(f"| {name} | {_gib(size)} | {verdict} |")
        add("")
    for para in misses(gpu_train, rows, folder):
        add(f"- {para}")
    add("")
    return "\n".join(lines)


def ddp_candidates(ddp: dict[str, Any], z1: dict[str, Any]) -> list[tuple[str, int, str]]:
    """(candidate, bytes, verdict) for the DDP run's excess, from the ledger and the spec."""
    from parlab.ledger import Implementation, predict
    from parlab.models import get_spec
    from parlab.topology import Topology

    spec = get_spec("1.3b")
    led = predict(
        spec, strategy="ddp", topology=Topology(world_size=2, dp=2), micro_batch=2,
        seq_len=4096, optimizer="adamw-fused",
        impl=Implementation(bucket_view=True, logits_held=True, ddp_old_buckets=True),
    )  # fmt: skip
    m, p = ddp["peak_memory"]
    mz, pz = z1["peak_memory"]
    excess = int((m - p) - (mz - pz))
    tokens = 2 * 4096
    resident = sum(led.value(k) for k in ("params", "grads", "optimizer"))
    fb = led.peak_bytes - resident
    return [
        ("DDP-only excess (measured)", excess, "the number to explain"),
        (
            "autocast's bf16 weight copies, held to backward (2 B x matmul weights)",
            led.value("autocast_weight_copies"),
            "no: already a ledger item, and ZeRO-1 holds the same",
        ),
        (
            "the same for every parameter (2 B x P)",
            2 * spec.num_params(),
            "no: embeddings are not cast; the size does not match either",
        ),
        (
            "DDP buckets as a second copy of the gradients (4 B x P)",
            led.value("ddp_old_buckets"),
            f"yes, to {abs(excess - led.value('ddp_old_buckets')) / 2**20:.0f} MiB: the "
            "first iteration's buckets, alive through the second iteration (`ddp_old_buckets`)",
        ),
        (
            "fused AdamW temporaries",
            0,
            "no: the fused kernel updates in place; the optimizer step's peak "
            f"({_gib(resident)}) is far below forward/backward's ({_gib(resident + fb)})",
        ),
        (
            "held bf16 logits (tokens x vocab x 2 B)",
            tokens * spec.vocab_size * 2,
            "no: common to every strategy (the ZeRO/FSDP residual), now `logits_held`",
        ),
        (
            "fp32 logits + cross-entropy buffers (tokens x vocab x 12 B)",
            led.value("logits") + led.value("loss_buffers"),
            "no: already items, common to every strategy",
        ),
    ]


def _released(row: dict[str, Any]) -> bool:
    knobs = row["doc"].layout.get("knobs", {})
    return knobs.get("ddp_first_buckets") == "released"


def iteration_peaks(folder: Path) -> str:
    """What ``scripts/gpu/accuracy.sh`` measured, read from its logs under ``folder/logs``:
    torch DDP's allocator peak per iteration, per model and variant."""
    import json

    parts = []
    for path in sorted(folder.glob("logs/*/accuracy/ddp-iteration-peaks-*.json.log")):
        d = json.loads(path.read_text())
        peaks = [r["peak_bytes"] for r in d["iterations"]]
        if None in peaks or len(peaks) < 3:
            continue
        parts.append(
            f"{d['model']} {d['variant']} {' / '.join(f'{x / 2**30:.2f}' for x in peaks)} GiB "
            f"(iteration 2 - 3 = {(peaks[1] - peaks[2]) / 2**30:+.2f} GiB; gradient bytes "
            f"{d['grad_bytes'] / 2**30:.2f} GiB; `{path.relative_to(folder)}`)"
        )
    return "; ".join(parts)


def misses(rows: list[dict[str, Any]], steps: list[Any], folder: Path) -> list[str]:
    """The findings, with their numbers computed from the rows (``steps``: plan_accuracy's rows
    of every GPU run)."""
    from parlab.ledger import Implementation, predict
    from parlab.models import get_spec
    from parlab.topology import Topology

    out: list[str] = []
    by = {r["run"]: r for r in rows}
    ddp_rows = [r for r in rows if r["run"].startswith("ddp ") and r.get("doc") is not None]
    if ddp_rows:
        old = [r for r in ddp_rows if not _released(r)]
        new = [r for r in ddp_rows if _released(r)]
        spec = get_spec("1.3b")
        held = predict(
            spec, strategy="ddp", topology=Topology(world_size=2, dp=2), micro_batch=2,
            seq_len=4096, optimizer="adamw-fused",
            impl=Implementation(bucket_view=True, ddp_old_buckets=True),
        ).value("ddp_old_buckets")  # fmt: skip

        def errs(rs: list[dict[str, Any]]) -> str:
            return ", ".join(
                f"{r['run']} {_pct(rel(r['peak_memory'][0], r['peak_memory'][1]))}" for r in rs
            )

        out.append(
            "**torch DDP's peak.** Before the second iteration's forward DDP rebuilds its "
            "buckets (new buffers in gradient-arrival order); the first iteration's buffers "
            "stay referenced by ProcessGroupNCCL's stash of its async all-reduces until the "
            "watchdog has polled them complete, so whether they are still alive at the second "
            f"iteration's peak is a race: one extra fp32 copy of every gradient ({_gib(held)} "
            "at the 1.3B, the ledger's `ddp_old_buckets`). `scripts/gpu/accuracy.sh` measured "
            f"it per iteration: {iteration_peaks(folder) or 'no log of it under this folder'} "
            "(the race lost or won by the forward's length). Runs before the fix (recorded predictions; "
            f"the earliest made before the item existed): {errs(old) or 'none'}. `parlab "
            "train` now removes the race (`TorchDDP.release_first_buckets`: after the first "
            "step, wait for the GPU, give the watchdog 0.5 s, one small all-reduce), records "
            "`ddp_first_buckets = released` and predicts without the item: "
            f"{errs(new) or 'no such run yet'}."
        )
    common = [
        rel(r["peak_memory"][0], r["peak_memory"][1])
        for r in rows
        if r["run"] in ("zero1 1.3b", "zero2 1.3b", "zero3 1.3b", "fsdp 1.3b")
    ]
    common_f = [c for c in common if c is not None]
    if common_f:
        out.append(
            f"**The common +{min(common_f):.1%} to +{max(common_f):.1%} on ZeRO/FSDP 1.3B "
            "(recorded).** `parlab train` keeps the model's output in `logits` through "
            "backward (tokens x vocab x 2 B = 0.49 GiB here); the recorded predictions assumed "
            "it freed. The ledger has the knob (`logits_held`); the revised column sets it. "
            "The 8B run, where the held logits are 0.98 GiB, is then over-predicted by 0.7 % "
            "-- not investigated (inside the 5 % target)."
        )
    sel = by.get("fsdp+selective-recompute 1.3b")
    if sel:
        m, p = sel["peak_memory"]
        out.append(
            f"**Selective recompute ({_pct(rel(m, p))} recorded, "
            f"{_pct(rel(m, sel['revised_peak']))} revised).** The run's policy is op-level "
            "(torchtitan's: keep every matmul and attention output, recompute the rest); the "
            "ledger's `selective` is Korthikanti's (recompute only the attention core, which "
            "flash attention already does: no saving), so the recorded prediction saw no "
            "saving at all. The ledger now models the op-level policy as `recompute = "
            "'op-selective'`, and so does the planner's step time: no FLOP again, the blocks' "
            "elementwise forward again in backward. That recomputed work does not reach the "
            "measured step; the per-op host cost of the policy's dispatch mode is not "
            "measured (section 3)."
        )
    comp = by.get("fsdp+compile 1.3b")
    if comp:
        m, p = comp["peak_memory"]
        rev = comp["revised_peak"]
        out.append(
            f"**torch.compile ({_pct(rel(m, p))} recorded"
            + (f", {_pct(rel(m, rev))} revised" if rev else "")
            + ").** A compiled block keeps what AOTAutograd's min-cut partition of its forward "
            "and backward (as inductor runs it) chooses: the norm's input and rstd, as the "
            "fused kernel, and of SwiGLU only w1's and w3's outputs and their product -- the "
            "silu output is recomputed in backward. The ledger's `norm_kernel = 'compiled'` "
            "counts that (`tests/test_ledger_compiled.py` checks it against the partition of "
            "the reference block on the CPU), for dense SwiGLU blocks without autocast; the "
            "revised column uses it."
        )
    nr = by.get("fsdp+no-reshard 1.3b")
    if nr:
        m, _ = nr["peak_memory"]
        out.append(
            "**FSDP without reshard after forward.** The run recorded no peak or comm "
            "prediction (its note: the ledger has no `reshard_after_forward=False` knob -- "
            "`parlab train` did not pass one); the ledger's "
            f"`reshard_after_forward=False` now gives {_gib(nr['revised_peak'])} "
            f"({_pct(rel(m, nr['revised_peak']))}), and the wire table "
            f"{_gib(nr['revised_comm'])} against {_gib(nr['comm_bytes_per_step'][0])} "
            f"measured ({_pct(rel(nr['comm_bytes_per_step'][0], nr['revised_comm']))})."
        )
    import plan_accuracy as pa

    runs = [r.doc for r in steps]
    gpu = [r for r in steps if r.side.gpu]
    if steps:
        rec = [r for r in gpu if pa.recorded(r.doc) is not None]
        rec_ok = sum(
            pa.within(pa.recorded(r.doc), r.doc.metric("step_time"), pa.STEP_TARGET) == "yes"
            for r in rec
        )
        configs = pa.configurations(gpu)
        host = [r for r in steps if not r.side.gpu]
        out.append(
            f"**Step time.** Of {len(steps)} runs, the GPU sets the step of {len(gpu)} "
            f"(measured: `benchmarks/plan_accuracy.py`). (a) Those that recorded a prediction "
            f"before they ran: {rec_ok} of {len(rec)} within 10 % (target 90 %). (b) Their "
            f"configurations' median step within 10 % of the prediction: "
            f"{sum(c['ok'] for c in configs.values())} of {len(configs)} (target 85 %). "
            f"(c) {len(host)} host-bound runs, no target: the GPU's time is a floor of their "
            f"step ({sum(r.ok for r in host)} of them within 10 % of it). Every GPU-set run "
            f"under the current out-of-sample prediction: {sum(r.ok for r in gpu)} of "
            f"{len(gpu)} within 10 %. The misses and the runs the model does not describe are "
            "listed in `benchmarks/results/plan_accuracy.txt`; the published large-scale runs "
            "against the built-in model are `benchmarks/plan_published.py`'s."
        )
    mi_mem = []
    gpipe_said = False
    for d in runs:
        if d.project != "PAR-MODEL-INTERNAL":
            continue
        pm = d.predictions.get("peak_memory")
        e = rel(d.metric("peak_memory"), pm.value if pm is not None else None)
        rv, why = current_peak(d)
        e2 = rel(d.metric("peak_memory"), rv)
        if (e is None or abs(e) > PEAK_TARGET) or (e2 is None or abs(e2) > PEAK_TARGET):
            tail = f"; {why}" if why else ""
            mi_mem.append(f"{d.run_id.rsplit('-', 2)[0]} {_pct(e)} (revised {_pct(e2)}{tail})")
        if "single-pp2-gpipe" in d.run_id and e is not None and not gpipe_said:
            gpipe_said = True
            out.append(
                f"**The 1-GPU GPipe baseline ({_pct(e)} recorded, {_pct(e2)} revised).** It "
                "runs the pipeline's eight micro-batches in GPipe order on one stage: every "
                "forward before any backward, so all eight micro-batches' activations are "
                "alive at once. The ledger counted one in flight whenever pp = 1; it now "
                "counts m for GPipe at any pp."
            )
    if mi_mem:
        out.append(
            "**Model-internal peaks (errors as measured / predicted - 1; outside 5 % recorded "
            "or revised):** "
            + ", ".join(mi_mem)
            + ". What the revised ledger added, each a tensor the run holds, checked on 2 gloo "
            "ranks against the tracked bytes of the project's own loop to 0.6 % "
            "(`tests/test_ledger_revisions.py`): the step without a schedule keeps the "
            "model's output (`out`) through backward (`logits_held`: the TP, CP and one-rank "
            "runs); parlab's vocab-parallel cross-entropy holds its softmax, the one-hot "
            "target and its masked copy beside the new gradient in backward (a third "
            "vocab-sized fp32 buffer); torch's DTensor TP keeps the embeddings, the output "
            "layer and the logits whole (`vocab_parallel=False`, no loss parallel: its param "
            "bytes now equal the ledger's); GPipe's last stage keeps every other "
            "micro-batch's loss graph (`pending_loss_buffers`) and peaks before its gradients "
            "exist; the SP runs made before the linears shared one gathered input (their "
            "documents record no `sp_saved_input`) kept a copy of the gathered sequence per "
            "linear at micro-batch > 1 (`sp_gather='per-linear'`: three more B x S x H per "
            "SwiGLU block; on 2 gloo ranks with the all-gather of before 02e7fd8, "
            "`tests/test_ledger_sp_per_linear.py`, to 0.1 %). Not modelled: torch's "
            "zero-bubble V. "
            "The context-parallel ring runs stay 3-4 % above the ledger (about 1.6 GiB at "
            "32k tokens, 3.1 GiB at 64k: it grows with the sequence); on 2 gloo ranks the "
            "ring is 3 % *below* it, so what the GPU ring path holds beyond the ledger is "
            "not named here."
        )
    comm = []
    for d in runs:
        if d.project != "PAR-MODEL-INTERNAL":
            continue
        cm, cp = _comm_pairs(d)
        e = rel(cm, cp)
        if e is not None and abs(e) > 0.02:
            comm.append(f"{d.run_id.rsplit('-', 2)[0]} {_pct(e)}")
    if comm:
        out.append(
            "**Model-internal comm bytes off the wire table:** "
            + ", ".join(comm)
            + ". Pipeline: the run's `comm_bytes_per_step.pp` is the bytes one rank sends "
            "(its c10d send and recv bytes are equal), while the wire table counts an "
            "activation and a gradient message per micro-batch and virtual stage: 2x on "
            "two stages; on the interleaved run (4 chunks on 2 ranks) a micro-batch crosses "
            "between the ranks 3 times forward and 3 times backward, so each rank sends 3 "
            "messages per micro-batch where the table counts 4. The two definitions need agreeing with the "
            "model-internal project (and the table's interleaved count fixing). Ring "
            "attention: measured 1.5x the table, not explained here."
        )
    return out


def main(argv: list[str]) -> int:
    import torch

    md_path: Path | None = None
    if "--markdown" in argv:
        i = argv.index("--markdown")
        if i + 1 >= len(argv):
            print("--markdown needs a path (e.g. docs/accuracy.md)")
            return 2
        md_path = Path(argv[i + 1])
        argv = argv[:i] + argv[i + 2 :]
    print(f"torch {torch.__version__}  CUDA {torch.version.cuda or '-'}  "
          f"NCCL {'.'.join(map(str, torch.cuda.nccl.version())) if torch.cuda.is_available() else '-'}  "
          f"devices: {torch.cuda.device_count()} GPU(s)")  # fmt: skip
    if argv and argv[0] == "--cpu":
        rows = rows_from_cpu_runs()
        folder = None
    else:
        folder = Path(argv[0] if argv else "results")
        rows = rows_from_documents(folder)
    if not rows:
        print("no PAR-TRAINING-STATE documents found")
        return 1
    print_table(rows)
    if md_path is not None:
        if folder is None:
            print("--markdown reads a results folder, not --cpu runs")
            return 2
        md_path.parent.mkdir(parents=True, exist_ok=True)
        md_path.write_text(markdown(folder))
        print(f"wrote {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))

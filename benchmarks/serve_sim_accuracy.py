"""The serving simulator against measured runs: mean TTFT and TPOT (target: within 10 %).

Input: the routing-policy documents of ``parlab serve project`` under a results folder
(``PAR-DISTRIBUTED-INFERENCE/serve-bench-*.json`` with ``artifacts.iteration_log``: the
replicas' iteration logs saved beside them, ``<run_id>.iterations.jsonl``, gzipped in the
committed ``results/``). Runs of one
``parlab serve project`` call form a set (same command, workload, replicas; consecutive
documents).

For each run the simulator (``parlab.serve.sim.simulate``) replays the run's own arrivals
(the seeded dataset and arrival offsets the project used, rebuilt from the document's
workload) over the same replicas, routing policy, KV slots and prefix-cache size, with the
iteration costs taken four ways:

- ``idle``: the replica's idle profile recorded in the document (``Engine.profile``, no
  serving loop; older documents: four numbers from short prompts with the prefix cache off;
  newer: prefills with the prefix cache on, and the graph decode's seconds per key-length
  bucket) -- what the project predicts before the runs;
- ``first``: fitted (``sim.fit_profile``) on the set's first run's log, used for the others
  (for the first run itself: in sample) -- what the project records as ``@in_run``;
- ``others``: fitted on the pooled logs of every *other* run of the set (leave-one-out: no
  run predicts itself);
- ``own``: fitted on the run's own log (in sample: the simulator's queueing and batching
  alone, with the costs it saw).

A set run with one replica repeats one configuration under every policy name (all route to
the same replica): the spread of its measured means is the measurement's own repeatability,
printed beside it. Where the iteration logs carry the engine thread's CPU time, the
median decode iteration's wall and CPU time are printed: equal means the replica is
host-bound (the GPU waits for the Python that enqueues its kernels), so its iteration
costs follow the host CPU's speed.

Where a profile or a log carries the graph decode's seconds per key-length bucket
(``decode_bucket_s``; logged decode iterations with ``graph`` > 0), the simulator prices each
decode iteration by the bucket of its longest running request, for every source alike.

Older logs have no ``cached`` field on prefill iterations; for a dataset whose prompts all
have one length (``shared-prefix``) the script fills it in as ``batch x prompt length -
tokens``, and says so.

The idle profile grew over the project's life (``profile_kind``): prefills timed eagerly;
then per static-prefill pair (CUDA graphs); then with the replica's serving loop probed
(``sim.fit_loop``: what an iteration costs beyond the engine's own work); then with a
request's path through the router (``ReplicaProfile.path_s``). The last lines count the idle
source by generation.

Run: ``python benchmarks/serve_sim_accuracy.py [RESULTS_DIR]`` (default ``results``).
Prints one table per set and the count of runs within 10 % per cost source.
"""

from __future__ import annotations

import gzip
import json
import statistics
import sys
from pathlib import Path
from typing import Any

from parlab.contract import Document, read_results
from parlab.serve import bench, datasets, sim
from parlab.serve.policy import PolicyConfig

PROJECT = "PAR-DISTRIBUTED-INFERENCE"
SOURCES = ("idle", "first", "others", "own")
KINDS = (
    "eager prefill",
    "graph prefill",
    "graph prefill + serving loop",
    "graph prefill + serving loop + request path",
)
"""What the idle profile of a set priced (``profile_kind``), in the order parlab gained them."""


def profile_kind(profile: dict[str, Any] | None) -> str:
    """Which generation of the idle profile a document recorded: prefills timed eagerly, or
    per static-prefill pair (``prefill_bucket_s``); with the serving loop's probe
    (``loop_base_s``); with the request's path through the router (``path_s``)."""
    p = profile or {}
    if p.get("prefill_bucket_s") is None:
        return KINDS[0]
    if "loop_base_s" not in p:
        return KINDS[1]
    return KINDS[3] if "path_s" in p else KINDS[2]


def load_log(doc: Document, folder: Path) -> list[dict[str, Any]] | None:
    """The run's iteration log, as written or gzipped beside it (``<name>.gz``: how the
    committed results keep them)."""
    name = doc.artifacts.get("iteration_log")
    if not name:
        return None
    path, packed = folder / name, folder / f"{name}.gz"
    if path.exists():
        text = path.read_text()
    elif packed.exists():
        text = gzip.decompress(packed.read_bytes()).decode()
    else:
        return None
    return [json.loads(line) for line in text.splitlines() if line]


def fill_cached(log: list[dict[str, Any]], prompt_len: int | None) -> bool:
    """Fill ``cached`` on prefill entries that lack it (fixed-length prompts only)."""
    missing = [e for e in log if e["kind"] == 0 and "cached" not in e]
    if not missing or prompt_len is None:
        return False
    for e in missing:
        e["cached"] = max(0, int(e["batch"]) * prompt_len - int(e["tokens"]))
    return True


def workload_of(doc: Document) -> tuple[sim.Workload, int | None]:
    """The run's requests and arrivals, rebuilt as ``parlab serve project`` built them."""
    w = doc.workload
    params = dict(w["dataset_params"])
    if w["dataset"] != "shared-prefix":
        raise ValueError(f"{doc.run_id}: dataset {w['dataset']!r} is not rebuilt here")
    ds = datasets.shared_prefix(**params)
    offsets = bench.arrival_offsets(
        len(ds.requests),
        rate=float(w["request_rate"]),
        burstiness=float(w["burstiness"]),
        seed=int(w["seed"]),
    )
    work = sim.from_dataset(ds, offsets, block=16)
    lens = {int(x) for x in work.prompt_len}
    return work, (lens.pop() if len(lens) == 1 else None)


def simulate(doc: Document, work: sim.Workload, costs: dict[str, float]) -> dict[str, Any]:
    lay = doc.layout
    prof = sim.ReplicaProfile.from_json(
        costs,
        max_batch=int(lay["max_batch"]),
        block=16,
        cache_blocks=int(lay.get("prefix_cache_blocks") or 0) if lay.get("prefix_cache") else 0,
    )
    pol = PolicyConfig(name=str(lay["policy"]), seed=0, tree_blocks=prof.cache_blocks)
    return sim.simulate(work, replicas=int(lay["replicas"]), profile=prof, policy=pol)


def sets_of(docs: list[Document]) -> list[list[Document]]:
    """Consecutive policy runs of one project call (same command and workload)."""
    runs = sorted(
        (
            d
            for d in docs
            if d.project == PROJECT
            and d.layout.get("policy")
            and d.artifacts.get("iteration_log")
            and d.status == "ok"
        ),
        key=lambda d: d.created,
    )

    def key(d: Document) -> tuple[str, str]:
        return d.command, json.dumps(d.workload.get("dataset_params"), sort_keys=True)

    out: list[list[Document]] = []
    for d in runs:
        last = out[-1] if out else []
        same = bool(last) and key(d) == key(last[0])
        if same and d.layout.get("policy") not in {x.layout.get("policy") for x in last}:
            last.append(d)
        else:
            out.append([d])
    return out


def main(argv: list[str]) -> int:
    root = Path(argv[1] if len(argv) > 1 else "results")
    folder = root / PROJECT
    docs = [e.doc for e in read_results(root)[0]]
    within = {s: [0, 0] for s in SOURCES}
    by_kind = {k: [0, 0] for k in KINDS}
    for group in sets_of(docs):
        logs: dict[str, list[dict[str, Any]]] = {}
        works: dict[str, sim.Workload] = {}
        filled = False
        for d in group:
            work, plen = workload_of(d)
            log = load_log(d, folder)
            assert log is not None
            filled |= fill_cached(log, plen)
            logs[d.run_id], works[d.run_id] = log, work
        first = sim.fit_profile(logs[group[0].run_id])
        kind = profile_kind(group[0].workload.get("replica_profile"))
        print(f"== set of {len(group)} runs from {group[0].created} ({group[0].command})")
        print(f"   idle profile: {kind}")
        if filled:
            print("   (prefill 'cached' filled in from the fixed prompt length: older logs)")
        head = f"{'policy':<18} {'measured TTFT':>13} {'TPOT':>6}  " + "  ".join(
            f"{s + ' TTFT':>12} {'err':>6} {'TPOT':>6} {'err':>6}" for s in SOURCES
        )
        print(head)
        print("-" * len(head))
        for d in group:
            others = [e for rid, log in logs.items() if rid != d.run_id for e in log]
            fitted = {
                "idle": d.workload.get("replica_profile"),
                "first": first,
                "others": sim.fit_profile(others) if others else None,
                "own": sim.fit_profile(logs[d.run_id]),
            }
            row = f"{d.layout['policy']:<18} {d.metric('mean_ttft_ms'):>13.1f} "
            row += f"{d.metric('mean_tpot_ms'):>6.1f}  "
            cells = []
            for s in SOURCES:
                costs = fitted[s]
                if costs is None:
                    cells.append(f"{'-':>12} {'-':>6} {'-':>6} {'-':>6}")
                    continue
                res = simulate(d, works[d.run_id], costs)
                e1 = res["mean_ttft_ms"] / d.metric("mean_ttft_ms") - 1
                e2 = res["mean_tpot_ms"] / d.metric("mean_tpot_ms") - 1
                ok = abs(e1) <= 0.10 and abs(e2) <= 0.10
                within[s][0] += ok
                within[s][1] += 1
                if s == "idle":
                    by_kind[kind][0] += ok
                    by_kind[kind][1] += 1
                cells.append(
                    f"{res['mean_ttft_ms']:>12.1f} {e1:>+6.0%} {res['mean_tpot_ms']:>6.1f} {e2:>+6.0%}"
                )
            print(row + "  ".join(cells))
        if all(int(d.layout["replicas"]) == 1 for d in group) and len(group) > 1:
            # one replica: every policy routes alike, so the runs repeat one configuration
            tt = [d.metric("mean_ttft_ms") for d in group]
            tp = [d.metric("mean_tpot_ms") for d in group]
            print(
                f"   one replica, {len(group)} repeats of one configuration: mean TTFT "
                f"{min(tt):.1f}-{max(tt):.1f} ms ({(max(tt) - min(tt)) / statistics.mean(tt):.0%} "
                f"of their mean), mean TPOT {min(tp):.1f}-{max(tp):.1f} ms "
                f"({(max(tp) - min(tp)) / statistics.mean(tp):.0%}): the measurement's own spread"
            )
        host = []
        for d in group:
            dec = [e for e in logs[d.run_id] if e["kind"] == 1 and "cpu" in e]
            if dec:
                wall = statistics.median(e["s"] for e in dec) * 1e3
                cpu = statistics.median(e["cpu"] for e in dec) * 1e3
                host.append(f"{d.layout['policy']} {wall:.1f} / {cpu:.1f}")
        if host:
            print(
                "   decode iteration, median wall / engine-thread CPU ms (equal: the engine "
                "thread was busy throughout -- eagerly, enqueueing the kernels the GPU waits "
                "for; with graphs, spinning in torch.cuda.synchronize): " + "; ".join(host)
            )
        print(
            "   fitted on the first run: "
            + ", ".join(f"{k} {v * 1e6:.2f} us" for k, v in first.items() if k != "decode_bucket_s")
            + "".join(
                f", decode at {L} keys {t * 1e3:.2f} ms"
                for L, t in first.get("decode_bucket_s", {}).items()
            )
        )
        print()
    print("runs with both mean TTFT and mean TPOT within 10 %, per cost source:")
    for s in SOURCES:
        print(f"  {s:<7} {within[s][0]} of {within[s][1]}")
    print("the idle profile (what the project predicts before its runs), by what it priced:")
    for k in KINDS:
        if by_kind[k][1]:
            print(f"  {k:<44} {by_kind[k][0]} of {by_kind[k][1]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

"""Step 3 of ``parlab project serving``: the same seeded workload through a router of each
policy, one ``serving-benchmark`` document each, with the simulator's predictions beside."""

from __future__ import annotations

import contextlib
from typing import Any

from rich.console import Console

from parlab.contract import Document
from parlab.projects.serving import documents, rank
from parlab.projects.serving.config import Preset
from parlab.serve import bench, datasets, sim
from parlab.serve.policy import PolicyConfig
from parlab.serve.procs import get_json
from parlab.serve.router import Router, RouterConfig


def bench_config(base: str, **kw: Any) -> bench.BenchConfig:
    """The load generator's settings the project sends with (no progress bar, 120 s a
    request)."""
    return bench.BenchConfig(base_url=base, progress=False, request_timeout_s=120.0, **kw)


def _workload(p: Preset, seed: int, n: int) -> datasets.Dataset:
    groups = max(1, min(p.groups, n))
    return datasets.shared_prefix(
        num_groups=groups,
        prompts_per_group=max(1, n // groups),
        prefix_len=p.prefix_len,
        question_len=p.question_len,
        output_len=p.output_len,
        seed=seed,
    )


async def _route(
    urls: list[str], name: str, p: Preset, ds: datasets.Dataset
) -> tuple[bench.BenchResult, bench.BenchConfig, dict[str, Any]]:
    """The workload through a router of ``name``: the result, its config, the router's
    stats."""
    pol = PolicyConfig(name=name, seed=0, tree_blocks=max(1, p.cache_blocks))
    router = Router(RouterConfig(replicas=tuple(urls), policy=pol))
    await router.start()
    cfg = bench_config(router.url, request_rate=p.rate, seed=0, max_duration_s=300.0)
    try:
        res = await bench.arun(cfg, ds)
    finally:
        stats = router.stats()
        await router.stop()
    return res, cfg, stats


def _predictions(
    work: sim.Workload,
    urls: list[str],
    pol: PolicyConfig,
    prof: sim.ReplicaProfile | None,
    fitted: sim.ReplicaProfile | None,
) -> tuple[dict[str, Any] | None, dict[str, Any] | None]:
    """The simulator's summaries of the policy's run: from replica 0's profile, and from
    the profile fitted to a run's step log."""
    pred = run = None
    if prof is not None:
        pred = sim.simulate(work, replicas=len(urls), profile=prof, policy=pol)
    if fitted is not None:
        run = sim.simulate(work, replicas=len(urls), profile=fitted, policy=pol)
    return pred, run


def _layout(urls: list[str], engines: list[dict[str, Any]], p: Preset, name: str) -> dict:
    parlab_replicas = all(e["engine"] == "parlab" for e in engines)
    return {
        "world_size": len(urls),
        "mesh": {"replica": len(urls)},
        "strategy": f"router:{name}",
        "policy": name,
        "replicas": len(urls),
        "engines": engines,
        "model": engines[0].get("model"),
        "max_batch": p.max_batch if parlab_replicas else None,
        "prefix_cache_blocks": p.cache_blocks if parlab_replicas else None,
    }


def _notes(p: Preset, urls: list[str], resets: list[Any], predicted: bool) -> list[str]:
    return [
        *(["predictions: discrete-event simulation (parlab.serve.sim) of the same "
           "arrivals, from replica 0's measured step profile"] if predicted else []),
        *([f"measured after a discarded round-robin pass of {p.warmup_prompts} "
           "requests of the same shape (the replicas' cold start)"]
          if p.warmup_prompts else []),
        *([f"prefix cache not reset between policies on {u} (no reset endpoint)"
           for u, r in zip(urls, resets, strict=True) if r is None]),
    ]  # fmt: skip


def _print_line(
    console: Console, name: str, res: bench.BenchResult, n: int, stats: dict, pred: Any
) -> None:
    s = res.summary
    sim_note = "" if pred is None else f" (sim {pred['mean_ttft_ms']:.1f})"
    console.print(
        f"{name:>18}: {s['completed']}/{n} ok, "
        f"{s['request_throughput']:.2f} req/s, TTFT mean {s['mean_ttft_ms']:.1f} ms{sim_note}, "
        f"TPOT mean {s['mean_tpot_ms']:.2f} ms, cache hit {s['cache_hit_rate'] or 0:.1%}, "
        f"load {[r['routed'] for r in stats['replicas']]}"
    )


async def run_policies(
    urls: list[str],
    engines: list[dict[str, Any]],
    p: Preset,
    policies: list[str],
    profile: dict[str, Any] | None,
    console: Console,
    command: str,
) -> list[Document]:
    """One document per policy (see the module docstring of ``run.py``, step 3)."""
    ds = _workload(p, 0, p.num_prompts)
    offsets = bench.arrival_offsets(len(ds.requests), rate=p.rate, burstiness=1.0, seed=0)
    work = sim.from_dataset(ds, offsets, block=16)
    shape = {"max_batch": p.max_batch, "block": 16, "cache_blocks": p.cache_blocks}
    prof = sim.ReplicaProfile.from_json(profile, **shape) if profile else None
    parlab_replicas = all(e["engine"] == "parlab" for e in engines)
    if p.warmup_prompts:
        # a discarded pass of the same shape (other prompts): without it the first measured
        # policy alone pays the replicas' cold start (allocator growth, first-seen shapes)
        await _route(urls, "round_robin", p, _workload(p, 1, p.warmup_prompts))
    docs: list[Document] = []
    calibration: tuple[dict[str, Any], str] | None = None
    for name in policies:
        resets = [await rank.reset_cache(u) for u in urls]
        res, cfg, stats = await _route(urls, name, p, ds)
        pol = PolicyConfig(name=name, seed=0, tree_blocks=max(1, p.cache_blocks))
        eng = None
        if parlab_replicas:
            eng = [await get_json(u + "/engine/stats") for u in urls]
            logs = [e for u in urls for e in await get_json(u + "/engine/log")]
            if calibration is None:
                with contextlib.suppress(ValueError):  # a run with no decode step
                    calibration = (sim.fit_profile(logs), name)
        fitted = sim.ReplicaProfile.from_json(calibration[0], **shape) if calibration else None
        pred, run = _predictions(work, urls, pol, prof, fitted)
        pred_run = (run, calibration[1]) if run is not None and calibration else None
        doc = bench.to_document(
            res,
            cfg,
            ds,
            command=command,
            role="baseline" if name == policies[0] else "candidate",
            layout=_layout(urls, engines, p, name),
            notes=_notes(p, urls, resets, pred is not None),
        )
        doc = documents.policy_document(
            doc, stats=stats, engine_stats=eng, pred=pred, pred_run=pred_run, profile=profile,
            name=name,
        )  # fmt: skip
        docs.append(doc)
        _print_line(console, name, res, len(ds.requests), stats, pred)
    return docs

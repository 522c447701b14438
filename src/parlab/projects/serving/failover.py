"""Step 4 of ``parlab project serving``: a replica killed under load behind a round-robin
router, then restarted; the document counts what failed, what went elsewhere, what rejoined."""

from __future__ import annotations

import asyncio
import time

from rich.console import Console

from parlab.contract import Document
from parlab.projects.serving import documents
from parlab.projects.serving.config import Preset
from parlab.projects.serving.policies import bench_config
from parlab.serve import bench, datasets
from parlab.serve.policy import PolicyConfig
from parlab.serve.procs import ReplicaProcess, post_json, restart_replica
from parlab.serve.router import Router, RouterConfig


async def run_failover(
    procs: list[ReplicaProcess], p: Preset, command: str, console: Console
) -> Document:
    """Round robin over the replicas; the last is killed (SIGKILL) a third of the way
    through the arrivals; then restarted on its port, it must rejoin and serve again."""
    urls = [r.url for r in procs]
    for u in urls:
        await post_json(u + "/engine/reset")
    ds = datasets.synthetic(
        num_prompts=max(12, int(3 * p.rate)),  # 3 s of arrivals: 2 s of them after the kill
        input_len=p.question_len * 4,
        output_len=p.output_len * 4,  # long enough that some are in flight at the kill
        seed=1,
    )
    pol = PolicyConfig(name="round_robin")
    router = Router(RouterConfig(replicas=tuple(urls), policy=pol, health_interval_s=0.25))
    await router.start()
    cfg = bench_config(router.url, request_rate=p.rate)
    kill_at = len(ds.requests) / p.rate / 3

    async def killer() -> float:
        await asyncio.sleep(kill_at)
        procs[-1].kill()
        return time.perf_counter()

    try:
        res, t_kill = await asyncio.gather(bench.arun(cfg, ds), killer())
        procs[-1] = await asyncio.to_thread(restart_replica, procs[-1])
        deadline = time.monotonic() + 120
        while not router.state.alive[-1] and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        again = datasets.synthetic(num_prompts=4 * len(urls), input_len=32, output_len=4, seed=2)
        res2 = await bench.arun(bench_config(router.url, request_rate=p.rate * 2), again)
    finally:
        stats = router.stats()
        await router.stop()
    s = res.summary
    unaccounted = len(ds.requests) - s["completed"] - s["failed"]
    # by then the router has taken the replica out (two missed checks, 0.25 s apart)
    late = [o for o in res.outcomes if o.start > t_kill + 0.6]
    late_ok = sum(o.success for o in late)
    rejoined = res2.replicas.get(urls[-1], 0) if res2.summary["failed"] == 0 else 0
    doc = bench.to_document(
        res,
        cfg,
        ds,
        command=command,
        role="candidate",
        layout={
            "world_size": len(urls),
            "strategy": "router:round_robin-failover",
            "policy": "round_robin",
            "replicas": len(urls),
            "killed_replica": len(urls) - 1,
            "model": p.model,
        },
        notes=[
            f"replica {len(urls) - 1} was killed (SIGKILL) {kill_at:.1f} s into the arrivals, "
            f"then restarted on its port; {rejoined} of {len(again.requests)} later requests "
            "went to it"
        ],
    )
    metrics = documents.failover_metrics(stats, unaccounted, len(late), late_ok, rejoined)
    doc = documents.with_metrics(doc, metrics=metrics)
    reps = stats["replicas"]
    console.print(
        f"{'failover':>18}: {s['completed']} ok, {s['failed']} failed, {unaccounted} "
        f"unaccounted of {len(ds.requests)}; after the kill {late_ok}/{len(late)} ok; "
        f"failed {[r['failed'] for r in reps]}; rejoined, it served {rejoined}"
    )
    return doc

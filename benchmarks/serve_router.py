"""Router overhead: what parlab's router adds to TTFT and E2E latency at a given rate.

Method: two trivial replicas (``--engine trivial``: canned 4-chunk streams;
or ``--endpoint stub``, the aiohttp stub) and the router
(``parlab serve router``, cache_aware policy) each run in their own process;
the load generator sends the same seeded Poisson workload at ``--rate`` once
straight to a replica and once through the router, and the table compares
p50/p99 TTFT and E2E. The router's own view (policy decision time, time from
receiving a request to sending it upstream) comes from its stats. Target:
under 2 ms added at p99 at 500 req/s. With ``--results`` the two runs are
written as ``serving-benchmark`` documents.

    python benchmarks/serve_router.py [--rate 500] [--requests 3000] [--results DIR]
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

import serve_common

from parlab.serve import bench, datasets


def _cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().split()
    return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--results", type=Path, default=None)
    ap.add_argument("--endpoint", default="trivial", help="trivial (canned answers) or stub")
    a = ap.parse_args()
    serve_common.header(
        f"router overhead at {a.rate:g} req/s (trivial replicas, separate processes)"
    )
    procs = []
    try:
        urls = []
        for _ in range(2):
            p, u = serve_common.spawn(
                [
                    *("serve", "replica", "--engine", a.endpoint, "--port", "0"),
                    *("--duration", "600", "--stub-output-len", "4"),
                ]
            )
            procs.append(p)
            urls.append(u)
        args = ["serve", "router", "--port", "0", "--duration", "600"]
        for u in urls:
            args += ["--replica", u]
        rp, rurl = serve_common.spawn(args)
        procs.append(rp)
        ds = datasets.synthetic(num_prompts=a.requests, input_len=256, output_len=4)
        rows = {}
        router_cpu: dict[str, float] = {}
        for label, url in (("direct", urls[0]), ("router", rurl)):
            cfg = bench.BenchConfig(
                base_url=url, request_rate=a.rate, progress=False, model="stub", seed=1
            )
            c0 = _cpu(rp.pid)
            r = bench.run(cfg, ds)
            rows[label] = r
            router_cpu[label] = (_cpu(rp.pid) - c0) / a.requests * 1e6
            if a.results is not None:
                from parlab.contract import write_result

                doc = bench.to_document(
                    r,
                    cfg,
                    ds,
                    command=" ".join([sys.executable, *sys.argv]),
                    role="baseline" if label == "direct" else "candidate",
                    layout={"strategy": f"router-overhead:{label}", "replicas": 2},
                    notes=["stub replicas (no model): measures the router, not a model"],
                )
                print(f"# wrote {write_result(doc, a.results)}")
        print(
            f"{'path':>8} {'ok':>6} {'failed':>6} {'req/s':>8} {'TTFT p50':>9} {'TTFT p99':>9} "
            f"{'E2E p50':>8} {'E2E p99':>8} {'lag p99':>8}  (ms)"
        )
        for label, r in rows.items():
            s = r.summary
            print(
                f"{label:>8} {s['completed']:6d} {s['failed']:6d} {s['request_throughput']:8.0f} "
                f"{s['median_ttft_ms']:9.3f} {s['p99_ttft_ms']:9.3f} {s['median_e2el_ms']:8.3f} "
                f"{s['p99_e2el_ms']:8.3f} {r.dispatch_lag_ms['p99']:8.3f}"
            )
        d, r = rows["direct"].summary, rows["router"].summary
        print(
            f"added by the router: TTFT p50 {r['median_ttft_ms'] - d['median_ttft_ms']:+.3f} ms, "
            f"p99 {r['p99_ttft_ms'] - d['p99_ttft_ms']:+.3f} ms; "
            f"E2E p99 {r['p99_e2el_ms'] - d['p99_e2el_ms']:+.3f} ms; load avg {os.getloadavg()[0]:.1f}"
        )
        print(f"router CPU per request: {router_cpu['router']:.0f} us")
    except KeyboardInterrupt:
        print("interrupted")
    finally:
        for p in procs[::-1]:
            p.send_signal(signal.SIGINT)
        for p in procs[::-1]:
            try:
                out, _ = p.communicate(timeout=10)
                if out and '"decision"' in out:
                    import json

                    st = json.loads(out[out.index("{") :])
                    print(
                        f"router's own view: decision p99 {st['decision']['p99_ms']:.3f} ms, "
                        f"receive-to-upstream p99 {st['pre_forward']['p99_ms']:.3f} ms, "
                        f"routed {[x['routed'] for x in st['replicas']]}"
                    )
            except Exception:
                p.kill()


if __name__ == "__main__":
    main()

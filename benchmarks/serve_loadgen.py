"""Load generator capacity: requests/s it sustains against a trivial local endpoint.

Method: a trivial endpoint (``parlab serve replica --engine trivial``: a raw
asyncio protocol answering every POST with the same canned stream of
``--output-len`` one-character chunks, usage and ``[DONE]``; or ``--endpoint
stub``, the aiohttp stub) runs in its own process; the load generator sends
``--requests`` at ``--rate`` (Poisson) and reports the achieved request
throughput, the failures, and how far actual send times lag the schedule
(``time.perf_counter``; p99 and max). It also reads the CPU time the
client (``time.process_time``) and the stub (``/proc/PID/stat``) spent per
request (the client's includes the spin-wait before each scheduled send,
so it is an upper bound on its cost at open-loop rates; the closed-loop row
has no waiting). Target: >= 2,000 req/s with send
times within 1 ms. A last row runs a closed loop (64 in flight).

    python benchmarks/serve_loadgen.py [--rate 2500] [--requests 8000]
"""

from __future__ import annotations

import argparse
import math
import os
import time
from pathlib import Path

import serve_common

from parlab.serve import bench, datasets


def _cpu(pid: int) -> float:
    f = Path(f"/proc/{pid}/stat").read_text().split()
    return (int(f[13]) + int(f[14])) / os.sysconf("SC_CLK_TCK")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rate", type=float, nargs="+", default=[1000.0, 2000.0, 2500.0])
    ap.add_argument("--requests", type=int, default=6000)
    ap.add_argument("--output-len", type=int, default=2)
    ap.add_argument("--endpoint", default="trivial", help="trivial (canned answers) or stub")
    ap.add_argument("--client", default="auto", help="auto/fast or aiohttp")
    a = ap.parse_args()
    serve_common.header(
        f"load generator ({a.client} client) against a local {a.endpoint} endpoint "
        "(separate process)"
    )
    proc, url = serve_common.spawn(
        [
            "serve",
            "replica",
            "--engine",
            a.endpoint,
            "--port",
            "0",
            "--duration",
            "600",
            "--stub-output-len",
            str(a.output_len),
        ]
    )
    try:
        print(
            f"{'target req/s':>12} {'requests':>8} {'achieved req/s':>14} {'failed':>6} "
            f"{'lag p99 ms':>10} {'lag max ms':>10} {'TTFT p99 ms':>11} "
            f"{'client CPU us/req':>16} {'endpoint us/req':>15} {'load avg':>8}"
        )
        for rate in [*a.rate, math.inf]:
            ds = datasets.synthetic(num_prompts=a.requests, input_len=32, output_len=a.output_len)
            cfg = bench.BenchConfig(
                base_url=url,
                request_rate=rate,
                max_concurrency=64 if math.isinf(rate) else None,
                progress=False,
                model="trivial",
                client=a.client,
            )
            c0, s0 = time.process_time(), _cpu(proc.pid)
            r = bench.run(cfg, ds)
            cu = (time.process_time() - c0) / a.requests * 1e6
            su = (_cpu(proc.pid) - s0) / a.requests * 1e6
            s = r.summary
            label = "closed/64" if math.isinf(rate) else f"{rate:.0f}"
            lag = r.dispatch_lag_ms
            print(
                f"{label:>12} {a.requests:8d} {s['request_throughput']:14.0f} {s['failed']:6d} "
                f"{lag['p99']:10.3f} {lag['max']:10.3f} {s['p99_ttft_ms']:11.3f} "
                f"{cu:16.0f} {su:15.0f} {os.getloadavg()[0]:8.1f}"
            )
    except KeyboardInterrupt:
        print("interrupted: rows above are what was measured")
    finally:
        proc.terminate()
        proc.wait(10)


if __name__ == "__main__":
    main()

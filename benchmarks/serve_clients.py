"""vLLM's and SGLang's own benchmark clients beside ``parlab bench serve``, on the same load
through parlab's router.

Method: two reference replicas (``--model``, CPU by default) behind ``parlab serve router``
(round robin), or any running router/server (``--base-url``). The tokenizer is exported as a
Hugging Face folder (``tokenizer.export_hf``) for the clients that count tokens themselves.
Then each client, as its own process, sends the same load -- ``--num-prompts`` requests of
``--input-len`` random tokens asking for ``--output-len`` (``ignore_eos``), greedy, Poisson
arrivals at ``--request-rate``, streaming completions -- and its own summary is read back:

- ``parlab``: ``parlab bench serve --dataset-name random`` (its document), with its own
  HTTP client and, as ``parlab-aiohttp``, with aiohttp's (the client vLLM's uses);
- ``vllm``: ``vllm.benchmarks.serve`` (``vllm bench serve --backend openai --dataset-name
  random``, ``--save-result``), where ``vllm`` imports (``--vllm-path`` adds a folder to its
  ``PYTHONPATH``: vLLM's wheel installed ``--no-deps`` with its pure-Python needs);
- ``sglang``: ``python -m sglang.bench_serving --backend vllm --dataset-name random-ids``
  (``--output-file``), where ``sglang`` imports (``--sglang-path``).

What differs between them besides their code: each draws its own prompts (same lengths) and
its own arrival times (vLLM and parlab scale the gaps so the last request leaves at
``n / rate``; SGLang does not); vLLM keeps one keep-alive connection pool, SGLang opens a
new HTTP session (and connection) per request, parlab keeps keep-alive connections in its
own lean client. The table gives each client's mean, median and p99 TTFT, mean and median TPOT, mean ITL, and
their difference from parlab's. One run before them is not shown (it warms the replicas
up); parlab's client runs again last, to show how far two runs of one client differ.
Evidence: ``cpu-mechanism`` on the CPU (the clients' own cost shows, the model's speed does
not), ``measured`` on a GPU.

    PYTHONPATH=src python3 benchmarks/serve_clients.py --vllm-path DIR --sglang-path DIR
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from serve_common import SRC, header, spawn

VLLM_RUNNER = """
import sys
from vllm.utils.argparse_utils import FlexibleArgumentParser
from vllm.benchmarks.serve import add_cli_args, main
p = FlexibleArgumentParser()
add_cli_args(p)
main(p.parse_args(sys.argv[1:]))
"""


def _env(extra: str | None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [SRC, *(extra.split(os.pathsep) if extra else []), env.get("PYTHONPATH", "")]
    env["PYTHONPATH"] = os.pathsep.join(p for p in paths if p)
    return env


def _run(cmd: list[str], env: dict[str, str], log: Path, timeout: float) -> bool:
    with open(log, "w") as f:
        try:
            return (
                subprocess.run(
                    cmd, env=env, stdout=f, stderr=subprocess.STDOUT, timeout=timeout
                ).returncode
                == 0
            )
        except subprocess.TimeoutExpired:
            return False


def parlab_client(
    a: argparse.Namespace, url: str, work: Path, client: str, tag: str = ""
) -> dict | None:
    res = work / f"parlab-{client}{tag}"
    cmd = [sys.executable, "-m", "parlab", "bench", "serve", "--base-url", url,
           "--dataset-name", "random", "--num-prompts", str(a.num_prompts),
           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--request-rate", str(a.request_rate), "--seed", str(a.seed), "--no-progress",
           "--percentiles", "50,99", "--results", str(res), "--client", client]  # fmt: skip
    if not _run(cmd, _env(None), work / f"parlab-{client}{tag}.log", a.timeout):
        return None
    doc = json.loads(
        next((res / "PAR-DISTRIBUTED-INFERENCE").glob("serve-bench-*.json")).read_text()
    )
    return {k: m["value"] for k, m in doc["metrics"].items()}


def vllm_client(a: argparse.Namespace, url: str, model: str, tok: Path, work: Path) -> dict | None:
    out = work / "vllm"
    cmd = [sys.executable, "-c", VLLM_RUNNER, "--backend", "openai", "--base-url", url,
           "--model", model, "--tokenizer", str(tok), "--dataset-name", "random",
           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--num-prompts", str(a.num_prompts), "--request-rate", str(a.request_rate),
           "--ignore-eos", "--temperature", "0", "--seed", str(a.seed), "--disable-tqdm",
           "--save-result", "--result-dir", str(out), "--result-filename", "r.json",
           "--percentile-metrics", "ttft,tpot,itl,e2el", "--metric-percentiles", "50,99"]  # fmt: skip
    if not _run(cmd, _env(a.vllm_path), work / "vllm.log", a.timeout):
        return None
    return json.loads((out / "r.json").read_text())


def sglang_client(
    a: argparse.Namespace, url: str, model: str, tok: Path, work: Path
) -> dict | None:
    out = work / "sglang.jsonl"
    cmd = [sys.executable, "-m", "sglang.bench_serving", "--backend", "vllm", "--base-url", url,
           "--model", model, "--tokenizer", str(tok), "--dataset-name", "random-ids",
           "--random-input-len", str(a.input_len), "--random-output-len", str(a.output_len),
           "--random-range-ratio", "1", "--num-prompts", str(a.num_prompts),
           "--request-rate", str(a.request_rate), "--seed", str(a.seed),
           "--output-file", str(out), "--disable-tqdm"]  # fmt: skip
    if not _run(cmd, _env(a.sglang_path), work / "sglang.log", a.timeout):
        return None
    return json.loads(out.read_text().strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base-url", help="A running router or server (default: start two replicas).")
    ap.add_argument("--model", default="tiny")
    ap.add_argument("--num-prompts", type=int, default=64)
    ap.add_argument("--input-len", type=int, default=128)
    ap.add_argument("--output-len", type=int, default=32)
    ap.add_argument("--request-rate", type=float, default=8.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--vllm-path", help="Folders to add to PYTHONPATH for vLLM's client.")
    ap.add_argument("--sglang-path", help="Folders to add to PYTHONPATH for SGLang's client.")
    ap.add_argument("--timeout", type=float, default=600.0)
    ap.add_argument("--work", type=Path, help="Folder for the clients' logs and results.")
    a = ap.parse_args()
    header("vLLM's and SGLang's benchmark clients beside parlab bench serve, same load")
    work = a.work or Path(tempfile.mkdtemp(prefix="parlab-clients-"))
    work.mkdir(parents=True, exist_ok=True)
    sys.path.insert(0, SRC)
    from parlab.serve.tokenizer import export_hf

    tok = export_hf(work / "tokenizer")
    procs = []
    try:
        url = a.base_url
        if url is None:
            for _ in range(2):
                procs.append(spawn(["serve", "replica", "--model", a.model, "--port", "0"]))
            args = ["serve", "router", "--port", "0", "--policy", "round_robin"]
            for _, u in procs:
                args += ["--replica", u]
            procs.append(spawn(args))
            url = procs[-1][1]
        model = f"parlab-{a.model}"
        print(f"# target {url}, model {model}; {a.num_prompts} requests of {a.input_len} + "
              f"{a.output_len} tokens at {a.request_rate:g} req/s; logs in {work}")  # fmt: skip
        # one run first, not shown: the first load on a fresh replica also pays its warm-up
        # (on the H200 parlab's first run read TTFT 96 ms mean, 23 ms median; the next, 31)
        parlab_client(a, url, work, "fast", "-warmup")
        rows = {"parlab": parlab_client(a, url, work, "fast")}
        rows["parlab-aiohttp"] = parlab_client(a, url, work, "aiohttp")
        rows["vllm"] = vllm_client(a, url, model, tok, work)
        rows["sglang"] = sglang_client(a, url, model, tok, work)
        # parlab's client once more, last: how far two runs of one client differ
        rows["parlab-again"] = parlab_client(a, url, work, "fast", "-again")
    finally:
        for p, _ in procs:
            p.terminate()
            p.wait(10)
    keys = ("completed", "mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "mean_tpot_ms",
            "median_tpot_ms", "mean_itl_ms")  # fmt: skip
    print(f"{'client':>14} {'ok':>4} {'TTFT mean':>10} {'TTFT med':>9} {'TTFT p99':>9} "
          f"{'TPOT mean':>10} {'TPOT med':>9} {'ITL mean':>9} {'dTTFT ms':>9} {'dTPOT %':>8} "
          f"{'dITL %':>7}")  # fmt: skip
    base = rows["parlab"]
    for name, r in rows.items():
        if r is None:
            print(f"{name:>14} not run (see its log in {work})")
            continue
        v = [r.get(k) for k in keys]
        d = ["-"] * 3
        if base is not None and name != "parlab":
            d = [f"{r['mean_ttft_ms'] - base['mean_ttft_ms']:+.2f}",
                 f"{(r['mean_tpot_ms'] / base['mean_tpot_ms'] - 1) * 100:+.1f}",
                 f"{(r['mean_itl_ms'] / base['mean_itl_ms'] - 1) * 100:+.1f}"]  # fmt: skip
        v = [float("nan") if x is None else x for x in v]
        print(f"{name:>14} {v[0]:4.0f} {v[1]:10.2f} {v[2]:9.2f} {v[3]:9.2f} {v[4]:10.2f} "
              f"{v[5]:9.2f} {v[6]:9.2f} {d[0]:>9} {d[1]:>8} {d[2]:>7}")  # fmt: skip


if __name__ == "__main__":
    main()

"""Serving: metrics, datasets, arrivals, load generator, router, policies, failures.

Everything targets in-process servers on 127.0.0.1 and stops by itself.
"""

from __future__ import annotations

import asyncio
import json
import math

import numpy as np
import pytest
from aiohttp import web

from parlab.errors import UsageError
from parlab.serve import bench, datasets, protocol
from parlab.serve.metrics import RequestOutcome, Slo, summarize
from parlab.serve.policy import PolicyConfig, PolicyState
from parlab.serve.prefix import BlockLRU, block_hashes
from parlab.serve.router import Router, RouterConfig
from parlab.serve.stub import StubConfig, StubServer
from parlab.serve.tokenizer import get as get_tokenizer

pytestmark = pytest.mark.timeout(60)


# ----- metrics (vLLM's definitions) -------------------------------------------------------------


def test_summary_matches_vllm_definitions() -> None:
    a = RequestOutcome(success=True, prompt_len=10, output_tokens=3, ttft=0.1, latency=0.5)
    a.itl = [0.2, 0.2]
    b = RequestOutcome(success=True, prompt_len=20, output_tokens=1, ttft=0.3, latency=0.3)
    c = RequestOutcome(success=False, prompt_len=5, error="boom")
    s = summarize([a, b, c], duration=2.0, percentiles=(50, 99.9))
    assert s["completed"] == 2 and s["failed"] == 1
    assert s["total_input_tokens"] == 30 and s["total_output_tokens"] == 4
    assert s["request_throughput"] == pytest.approx(1.0)
    assert s["output_throughput"] == pytest.approx(2.0)
    assert s["total_token_throughput"] == pytest.approx(17.0)
    # TPOT: (0.5 - 0.1) / (3 - 1) = 0.2 s, the 1-token request left out
    assert s["mean_tpot_ms"] == pytest.approx(200.0)
    assert s["mean_ttft_ms"] == pytest.approx(200.0)
    assert s["median_e2el_ms"] == pytest.approx(400.0)
    assert s["mean_itl_ms"] == pytest.approx(200.0)
    assert "p99.9_ttft_ms" in s and "p50_itl_ms" in s
    assert s["request_goodput"] is None


def test_goodput_counts_requests_meeting_every_slo() -> None:
    outs = [
        RequestOutcome(success=True, output_tokens=2, ttft=t, latency=t + 0.05)
        for t in (0.01, 0.2, 0.02)
    ]
    s = summarize(outs, 1.0, slo=Slo.parse(["ttft:100", "tpot:60"]))
    assert s["request_goodput"] == pytest.approx(2.0)
    with pytest.raises(ValueError, match="KEY:MILLISECONDS"):
        Slo.parse(["latency:5"])


def test_itl_is_pooled_over_requests() -> None:
    a = RequestOutcome(success=True, output_tokens=3, ttft=0.0, latency=0.3, itl=[0.1, 0.2])
    b = RequestOutcome(success=True, output_tokens=2, ttft=0.0, latency=0.6, itl=[0.6])
    s = summarize([a, b], 1.0)
    assert s["mean_itl_ms"] == pytest.approx(300.0)  # pooled: (100 + 200 + 600) / 3
    assert s["mean_tpot_ms"] == pytest.approx((150.0 + 600.0) / 2)  # averaged per request


# ----- datasets and arrivals ----------------------------------------------------------------------


def test_jsonl_bad_lines_reported_with_line_numbers(tmp_path) -> None:
    p = tmp_path / "trace.jsonl"
    p.write_text(
        '{"prompt": "hello", "output_len": 4}\n'
        "not json\n"
        '{"prompt": "x"}\n'
        "\n"
        '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "timestamp": 1.5}\n'
    )
    ds = datasets.jsonl(p)
    assert len(ds.requests) == 2
    assert [n for n, _ in ds.bad_lines] == [2, 3]
    assert "output_len" in ds.bad_lines[1][1]
    assert ds.requests[1].timestamp == 1.5
    empty = tmp_path / "empty.jsonl"
    empty.write_text("garbage\n")
    with pytest.raises(UsageError, match="no usable line"):
        datasets.jsonl(empty)


def test_shared_prefix_groups_share_their_prefix() -> None:
    ds = datasets.shared_prefix(
        num_groups=3, prompts_per_group=4, prefix_len=64, question_len=8, output_len=2
    )
    assert len(ds.requests) == 12
    tok = get_tokenizer()
    for g in range(3):
        ps = [tok.encode(r.prompt) for r in ds.requests if r.prefix_group == g]
        assert all(len(p) == 72 for p in ps)  # exactly the tokens asked for
        assert len({tuple(p[:64]) for p in ps}) == 1 and len({tuple(p) for p in ps}) == 4
    ds = datasets.synthetic(num_prompts=20, input_len=50, output_len=8, range_ratio=0.5)
    lens = [len(tok.encode(r.prompt)) for r in ds.requests]
    assert lens == [r.prompt_len for r in ds.requests] and min(lens) >= 25 and max(lens) <= 75
    assert len(set(lens)) > 5


def test_arrivals_follow_vllms_schedule() -> None:
    """Seeded gamma gaps, the first request's included, scaled so the last request leaves
    at n / rate exactly (vLLM's ``get_request``); burstiness inf spaces them evenly."""
    a = bench.arrival_offsets(4000, rate=100.0, burstiness=1.0, seed=1)
    b = bench.arrival_offsets(4000, rate=100.0, burstiness=1.0, seed=1)
    assert np.array_equal(a, b) and a[0] > 0.0 and a[-1] == pytest.approx(40.0, rel=1e-12)
    even = bench.arrival_offsets(4, rate=2.0, burstiness=math.inf, seed=0)
    assert even.tolist() == pytest.approx([0.5, 1.0, 1.5, 2.0])
    gaps = np.diff(a)
    assert gaps.mean() == pytest.approx(0.01, rel=0.08)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, rel=0.1)  # exponential: CV 1
    bursty = np.diff(bench.arrival_offsets(4000, rate=100.0, burstiness=0.25, seed=1))
    assert bursty.mean() == pytest.approx(0.01, rel=0.15)
    assert bursty.std() / bursty.mean() == pytest.approx(2.0, rel=0.15)  # CV 1/sqrt(shape)
    assert not bench.arrival_offsets(5, rate=math.inf, burstiness=1.0, seed=0).any()


def test_loopback_only_unless_allowed() -> None:
    with pytest.raises(UsageError, match="--allow-remote"):
        bench.BenchConfig(base_url="http://10.1.2.3:8000")
    bench.BenchConfig(base_url="http://10.1.2.3:8000", allow_remote=True)
    bench.BenchConfig(base_url="http://localhost:8000")
    with pytest.raises(UsageError):
        RouterConfig(replicas=("http://192.168.0.1:1",))


# ----- load generator against a stub -------------------------------------------------------------


def _cfg(url: str, **kw) -> bench.BenchConfig:
    return bench.BenchConfig(base_url=url, progress=False, request_timeout_s=10, **kw)


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
def test_bench_completions_chat_and_nonstream_against_stub(client: str) -> None:
    async def main() -> list[bench.BenchResult]:
        s = StubServer(StubConfig(token_s=0.001))
        await s.start()
        ds = datasets.shared_prefix(
            num_groups=2, prompts_per_group=5, prefix_len=64, question_len=16, output_len=5
        )
        try:
            out = []
            for kw in ({}, {"api": "chat"}, {"stream": False}, {"max_concurrency": 2}):
                out.append(
                    await bench.arun(_cfg(s.url, request_rate=500.0, client=client, **kw), ds)
                )
            return out
        finally:
            await s.stop()

    apis = ["completions", "chat", "completions", "completions"]
    for api, r in zip(apis, asyncio.run(main()), strict=True):
        assert r.summary["completed"] == 10, r.errors
        assert r.summary["total_output_tokens"] == 50
        # the stub counts prompt tokens with parlab's tokenizer: chat adds the template's 6
        assert r.summary["total_input_tokens"] == 800 + (60 if api == "chat" else 0)
        assert r.model == "stub"
    stream = asyncio.run(main())[0]
    o = stream.outcomes[0]
    assert o.generated_text == "xxxxx"
    assert len(o.itl) == 4 and o.latency >= o.ttft + sum(o.itl) - 1e-9
    assert 0 < stream.summary["cache_hit_rate"] < 1  # 64-char prefixes cached after first use


async def _broken_server(kind: str) -> tuple[web.AppRunner, str]:
    async def handler(request: web.Request) -> web.StreamResponse:
        if kind == "json":
            return web.json_response({"choices": [{"text": "a"}]})
        if kind == "http500":
            return web.Response(status=500, text="oops")
        resp = await protocol.sse_start(request)
        if kind == "malformed":
            await resp.write(b"data: {not json\n\n")
        elif kind == "cut":
            await resp.write(b'data: {"choices": [{"text": "a"}]}\n\n')
        elif kind == "error":
            await resp.write(b'data: {"error": {"message": "model crashed"}}\n\n')
        return resp

    app = web.Application()
    app.router.add_post("/v1/completions", handler)
    runner, port = await protocol.start_site(app, protocol.LOOPBACK, 0)
    return runner, f"http://127.0.0.1:{port}"


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("json", "non-streaming response"),
        ("http500", "HTTP 500"),
        ("malformed", "malformed chunk"),
        ("cut", "before [DONE]"),
        ("error", "model crashed"),
    ],
)
def test_bad_responses_are_counted_failures(kind: str, reason: str, client: str) -> None:
    async def main() -> bench.BenchResult:
        runner, url = await _broken_server(kind)
        try:
            ds = datasets.synthetic(num_prompts=3, input_len=4, output_len=2)
            return await bench.arun(_cfg(url, model="m", client=client), ds)
        finally:
            await runner.cleanup()

    r = asyncio.run(main())
    assert r.summary["completed"] == 0 and r.summary["failed"] == 3
    assert all(reason in e for e in r.errors), r.errors


@pytest.mark.parametrize("client", ["fast", "aiohttp"])
def test_unreachable_endpoint_fails_cleanly_and_document_says_so(client: str) -> None:
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]  # closed once we leave: nothing listens
    ds = datasets.synthetic(num_prompts=2, input_len=4, output_len=2)
    cfg = _cfg(f"http://127.0.0.1:{port}", model="m", client=client)
    r = bench.run(cfg, ds)
    assert r.summary["completed"] == 0 and "cannot connect" in next(iter(r.errors))
    doc = bench.to_document(r, cfg, ds, command="parlab bench serve")
    assert doc.status == "failed" and doc.role == "failure" and doc.failure is not None


def test_cli_bench_serve_exit_codes(tmp_path) -> None:
    from parlab.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text("nope\n")
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--dataset-name", "jsonl", "--dataset-path", str(bad)])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", "--base-url", "http://8.8.8.8:1"])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(
            [
                "bench", "serve", "--base-url", "http://127.0.0.1:9", "--num-prompts", "2",
                "--no-progress", "--results", str(tmp_path / "r"), "--request-timeout", "5",
            ]
        )  # fmt: skip
    assert e.value.code == 1
    folder = tmp_path / "r" / "PAR-DISTRIBUTED-INFERENCE"
    docs = list(folder.glob("*.json"))
    vllm = list(folder.glob("*.vllm.jsonl"))
    assert len(docs) == 1 and len(vllm) == 1
    assert json.loads(vllm[0].read_text())["completed"] == 0


# ----- policies (pure) ----------------------------------------------------------------------------


def test_policies_choose_as_documented() -> None:
    rr = PolicyState(3, PolicyConfig(name="round_robin"))
    assert [rr.choose(())[0] for _ in range(6)] == [0, 1, 2, 0, 1, 2]
    rr.set_alive(1, False)
    assert {rr.choose(())[0] for _ in range(4)} == {0, 2}

    lo = PolicyState(3, PolicyConfig(name="least_outstanding"))
    for i, n in ((0, 3), (1, 1), (2, 2)):
        for _ in range(n):
            lo.start(i)
    assert lo.choose(())[0] == 1

    p2 = PolicyState(2, PolicyConfig(name="power_of_two"))
    p2.start(0)
    assert all(p2.choose(())[0] == 1 for _ in range(5))


def test_cache_aware_follows_prefix_then_balances() -> None:
    pol = PolicyState(2, PolicyConfig(name="cache_aware", balance_abs=2))
    a = block_hashes("A" * 160 + "q1")
    b = block_hashes("B" * 160 + "q1")
    first, _ = pol.choose(a)
    pol.start(first)
    again, matched = pol.choose(block_hashes("A" * 160 + "q2"))
    assert again == first and matched == 10
    other, _ = pol.choose(b)  # no match: least loaded
    assert other != first
    for _ in range(5):
        pol.start(first)  # load gap 6 > 2: shortest queue wins over the cache
    assert pol.choose(a)[0] == other


def test_block_lru_evicts_least_recent() -> None:
    seen: list[int] = []
    c = BlockLRU(2, on_evict=seen.append)
    c.insert([1, 2])
    assert c.match([1]) == 1  # touches 1
    c.put(3)
    assert seen == [2] and c.match([1, 2]) == 1 and 3 in c


# ----- router --------------------------------------------------------------------------------------


def test_router_proxies_streams_and_estimates_cache_hits() -> None:
    async def main():
        stubs = [StubServer(StubConfig(token_s=0.0005)) for _ in range(2)]
        for s in stubs:
            await s.start()
        r = Router(
            RouterConfig(
                replicas=tuple(s.url for s in stubs),
                policy=PolicyConfig(name="cache_aware"),
            )
        )
        await r.start()
        try:
            ds = datasets.shared_prefix(
                num_groups=2, prompts_per_group=6, prefix_len=128, question_len=8, output_len=4
            )
            res = await bench.arun(_cfg(r.url, request_rate=200.0), ds)
            return res, r.stats()
        finally:
            await r.stop()
            for s in stubs:
                await s.stop()

    res, st = asyncio.run(main())
    assert res.summary["completed"] == 12, res.errors
    assert sum(res.replicas.values()) == 12
    assert sum(x["completed"] for x in st["replicas"]) == 12
    assert st["est_cache_hit_rate"] > 0.5
    assert st["decision"]["n"] == 12 and st["pre_forward"]["p99_ms"] > 0


def test_replica_killed_mid_run_in_flight_fail_once_new_go_elsewhere() -> None:
    async def main():
        slow = StubServer(StubConfig(token_s=0.05))
        fast = StubServer(StubConfig(token_s=0.001))
        await slow.start()
        await fast.start()
        r = Router(
            RouterConfig(
                replicas=(slow.url, fast.url),
                policy=PolicyConfig(name="round_robin"),
                health_interval_s=0.1,
                health_failures=1,
            )
        )
        await r.start()
        ds = datasets.synthetic(num_prompts=20, input_len=8, output_len=20)

        async def killer() -> None:
            await asyncio.sleep(0.3)
            await slow.stop(abort=True)

        try:
            res, _ = await asyncio.gather(bench.arun(_cfg(r.url, request_rate=40.0), ds), killer())
            return res, r.stats()
        finally:
            await r.stop()
            await fast.stop()

    res, st = asyncio.run(main())
    s = res.summary
    assert s["completed"] + s["failed"] == 20  # every request ends exactly once
    assert s["failed"] >= 1  # the slow replica's in-flight ones
    slow_stats, fast_stats = st["replicas"]
    assert not slow_stats["alive"] and slow_stats["taken_out"] >= 1
    assert slow_stats["failed"] == s["failed"]
    assert fast_stats["completed"] == s["completed"]
    first = min(o.start for o in res.outcomes)
    late = [o for o in res.outcomes if o.start - first > 0.4]  # 0.1 s after the kill
    assert late and all(o.success for o in late)  # new requests went elsewhere
    assert all("stream" in e or "502" in e or "error" in e for e in res.errors), res.errors


def test_client_that_leaves_does_not_take_the_replica_out() -> None:
    import aiohttp

    async def main():
        s = StubServer(StubConfig(token_s=0.02))
        await s.start()
        r = Router(RouterConfig(replicas=(s.url,), policy=PolicyConfig(name="round_robin")))
        await r.start()
        try:
            async with aiohttp.ClientSession() as sess:
                body = {"prompt": "hello", "max_tokens": 50, "stream": True}
                async with sess.post(r.url + "/v1/completions", json=body) as resp:
                    await resp.content.readline()  # first chunk, then hang up
            await asyncio.sleep(0.3)
            return r.stats()
        finally:
            await r.stop()
            await s.stop()

    st = asyncio.run(main())["replicas"][0]
    assert st["alive"] and st["failed"] == 0 and st["client_gone"] == 1


def test_fast_client_reuses_connections_and_survives_a_server_closing_them() -> None:
    from parlab.serve.httpc import Client

    async def main() -> tuple[int, int]:
        opened = 0

        async def handler(request: web.Request) -> web.Response:
            return web.json_response({"choices": [{"text": "a"}]})

        app = web.Application()
        app.router.add_post("/v1/completions", handler)
        runner = web.AppRunner(app, keepalive_timeout=0.2)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        c = Client("127.0.0.1", port)
        real = c._connect

        async def counting():
            nonlocal opened
            opened += 1
            return await real()

        c._connect = counting

        async def use(resp):
            return await resp.body()

        try:
            for _ in range(3):
                await c.post("/v1/completions", b"{}", use, 5.0)
            first = opened
            await asyncio.sleep(0.5)  # the server closes the idle connection
            assert await c.post("/v1/completions", b"{}", use, 5.0)
            return first, opened
        finally:
            await c.close()
            await runner.cleanup()

    first, total = asyncio.run(main())
    assert first == 1 and total == 2


# ----- the serving project at CPU size (what the README's `parlab project serving` runs) --------


@pytest.mark.timeout(240)
def test_serving_project_at_cpu_size_writes_documents_and_its_report(tmp_path) -> None:
    """Two replicas under both policies and a failover, then the report from those documents."""
    from parlab.cli import main

    args = ["project", "serving", "--preset", "cpu", "--policies", "round_robin,cache_aware"]
    with pytest.raises(SystemExit) as info:
        main([*args, "--no-kv-transfer", "--results", str(tmp_path)])
    assert not info.value.code
    out = tmp_path / "PAR-DISTRIBUTED-INFERENCE"
    docs = [json.loads(p.read_text()) for p in sorted(out.glob("serve-bench-*.json"))]
    assert len(docs) == 3 and all(d["metrics"] for d in docs)
    (report,) = out.glob("serving-report-*.md")
    text = report.read_text()
    assert "| round_robin |" in text and "| cache_aware |" in text
    assert "[serving-benchmark]" in text and "failover" in text

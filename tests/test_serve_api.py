"""The OpenAI-compatible API as real clients see it: bad input at the door, the official
``openai`` client against the replica and the router, a loop that survives any one request,
health that tells a dead or stalled loop, the router's ejection and its 4xx accounting."""

from __future__ import annotations

import asyncio
import json
import threading
import time

import aiohttp
import openai
import pytest
import torch

from parlab.models.reference import build_model
from parlab.serve.engine import Engine, EngineConfig
from parlab.serve.policy import PolicyConfig
from parlab.serve.replica import ReplicaServer, serving_spec
from parlab.serve.router import Router, RouterConfig
from parlab.serve.stub import StubConfig, StubServer
from parlab.serve.tokenizer import get as get_tokenizer

pytestmark = pytest.mark.timeout(90)
TOK = get_tokenizer()
NAME = "parlab-tiny"


@pytest.fixture(scope="module")
def model():
    return build_model(serving_spec("tiny"), seed=0)


def _engine(model, **kw) -> Engine:
    return Engine(model, EngineConfig(max_batch=4, max_len=128, **kw))


async def _post(url: str, body: bytes | dict, path: str = "/v1/completions") -> tuple[int, dict]:
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    async with aiohttp.ClientSession() as s, s.post(url + path, data=data) as r:
        return r.status, json.loads(await r.read())


GOOD = {"model": NAME, "prompt": "hello there", "max_tokens": 3, "temperature": 0}
BAD = [
    (b"{not json", 400, "not valid JSON", None),
    ({"model": NAME, "max_tokens": 3}, 400, "'prompt' is missing", "prompt"),
    ({**GOOD, "max_tokens": "3"}, 400, "integer", "max_tokens"),
    ({**GOOD, "max_tokens": -1}, 400, "outside", "max_tokens"),
    ({**GOOD, "max_tokens": 10_000}, 400, "context", "max_tokens"),
    ({**GOOD, "temperature": float("nan")}, 400, "outside", "temperature"),
    ({**GOOD, "temperature": float("inf")}, 400, "outside", "temperature"),
    ({**GOOD, "temperature": -0.5}, 400, "outside", "temperature"),
    ({**GOOD, "top_p": 0}, 400, "outside", "top_p"),
    ({**GOOD, "seed": 2**63}, 400, "outside", "seed"),
    ({**GOOD, "n": 0}, 400, "outside", "n"),
    ({**GOOD, "stream": "no"}, 400, "true or false", "stream"),
    ({**GOOD, "stop": ""}, 400, "stop", "stop"),
    ({**GOOD, "logprobs": 1}, 400, "not supported", "logprobs"),
    ({**GOOD, "echo": True}, 400, "not supported", "echo"),
    ({**GOOD, "frobnicate": 1}, 400, "unsupported field", "frobnicate"),
    ({**GOOD, "prompt": [1, 2, 10**6]}, 400, "outside", "prompt"),
    ({**GOOD, "model": "gpt-9"}, 404, "does not exist", "model"),
]


def test_bad_input_gets_a_4xx_naming_the_field_and_the_server_keeps_serving(model) -> None:
    chat_bad = [
        ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].role"),
        ({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}, "messages[0]"),
        (
            {"messages": [{"role": "user", "content": "x"}], "tools": [{"type": "function"}]},
            "tools",
        ),
        ({"messages": []}, "messages"),
    ]

    async def main() -> None:
        srv = ReplicaServer(_engine(model), name=NAME)
        await srv.start()
        try:
            for body, status, fragment, param in BAD:
                got, err = await _post(srv.url, body)
                assert got == status and fragment in err["error"]["message"], (body, err)
                assert err["error"]["param"] == param
            for body, param in chat_bad:
                got, err = await _post(srv.url, body, "/v1/chat/completions")
                assert got == 400 and (err["error"]["param"] or "").startswith(param), err
            got, err = await _post(srv.url, b"{" + b" " * (5 << 20) + b"}")
            assert got == 413 and "MiB limit" in err["error"]["message"]
            async with aiohttp.ClientSession() as s, s.get(srv.url + "/v2/nothing") as r:
                assert r.status == 404 and "no such path" in (await r.json())["error"]["message"]
            # a subnormal temperature is greedy (vLLM's _SAMPLING_EPS), not a crash
            status, ok = await _post(srv.url, {**GOOD, "temperature": 1e-320})
            status2, ok2 = await _post(srv.url, GOOD)
            assert (
                status == status2 == 200 and ok["choices"][0]["text"] == ok2["choices"][0]["text"]
            )
            assert srv.health()[0] == 200 and srv.step_errors == 0
        finally:
            await srv.stop()

    asyncio.run(main())


async def _with_server(model, fn, *, router: bool, engine: Engine | None = None):
    srv = ReplicaServer(engine or _engine(model), name=NAME)
    await srv.start()
    r = None
    try:
        url = srv.url
        if router:
            r = Router(RouterConfig(replicas=(srv.url,), policy=PolicyConfig()))
            await r.start()
            url = r.url
        client = openai.AsyncOpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        return await fn(client, srv)
    finally:
        if r is not None:
            await r.stop()
        await srv.stop()


@pytest.mark.parametrize("router", [False, True], ids=["replica", "router"])
def test_the_openai_client_completions_and_chat(model, router: bool) -> None:
    async def main(c: openai.AsyncOpenAI, srv: ReplicaServer) -> None:
        card = await c.models.retrieve(NAME)
        assert card.id == NAME and card.model_extra["root"] == NAME
        assert card.model_extra["max_model_len"] == 128
        assert (await c.models.list()).data[0].id == NAME
        with pytest.raises(openai.NotFoundError):
            await c.models.retrieve("nope")
        prompt = "what is the bandwidth of a ring"
        one = await c.completions.create(model=NAME, prompt=prompt, max_tokens=6, temperature=0)
        text = one.choices[0].text
        assert one.usage.prompt_tokens == len(TOK.encode(prompt))
        assert one.usage.completion_tokens == 6 and one.choices[0].finish_reason == "length"
        # streaming gives the same text, a token a chunk
        chunks = [
            ch async for ch in await c.completions.create(
                model=NAME, prompt=prompt, max_tokens=6, temperature=0, stream=True,
                stream_options={"include_usage": True},
            )
        ]  # fmt: skip
        assert "".join(ch.choices[0].text for ch in chunks if ch.choices) == text
        assert chunks[-1].usage.completion_tokens == 6
        # token ids, a list of prompts, n choices each
        ids = await c.completions.create(
            model=NAME, prompt=TOK.encode(prompt), max_tokens=6, temperature=0
        )
        assert ids.choices[0].text == text
        many = await c.completions.create(
            model=NAME, prompt=[prompt, "another"], n=2, max_tokens=3, temperature=0
        )
        assert [ch.index for ch in many.choices] == [0, 1, 2, 3]
        assert many.choices[0].text == many.choices[1].text == text[: len(many.choices[0].text)]
        # a stop string: the text ends before it, finish_reason stop
        stop = text[len(text) // 2 :][:3]
        cut = await c.completions.create(
            model=NAME, prompt=prompt, max_tokens=6, temperature=0, stop=[stop]
        )
        assert cut.choices[0].finish_reason == "stop"
        assert cut.choices[0].text == text[: text.index(stop)]
        # seeds: the same seed draws the same text
        draws = [
            (await c.completions.create(
                model=NAME, prompt=prompt, max_tokens=8, temperature=1.0, seed=s
            )).choices[0].text
            for s in (5, 5, 6)
        ]  # fmt: skip
        assert draws[0] == draws[1] and draws[0] != draws[2]
        # chat: content as text parts, the role in the first delta
        stream = await c.chat.completions.create(
            model=NAME, stream=True, max_tokens=4, temperature=0,
            messages=[{"role": "system", "content": "be brief"},
                      {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
        )  # fmt: skip
        deltas = [ch.choices[0].delta async for ch in stream]
        assert deltas[0].role == "assistant" and all(d.role is None for d in deltas[1:])
        with pytest.raises(openai.BadRequestError, match="logprobs"):
            await c.chat.completions.create(
                model=NAME, messages=[{"role": "user", "content": "x"}], logprobs=True
            )
        with pytest.raises(openai.NotFoundError):
            await c.completions.create(model="gpt-9", prompt="x", max_tokens=1)

    asyncio.run(_with_server(model, main, router=router))


def test_the_clients_stream_and_parse_helpers_see_the_end_of_sequence() -> None:
    """A model that ends every answer with ``<|end|>``: the helpers that reject
    ``finish_reason: length`` accept the replica's answers."""
    m = build_model(serving_spec("tiny"), seed=0)
    head = torch.nn.Linear(m.spec.hidden, m.spec.vocab_size)
    with torch.no_grad():
        head.weight.copy_(m.output.weight)
        head.bias.zero_()
        head.bias[TOK.end_id] = 100.0
    m.output = head

    async def main(c: openai.AsyncOpenAI, srv: ReplicaServer) -> None:
        msgs = [{"role": "user", "content": "hello"}]
        async with c.chat.completions.stream(model=NAME, messages=msgs, max_tokens=8) as s:
            async for _ in s:
                pass
            final = await s.get_final_completion()
        assert final.choices[0].finish_reason == "stop"
        parsed = await c.chat.completions.parse(model=NAME, messages=msgs, max_tokens=8)
        assert parsed.choices[0].finish_reason == "stop" and parsed.usage.completion_tokens == 1

    asyncio.run(_with_server(None, main, router=True, engine=_engine(m)))


def test_a_failing_step_fails_its_requests_and_health_reports_a_dead_loop(model) -> None:
    eng = _engine(model)

    async def main() -> None:
        srv = ReplicaServer(eng, name=NAME)
        await srv.start()
        try:
            real, calls = eng.runner.run, []

            def boom(inp):
                calls.append(1)
                if len(calls) == 1:
                    raise RuntimeError("a kernel fault")
                return real(inp)

            eng.runner.run = boom
            status, err = await _post(srv.url, GOOD)
            assert status == 500 and "a kernel fault" in err["error"]["message"]
            status, ok = await _post(srv.url, GOOD)
            assert status == 200 and ok["usage"]["completion_tokens"] == 3
            assert srv.step_errors == 1 and srv.health()[0] == 200
            srv._task.cancel()  # the loop itself gone: health must say so
            await asyncio.sleep(0.05)
            async with aiohttp.ClientSession() as s, s.get(srv.url + "/health") as r:
                assert r.status == 503 and (await r.json())["status"] == "dead"
        finally:
            await srv.stop()

    asyncio.run(main())


def test_a_stalled_replica_is_ejected_within_two_seconds(model) -> None:
    """One replica's step hangs: its health turns 503 (stalled) after 1 s, the router takes it
    out within about 2 s, its in-flight request fails once, new requests go elsewhere, and
    the 4xx a client earns is not the replica's failure."""
    hung, release = _engine(model), threading.Event()
    real = hung.runner.run

    def stuck(inp):
        release.wait(20)
        return real(inp)

    async def main() -> tuple[float, dict, list]:
        a, b = ReplicaServer(hung, name=NAME), ReplicaServer(_engine(model), name=NAME)
        await a.start()
        await b.start()
        r = Router(RouterConfig(replicas=(a.url, b.url), policy=PolicyConfig()))
        await r.start()
        try:
            for _ in range(2):  # one to each replica: round robin is back at the first
                status, _ = await _post(r.url, {**GOOD, "max_tokens": 0})
                assert status == 400
            hung.runner.run = stuck
            t0 = time.monotonic()
            first = asyncio.create_task(_post(r.url, GOOD))  # round robin: to the hung one
            while r.state.alive[0] and time.monotonic() - t0 < 10:
                await asyncio.sleep(0.02)
            ejected = time.monotonic() - t0
            later = [await _post(r.url, GOOD) for _ in range(3)]
            status, _ = await first
            return ejected, r.stats(), [status] + [s for s, _ in later]
        finally:
            release.set()
            await r.stop()
            await a.stop()
            await b.stop()

    ejected, st, statuses = asyncio.run(main())
    assert ejected < 2.5, ejected
    assert statuses[0] == 502 and statuses[1:] == [200, 200, 200]
    a, b = st["replicas"]
    assert a["failed"] == 1 and a["cut"] == 1 and a["client_errors"] == 1 and not a["alive"]
    assert b["completed"] == 3 and b["failed"] == 0 and b["client_errors"] == 1


def test_a_killed_replica_rejoins_when_it_is_healthy_again() -> None:
    async def main() -> tuple[dict, dict]:
        a, b = StubServer(StubConfig()), StubServer(StubConfig())
        await a.start()
        await b.start()
        r = Router(
            RouterConfig(replicas=(a.url, b.url), policy=PolicyConfig(), health_interval_s=0.1)
        )
        await r.start()
        try:
            port = a.port
            await a.stop(abort=True)
            while r.state.alive[0]:
                await asyncio.sleep(0.02)
            out = r.stats()
            a2 = StubServer(StubConfig())
            await a2.start(port=port)
            while not r.state.alive[0]:
                await asyncio.sleep(0.02)
            for _ in range(4):
                assert (await _post(r.url, {"prompt": "x", "max_tokens": 2}))[0] == 200
            await a2.stop()
            return out, r.stats()
        finally:
            await r.stop()
            await b.stop()

    out, st = asyncio.run(main())
    assert not out["replicas"][0]["alive"]
    assert st["replicas"][0]["alive"] and st["replicas"][0]["completed"] == 2

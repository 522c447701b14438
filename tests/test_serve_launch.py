"""``parlab serve launch``: each engine's own server command (TP and prefill/decode flags),
run against a stand-in executable that records its argv and serves the health endpoint; the
wait for readiness; registration with a running router."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from parlab.errors import UsageError
from parlab.serve.launch import LaunchSpec, engine_command, launch
from parlab.serve.policy import PolicyConfig
from parlab.serve.router import Router, RouterConfig

pytestmark = pytest.mark.timeout(90)

STANDIN = textwrap.dedent(
    """
    import json, os, sys
    if "--version" in sys.argv:
        print("9.9.9-standin"); sys.exit(0)
    with open(os.environ["STANDIN_ARGV"], "w") as f:
        json.dump(sys.argv[1:], f)
    from aiohttp import web
    port = int(sys.argv[sys.argv.index("--port") + 1])
    async def health(request):
        return web.Response(text="")
    async def chat(request):
        body = await request.json()
        return web.json_response({"object": "chat.completion", "model": body.get("model"),
            "choices": [{"index": 0, "message": {"role": "assistant", "content": "x"},
                         "finish_reason": "length"}],
            "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}})
    app = web.Application()
    app.router.add_get("/health", health)
    app.router.add_post("/v1/chat/completions", chat)
    web.run_app(app, host="127.0.0.1", port=port, print=None)
    """
)


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize(
    ("engine", "tp", "pd", "want"),
    [
        ("vllm", 2, "prefill", ["serve", "org/m", "--host", "127.0.0.1", "--port", "{port}",
                                "--tensor-parallel-size", "2", "--dtype", "bfloat16",
                                "--max-model-len", "4096", "--kv-transfer-config",
                                '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']),
        ("sglang", 4, "decode", ["--model-path", "org/m", "--host", "127.0.0.1", "--port",
                                 "{port}", "--tp-size", "4", "--dtype", "bfloat16",
                                 "--context-length", "4096", "--disaggregation-mode", "decode"]),
        ("transformers", 1, "none", ["serve", "org/m", "--host", "127.0.0.1", "--port",
                                     "{port}", "--dtype", "bfloat16"]),
    ],
)  # fmt: skip
def test_launch_runs_the_engines_own_server_and_registers_it(
    tmp_path: Path, monkeypatch, engine: str, tp: int, pd: str, want: list[str]
) -> None:
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    argv_file = tmp_path / "argv.json"
    monkeypatch.setenv("STANDIN_ARGV", str(argv_file))
    port = _port()
    spec = LaunchSpec(
        engine=engine, model="org/m", tp=tp, pd=pd, port=port, dtype="bfloat16",
        max_len=None if engine == "transformers" else 4096,
        executable=f"{sys.executable} {script}",
    )  # fmt: skip

    async def main() -> tuple[dict, dict]:
        r = Router(RouterConfig(replicas=(), policy=PolicyConfig()))
        await r.start()
        try:
            started = await asyncio.to_thread(launch, spec, router=r.url, ready_timeout_s=30)
            try:
                return started.record, r.stats()
            finally:
                started.stop()
        finally:
            await r.stop()

    record, stats = asyncio.run(main())
    assert json.loads(argv_file.read_text()) == [a.replace("{port}", str(port)) for a in want]
    assert record["engine"] == engine and record["version"] == "9.9.9-standin"
    (rep,) = stats["replicas"]
    assert rep["url"] == f"http://127.0.0.1:{port}" and rep["info"]["engine"] == engine


def test_launch_rejects_what_the_engine_cannot_do(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="prefill/decode"):
        LaunchSpec(engine="transformers", model="m", pd="prefill")
    with pytest.raises(UsageError, match="one device"):
        LaunchSpec(engine="transformers", model="m", tp=2)
    with pytest.raises(UsageError, match="--engine"):
        LaunchSpec(engine="tgi", model="m")
    old = engine_command(LaunchSpec(engine="transformers", model="m"), "  --force-model TEXT")
    i = old.index("serve")
    assert old[i : i + 3] == ["serve", "--force-model", "m"]  # the flag it once took
    cmd = engine_command(LaunchSpec(engine="parlab", model="tiny", tp=2, port=9))
    assert cmd[-9:] == ["replica", "--model", "tiny", "--host", "127.0.0.1", "--port", "9",
                        "--tp", "2"]  # fmt: skip
    bad = tmp_path / "dies.py"
    bad.write_text("import sys\nif '--version' in sys.argv: print('1')\nsys.exit(3)\n")
    spec = LaunchSpec(engine="vllm", model="m", port=_port(), executable=f"{sys.executable} {bad}")
    with pytest.raises(RuntimeError, match="exited with status 3"):
        launch(spec, ready_timeout_s=20)


def test_the_launch_command_stops_its_engine_when_it_is_terminated(tmp_path: Path) -> None:
    """``parlab serve launch`` prints its record once the engine serves; SIGTERM to it
    stops the engine's server too (none outlives it to answer the next launch's port)."""
    import os
    import signal
    import subprocess
    import time

    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    port = _port()
    env = {**os.environ, "STANDIN_ARGV": str(tmp_path / "argv.json")}
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1] / "src")
    cmd = [sys.executable, "-m", "parlab", "serve", "launch", "--engine", "sglang", "--model",
           "m", "--port", str(port), "--executable", f"{sys.executable} {script}"]  # fmt: skip
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        record = json.loads(p.stdout.readline())
        assert record["url"] == f"http://127.0.0.1:{port}" and record["engine"] == "sglang"
        p.send_signal(signal.SIGTERM)
        p.wait(30)
        time.sleep(0.2)
        with socket.socket() as s:
            assert s.connect_ex(("127.0.0.1", port)) != 0  # the engine is gone
    finally:
        if p.poll() is None:
            p.kill()


def test_the_parlab_engine_gets_its_own_dtype_flag() -> None:
    """``--dtype bfloat16`` reaches parlab's replica as ``--tensor-dtype bf16`` (it has no
    ``--dtype``: the launch failed with exit status 2 before)."""
    spec = LaunchSpec(engine="parlab", model="tiny", port=1, dtype="bfloat16", device="cuda:0")
    cmd = engine_command(spec)
    assert cmd[cmd.index("--tensor-dtype") + 1] == "bf16" and "--dtype" not in cmd
    runs = subprocess.run([*cmd[:3], "serve", "replica", "--help"], capture_output=True, text=True)
    assert "--tensor-dtype" in runs.stdout

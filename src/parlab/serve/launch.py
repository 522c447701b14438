"""``parlab serve launch``: a third-party engine's own OpenAI server as a replica.

``engine_command`` writes the command line each engine documents for its server, with its
flags for tensor parallelism and, where it has them, prefill/decode disaggregation:

| engine | server | tensor parallel | prefill/decode split |
|---|---|---|---|
| vllm | ``vllm serve MODEL`` | ``--tensor-parallel-size N`` | ``--kv-transfer-config`` (NixlConnector, ``kv_both``) |
| sglang | ``python -m sglang.launch_server --model-path MODEL`` | ``--tp-size N`` | ``--disaggregation-mode prefill\\|decode`` |
| transformers | ``transformers serve MODEL`` | (none: one device) | (none) |
| parlab | ``python -m parlab serve replica --model MODEL`` | ``--tp N`` | (none) |

``launch`` starts it (its own process group, so stopping it stops its workers), waits until
``GET /health`` answers 200 and one 1-token chat request is served (transformers loads the
model on the first request), then, with ``router``, registers the URL with parlab's router
(``POST /router/replicas``) and records the engine's name and version (its ``--version``,
or the installed package's) for the documents.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from typing import Any

import aiohttp

from parlab.dtypes import TENSOR_DTYPE_OF
from parlab.errors import UsageError

ENGINES = ("vllm", "sglang", "transformers", "parlab")
PD_ROLES = ("none", "prefill", "decode")
NVLS_OFF = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}
"""NVLink multicast off in every engine's environment (it can take a host's GPUs down)."""


@dataclass(frozen=True, kw_only=True)
class LaunchSpec:
    """One engine server to start."""

    engine: str
    """One of ``ENGINES``."""
    model: str
    """What the engine loads (a Hugging Face name or folder; for parlab a catalog name)."""
    tp: int = 1
    """Tensor-parallel degree."""
    host: str = "127.0.0.1"
    port: int = 8000
    pd: str = "none"
    """Prefill/decode role (``PD_ROLES``), where the engine has one."""
    dtype: str | None = None
    """Weights dtype (the engine's default if None)."""
    max_len: int | None = None
    """Context length (the engine's default if None)."""
    device: str | None = None
    """Device, for the engines that take one (transformers, parlab; vLLM and SGLang use
    ``CUDA_VISIBLE_DEVICES``)."""
    executable: str | None = None
    """The engine's program (default: ``vllm``, ``python -m sglang.launch_server``,
    ``transformers``, ``python -m parlab``); tests pass a stand-in."""
    extra: tuple[str, ...] = ()
    """More arguments, appended as given."""

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"--engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.tp < 1:
            raise UsageError(f"--tp {self.tp} must be >= 1")
        if self.pd not in PD_ROLES:
            raise UsageError(f"--pd {self.pd!r} is not one of {', '.join(PD_ROLES)}")
        if self.pd != "none" and self.engine not in ("vllm", "sglang"):
            raise UsageError(f"--pd: {self.engine} has no prefill/decode split; use vllm or sglang")
        if self.tp > 1 and self.engine == "transformers":
            raise UsageError("--tp: transformers serve runs on one device; use --tp 1")
        if not 0 <= self.port < 65536:
            raise UsageError(f"--port {self.port} is not a port number")


def _program(spec: LaunchSpec) -> list[str]:
    if spec.executable:
        return shlex.split(spec.executable)
    return {
        "vllm": ["vllm"],
        "sglang": [sys.executable, "-m", "sglang.launch_server"],
        "transformers": [shutil.which("transformers") or sys.executable]
        + ([] if shutil.which("transformers") else ["-m", "transformers.cli.transformers"]),
        "parlab": [sys.executable, "-m", "parlab"],
    }[spec.engine]


def engine_command(spec: LaunchSpec, help_text: str = "") -> list[str]:
    """The engine's own server command for ``spec`` (the table in the module docstring);
    ``help_text``: the server's ``--help`` where its flags changed between versions
    (``transformers serve`` took the model as ``--force-model`` before it took it as its
    argument)."""
    cmd = _program(spec)
    host, port = ["--host", spec.host], ["--port", str(spec.port)]
    if spec.engine == "transformers":
        model = ["--force-model", spec.model] if "--force-model" in help_text else [spec.model]
        cmd += ["serve", *model, *host, *port, "--dtype", spec.dtype or "auto"]
        return [*cmd, *(["--device", spec.device] if spec.device else []), *spec.extra]
    head, tp_flag, len_flag = {
        "vllm": (["serve", spec.model], "--tensor-parallel-size", "--max-model-len"),
        "sglang": (["--model-path", spec.model], "--tp-size", "--context-length"),
        "parlab": (["serve", "replica", "--model", spec.model], "--tp", "--max-len"),
    }[spec.engine]
    cmd += [*head, *host, *port, tp_flag, str(spec.tp)]
    if spec.dtype and spec.engine == "parlab":  # parlab's replica takes its own short names
        cmd += ["--tensor-dtype", TENSOR_DTYPE_OF.get(spec.dtype, spec.dtype)]
    elif spec.dtype:
        cmd += ["--dtype", spec.dtype]
    if spec.max_len:
        cmd += [len_flag, str(spec.max_len)]
    if spec.engine == "vllm" and spec.pd != "none":
        kv = {"kv_connector": "NixlConnector", "kv_role": "kv_both"}
        cmd += ["--kv-transfer-config", json.dumps(kv, separators=(",", ":"))]
    elif spec.engine == "sglang" and spec.pd != "none":
        cmd += ["--disaggregation-mode", spec.pd]
    elif spec.engine == "parlab" and spec.device:
        cmd += ["--device", spec.device]
    return [*cmd, *spec.extra]


def engine_version(spec: LaunchSpec) -> str:
    """The engine's version: its ``--version`` where a program was given, else the
    installed package's, else its ``--version``; ``unknown`` if none answers."""

    def asked() -> str | None:
        try:
            out = subprocess.run(
                [*_program(spec), "--version"], capture_output=True, text=True, timeout=30
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        lines = (out.stdout or out.stderr).strip().splitlines()
        return lines[-1].strip() if out.returncode == 0 and lines else None

    def installed() -> str | None:
        try:
            return metadata.version(spec.engine)
        except metadata.PackageNotFoundError:
            return None

    first, second = (asked, installed) if spec.executable else (installed, asked)
    return first() or second() or "unknown"


@dataclass
class Launched:
    """A started engine server."""

    spec: LaunchSpec
    proc: subprocess.Popen[bytes]
    command: list[str]
    version: str
    record: dict[str, Any] = field(default_factory=dict)

    @property
    def url(self) -> str:
        return f"http://{self.spec.host}:{self.spec.port}"

    def stop(self) -> None:
        """SIGTERM to its process group, SIGKILL 15 s later if it is still there."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)


def served_name(spec: LaunchSpec) -> str:
    """The model name the engine's server answers to."""
    return f"parlab-{spec.model}" if spec.engine == "parlab" else spec.model


async def _ready(url: str, model: str, deadline: float, proc: subprocess.Popen[bytes]) -> None:
    """Until ``/health`` is 200 and a 1-token chat request is answered."""
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with aiohttp.ClientSession() as s:
        healthy = False
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"the engine exited with status {proc.returncode} before ready")
            try:
                if not healthy:
                    async with s.get(url + "/health", timeout=aiohttp.ClientTimeout(total=5)) as r:
                        healthy = r.status == 200
                else:
                    async with s.post(
                        url + "/v1/chat/completions",
                        json=body,
                        timeout=aiohttp.ClientTimeout(total=max(1.0, deadline - time.monotonic())),
                    ) as r:
                        if r.status == 200:
                            return
                        raise RuntimeError(
                            f"warm-up request: HTTP {r.status} {(await r.text())[:200]}"
                        )
            except (aiohttp.ClientError, asyncio.TimeoutError):
                pass
            await asyncio.sleep(0.5)
    raise TimeoutError(f"{url} was not ready in time")


async def register(router: str, record: dict[str, Any]) -> None:
    """Add a replica to a running parlab router."""
    async with (
        aiohttp.ClientSession() as s,
        s.post(router.rstrip("/") + "/router/replicas", json=record) as r,
    ):
        if r.status != 200:
            raise RuntimeError(f"the router refused {record['url']}: {(await r.text())[:200]}")


def launch(
    spec: LaunchSpec, *, ready_timeout_s: float = 900.0, router: str | None = None, log: Any = None
) -> Launched:
    """Start the engine's server, wait until it is ready, register it with ``router``."""
    with socket.socket() as probe:
        if probe.connect_ex((spec.host, spec.port)) == 0:
            raise RuntimeError(f"{spec.host}:{spec.port} is in use: pick another --port")
    env = {**os.environ, **NVLS_OFF}
    help_text = ""
    if spec.engine == "transformers":
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            help_text = subprocess.run(
                [*_program(spec), "serve", "--help"],
                capture_output=True,
                text=True,
                timeout=60,
                env=env,
            ).stdout
    cmd = engine_command(spec, help_text)
    try:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log, start_new_session=True)
    except OSError as exc:
        raise RuntimeError(f"cannot start {shlex.join(cmd)}: {exc.strerror}") from None
    out = Launched(spec=spec, proc=proc, command=cmd, version=engine_version(spec))
    try:
        asyncio.run(_ready(out.url, served_name(spec), time.monotonic() + ready_timeout_s, proc))
        out.record = {
            "url": out.url,
            "engine": spec.engine,
            "version": out.version,
            "model": served_name(spec),
            "tp": spec.tp,
            "pd": spec.pd,
            "command": shlex.join(cmd),
        }
        if router is not None:
            asyncio.run(register(router, out.record))
    except BaseException:
        out.stop()
        raise
    return out

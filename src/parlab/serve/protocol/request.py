"""A generation request as the OpenAI-compatible API defines it: its limits, the fields
accepted, and ``parse_request``, which checks every one (a ``BadRequest`` names the field)."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

LOOPBACK = "127.0.0.1"
MAX_BODY_BYTES = 4 * 1024 * 1024
"""Largest request body a server reads (413 past it)."""
MAX_N = 16
"""Most choices per request."""
MAX_STOP = 8
"""Most ``stop`` strings."""
SAMPLING_EPS = 1e-5
"""A temperature below this is greedy (vLLM's ``_SAMPLING_EPS``)."""
INT64 = (-(1 << 63), (1 << 63) - 1)

NOOP_FIELDS: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False),
    "top_logprobs": (None, 0),
    "echo": (None, False),
    "best_of": (None, 1),
    "repetition_penalty": (None, 1, 1.0),
    "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "functions": (None, []),
    "function_call": (None, "none"),
    "parallel_tool_calls": (None, False, True),
    "min_tokens": (None, 0),
    "top_k": (None, -1, 0),
    "min_p": (None, 0, 0.0),
    "stop_token_ids": (None, []),
}
"""Fields accepted only at the values that ask for nothing (what clients send by default)."""
_COMMON = {"model", "max_tokens", "temperature", "top_p", "seed", "n", "stop", "stream"}
_COMMON |= {"stream_options", "ignore_eos", "user", "response_format", *NOOP_FIELDS}
_FIELDS = {
    False: _COMMON | {"prompt"},
    True: _COMMON | {"messages", "max_completion_tokens"},
}


@dataclass(frozen=True, kw_only=True)
class GenRequest:
    """A parsed generation request."""

    prompts: tuple[str | tuple[int, ...], ...]
    """Completions: each prompt (text or token ids), one choice group each; chat: empty."""
    messages: tuple[dict[str, str], ...]
    """Chat: the messages, content as one string; completions: empty."""
    max_tokens: int | None
    """Tokens to generate at most; None: up to the context (chat's default)."""
    stream: bool
    """Server-sent events or one JSON response."""
    chat: bool
    """``/v1/chat/completions`` (else ``/v1/completions``)."""
    model: str | None
    """The model name the client asked for (None: the server's own)."""
    include_usage: bool = False
    """Send a final ``usage`` chunk when streaming."""
    temperature: float = 1.0
    """0: greedy."""
    top_p: float = 1.0
    """Nucleus sampling mass."""
    seed: int | None = None
    """Sampling seed (choice ``i`` of ``n`` draws with ``seed + i``)."""
    n: int = 1
    """Choices per prompt."""
    stop: tuple[str, ...] = ()
    """Strings that end a choice (left out of its text)."""
    ignore_eos: bool = False
    """Keep generating past end-of-sequence tokens."""


class BadRequest(ValueError):
    """A request the server rejects: ``status`` and the field it names (``param``)."""

    def __init__(self, message: str, param: str | None = None, *, status: int = 400) -> None:
        super().__init__(message)
        self.param = param
        self.status = status


def _bool(body: dict, key: str, default: bool) -> bool:
    v = body.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise BadRequest(f"'{key}' must be true or false, not {json.dumps(v)}", param=key)
    return v


def _int(body: dict, key: str, lo: int, hi: int, default: int | None) -> int | None:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise BadRequest(f"'{key}' must be an integer, not {json.dumps(v)[:40]}", param=key)
    if not lo <= v <= hi:
        raise BadRequest(f"'{key}' {v} is outside {lo}..{hi}", param=key)
    return v


def _float(body: dict, key: str, lo: float, hi: float, default: float, *, open_lo: bool) -> float:
    v = body.get(key, default)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise BadRequest(f"'{key}' must be a number, not {json.dumps(v)[:40]}", param=key)
    x = float(v)
    if not math.isfinite(x) or x > hi or x < lo or (open_lo and x == lo):
        side = "(" if open_lo else "["
        raise BadRequest(f"'{key}' {v} is outside {side}{lo:g}, {hi:g}]", param=key)
    return x


def _prompts(p: Any) -> tuple[str | tuple[int, ...], ...]:
    def ids(xs: list) -> tuple[int, ...]:
        if not xs or any(isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in xs):
            raise BadRequest("'prompt' token ids must be a non-empty list of ints >= 0", "prompt")
        return tuple(xs)

    if isinstance(p, str):
        out: list[str | tuple[int, ...]] = [p]
    elif isinstance(p, list) and p and all(isinstance(x, str) for x in p):
        out = list(p)
    elif isinstance(p, list) and p and all(isinstance(x, int) for x in p):
        out = [ids(p)]
    elif isinstance(p, list) and p and all(isinstance(x, list) for x in p):
        out = [ids(x) for x in p]
    else:
        raise BadRequest(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of "
            "token-id lists",
            param="prompt",
        )
    if any(x == "" for x in out):
        raise BadRequest("'prompt' is empty: give at least one character", param="prompt")
    return tuple(out)


def _content(c: Any, where: str) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        texts = []
        for j, part in enumerate(c):
            if not isinstance(part, dict) or part.get("type") != "text":
                kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                raise BadRequest(
                    f"{where}.content[{j}] is a {kind!r} part: only text parts are supported",
                    param=f"{where}.content[{j}].type",
                )
            if not isinstance(part.get("text"), str):
                raise BadRequest(f"{where}.content[{j}].text must be a string", param=where)
            texts.append(part["text"])
        return "".join(texts)
    raise BadRequest(f"{where}.content must be a string or a list of text parts", param=where)


def _messages(msgs: Any) -> tuple[dict[str, str], ...]:
    if not isinstance(msgs, list) or not msgs:
        raise BadRequest("'messages' must be a non-empty list", param="messages")
    out = []
    for i, m in enumerate(msgs):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise BadRequest(f"{where} must be an object with 'role' and 'content'", param=where)
        role = m.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise BadRequest(
                f"{where}.role {role!r} is not supported: use system, developer, user or assistant",
                param=f"{where}.role",
            )
        for key in m:
            if key not in ("role", "content", "name"):
                raise BadRequest(f"{where}.{key} is not supported", param=f"{where}.{key}")
        out.append({"role": role, "content": _content(m.get("content"), where)})
    return tuple(out)


def _noop(body: dict) -> None:
    for key, ok in NOOP_FIELDS.items():
        if key in body and body[key] not in ok:
            raise BadRequest(
                f"'{key}' is not supported (got {json.dumps(body[key])[:40]}): leave it out",
                param=key,
            )
    rf = body.get("response_format")
    if rf is not None and rf != {"type": "text"}:
        raise BadRequest("'response_format' other than text is not supported", "response_format")


def parse_request(body: Any, *, chat: bool) -> GenRequest:
    """Validate a JSON body; ``BadRequest`` names the field that is wrong."""
    if not isinstance(body, dict):
        raise BadRequest("the body must be a JSON object")
    for key in body:
        if key not in _FIELDS[chat]:
            raise BadRequest(f"unsupported field '{key}'", param=key)
    _noop(body)
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest("'model' must be a string", param="model")
    if chat:
        messages, prompts = _messages(body.get("messages")), ()
        if "max_completion_tokens" in body:
            max_tokens = _int(body, "max_completion_tokens", 1, 1 << 30, None)
        else:
            max_tokens = _int(body, "max_tokens", 1, 1 << 30, None)
    else:
        if "prompt" not in body:
            raise BadRequest("'prompt' is missing", param="prompt")
        messages, prompts = (), _prompts(body["prompt"])
        max_tokens = _int(body, "max_tokens", 1, 1 << 30, 16)
    stop = body.get("stop")
    stops = [] if stop is None else [stop] if isinstance(stop, str) else stop
    if (
        not isinstance(stops, list)
        or len(stops) > MAX_STOP
        or not all(isinstance(s, str) and s for s in stops)
    ):
        raise BadRequest(
            f"'stop' must be a non-empty string or a list of up to {MAX_STOP} of them",
            param="stop",
        )
    opts = body.get("stream_options")
    if opts is not None and (not isinstance(opts, dict) or set(opts) - {"include_usage"}):
        raise BadRequest("'stream_options' may hold 'include_usage' only", "stream_options")
    stream = _bool(body, "stream", False)
    if opts and not stream:
        raise BadRequest("'stream_options' needs 'stream': true", param="stream_options")
    user = body.get("user")
    if user is not None and not isinstance(user, str):
        raise BadRequest("'user' must be a string", param="user")
    temperature = _float(body, "temperature", 0.0, 2.0, 1.0, open_lo=False)
    return GenRequest(
        prompts=prompts,
        messages=messages,
        max_tokens=max_tokens,
        stream=stream,
        chat=chat,
        model=model,
        include_usage=bool(opts and _bool(opts, "include_usage", False)),
        temperature=0.0 if temperature < SAMPLING_EPS else temperature,
        top_p=_float(body, "top_p", 0.0, 1.0, 1.0, open_lo=True),
        seed=_int(body, "seed", *INT64, None),
        n=_int(body, "n", 1, MAX_N, 1) or 1,
        stop=tuple(stops),
        ignore_eos=_bool(body, "ignore_eos", False),
    )

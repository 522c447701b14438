"""The OpenAI-compatible wire format parlab's servers speak (and its client expects).

Endpoints: ``POST /v1/completions`` and ``POST /v1/chat/completions`` (JSON body;
``"stream": true`` answers with server-sent events, one ``data: {json}\\n\\n`` per chunk and
a final ``data: [DONE]\\n\\n``), ``GET /v1/models``, ``GET /v1/models/{id}`` and ``GET
/health``. A streamed completion chunk carries ``choices[i].text``; a chat chunk
``choices[i].delta.content``, the first one of each choice also ``delta.role``. With
``stream_options.include_usage`` a last chunk carries ``usage`` (``prompt_tokens``,
``completion_tokens`` and, as vLLM reports it, ``prompt_tokens_details.cached_tokens``).
``finish_reason`` is ``stop`` (an end-of-sequence token or a ``stop`` string) or ``length``
(``max_tokens`` or the context). Errors are ``{"error": {message, type, code, param}}`` with
a 4xx/5xx status; an error after the stream began is sent as a ``data: {"error": ...}`` chunk
and the stream is closed without ``[DONE]``.

What a request may hold (``parse_request``; anything else is a 400 naming the field, never
ignored): ``model``; ``prompt`` (a string, a list of strings, a list of token ids or a list
of such lists: one choice each) or ``messages`` (roles ``system``, ``developer``, ``user``,
``assistant``; content a string or a list of ``{"type": "text", "text"}`` parts);
``max_tokens`` / ``max_completion_tokens``; ``temperature`` (finite, 0..2; below 1e-5 is
greedy, as vLLM's ``_SAMPLING_EPS``); ``top_p`` (finite, in (0, 1]); ``seed`` (a 64-bit
signed integer); ``n`` (1..``MAX_N``); ``stop`` (a string or a list of up to ``MAX_STOP``
non-empty strings); ``stream``, ``ignore_eos`` (JSON booleans); ``stream_options``
(``include_usage``); ``user``. The fields clients send at their no-op values are accepted at
those values only (``logprobs: null``, ``best_of: 1``, ``repetition_penalty: 1``,
``presence_penalty``/``frequency_penalty: 0``, ``echo: false``, ``tool_choice: "none"``, ...).

``request.py`` parses and checks a request; ``response.py`` builds the answers, the
errors and the event stream, and starts a server.
"""

from parlab.serve.protocol.request import (
    LOOPBACK,
    MAX_BODY_BYTES,
    BadRequest,
    GenRequest,
    parse_request,
)
from parlab.serve.protocol.response import (
    DONE,
    Site,
    api_routes,
    bad_request_response,
    chunk,
    error_chunk,
    error_response,
    full_response,
    json_errors,
    model_card,
    models_body,
    read_body,
    read_json,
    serve_until,
    sse_start,
    start_site,
    usage,
)

__all__ = [
    "DONE",
    "LOOPBACK",
    "MAX_BODY_BYTES",
    "BadRequest",
    "GenRequest",
    "Site",
    "api_routes",
    "bad_request_response",
    "chunk",
    "error_chunk",
    "error_response",
    "full_response",
    "json_errors",
    "model_card",
    "models_body",
    "parse_request",
    "read_body",
    "read_json",
    "serve_until",
    "sse_start",
    "start_site",
    "usage",
]

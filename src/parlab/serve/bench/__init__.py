"""The load generator behind ``parlab bench serve``: a dataset's requests sent to an
OpenAI-compatible endpoint on a schedule, every streamed chunk timed on arrival with
``time.perf_counter``, the metrics vLLM's ``benchmark_serving.py`` defines (``metrics.py``).

- ``config.py``: what to send and when (``BenchConfig``; ``arrival_offsets``, vLLM's gamma
  schedule, or a trace's own timestamps; loopback targets only unless ``allow_remote``);
- ``client.py``: one request over ``httpc.py`` (``http``) or aiohttp (``https``, or on
  request), both reading the stream through ``_Stream``; what counts as a success;
- ``runner.py``: the run (per-request timeouts, a time limit, the dispatch lag measured, the
  garbage collector paused);
- ``document.py``: its ``serving-benchmark`` document.

A success is stricter than vLLM's: HTTP 200 and, streaming, a text chunk and the stream's
end (``data: [DONE]``, or a whole body after a ``finish_reason`` for servers that send no
``[DONE]``); every request ends in exactly one outcome, a failure with its reason. TTFT is
taken at the first chunk with text (as SGLang does).
"""

from parlab.serve.bench.config import (
    BenchConfig,
    BenchResult,
    arrival_offsets,
)
from parlab.serve.bench.document import PROJECT, to_document
from parlab.serve.bench.runner import arun, run

__all__ = [
    "PROJECT",
    "BenchConfig",
    "BenchResult",
    "arrival_offsets",
    "arun",
    "run",
    "to_document",
]

"""The load generator behind ``parlab bench serve``.

``config.py`` holds what to send and when (``BenchConfig``, the arrival schedule),
``client.py`` one request over HTTP and the judging of its stream, ``runner.py`` the run
itself, ``document.py`` its ``serving-benchmark`` document.

It sends a dataset's requests to an OpenAI-compatible endpoint over HTTP
(keep-alive connections: parlab's lean HTTP/1.1 client ``httpc.py`` for
``http``, aiohttp for ``https`` or on request -- both read the stream through
the same ``_Stream``) and times every streamed chunk with
``time.perf_counter`` on arrival, the way vLLM's ``benchmark_serving.py`` and
SGLang's ``bench_serving.py`` do; the metrics are theirs (``metrics.py``).

Arrivals (vLLM's ``get_request``): with a finite ``request_rate`` every request's gap,
the first one's included, is drawn from a gamma distribution with shape ``burstiness``
and scale ``1 / (request_rate * burstiness)`` -- burstiness 1 is a Poisson process,
below 1 burstier, above 1 steadier, ``inf`` evenly spaced -- from a seeded numpy
generator, and the send times are scaled so the last request leaves at
``num_prompts / request_rate`` exactly (vLLM: "to close the gap for stabilizing the
throughput data from different random seeds"). An infinite rate sends everything at once;
with ``max_concurrency`` at most that many requests are in flight (a closed
loop). A trace's own ``timestamp`` field can be replayed instead. The lag
between the scheduled and the actual send time is measured per request and
reported (``dispatch_lag_p99_ms``): it is how accurate the timestamps are.
To keep it small the last 1.5 ms before each send yield to the other tasks
instead of sleeping (asyncio's timers wake up to 1 ms late), and the cyclic
garbage collector is paused for the run (its pauses stall the loop).

What counts as a success (stricter than vLLM, which accepts a stream cut
after its first chunk): HTTP 200 and, when streaming, at least one chunk with
text and the stream's end -- the final ``data: [DONE]``, or, for servers that send none
(``transformers serve``), a body that ends whole after a chunk with a ``finish_reason``;
a chunk that is not JSON, an ``error`` chunk, a stream that stops before its end, a JSON
answer to a streaming request, a timeout or a refused connection are failures, each
with its reason. Every request ends in exactly one outcome. TTFT is taken at the first
chunk whose text is non-empty (as SGLang does).

Bounds: the request count is the dataset's; every request has a timeout and
the whole run a time limit (unfinished requests are failed, reason
"cancelled at the time limit"); only loopback addresses are targeted unless
``allow_remote`` is set.
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

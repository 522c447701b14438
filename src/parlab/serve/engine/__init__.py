"""The reference replica's engine: continuous batching over a paged KV cache.

- ``config.py``     ``EngineConfig`` (the knobs) and ``Sequence`` (one request inside);
- ``blocks.py``     the pages: free list, reference counts, the prefix cache over them;
- ``scheduler.py``  which tokens a step computes: decode, then prompt chunks (chunked prefill);
- ``attention.py``  attention over the pages: Triton on CUDA, SDPA over gathered pages;
- ``kernels.py``    the Triton kernels (RoPE and cache write; paged decode attention);
- ``sampling.py``   sampling on the device (greedy, temperature, top-p; seeded per request);
- ``runner.py``     the forward over a step's flat batch; CUDA graphs per decode batch bucket;
- ``core.py``       ``Engine``: requests in, one step at a time, tokens out.
"""

from parlab.serve.engine.config import EngineConfig, Sequence
from parlab.serve.engine.core import Engine

__all__ = ["Engine", "EngineConfig", "Sequence"]

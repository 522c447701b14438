"""parlab.serve: PAR-DISTRIBUTED-INFERENCE -- requests, replicas, routing, simulation.

Everything speaks the OpenAI-compatible HTTP API (``protocol/``), so the same
load generator and router work against vLLM, SGLang and parlab's own replica.

- ``bench/``       the load generator (``parlab bench serve``): arrivals, streaming client;
- ``metrics.py``   TTFT, TPOT, ITL, E2E, throughput, goodput -- vLLM's definitions;
- ``datasets.py``  synthetic, shared-prefix and JSONL-trace requests;
- ``policy.py``    routing policies (pure; shared by the router and the simulator);
- ``router.py``    the HTTP router (``parlab serve router``): health checks, failover;
  ``router_relay.py`` the streaming of a replica's answer, ``router_stats.py`` its counters;
- ``prefix.py``    prefix blocks (chained hashes) and the LRU block cache;
- ``engine.py``    the reference replica's engine: continuous batching over a KV cache;
- ``replica.py``   its HTTP server (``parlab serve replica``); ``replica_endpoints.py`` the
                  small endpoints (health, models, tokenize, stats, profile, reset);
- ``tp.py``        the tensor-parallel replica (heads and FFN sharded over ranks);
- ``stub.py``      a model-free endpoint with a timing model (overhead and failure tests);
- ``kvxfer.py``    KV-cache transfer between two ranks over send/recv (prefill/decode split);
- ``sim/``         discrete-event simulator (colocated and disaggregated);
- ``procs.py``     replicas as child processes.
"""

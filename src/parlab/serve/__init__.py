"""parlab.serve: PAR-DISTRIBUTED-INFERENCE -- requests, replicas, routing, simulation.

Everything speaks the OpenAI-compatible HTTP API (``protocol/``), so the same load
generator and router work against vLLM, SGLang and parlab's own replica.

- ``bench/``: the load generator (``parlab bench serve``); ``metrics.py`` vLLM's TTFT, TPOT,
  ITL, E2E, throughput and goodput; ``datasets.py`` synthetic, shared-prefix and JSONL
  requests;
- ``policy.py``: routing policies (shared by the router and the simulator); ``prefix.py``
  prefix blocks and the LRU block cache;
- ``router.py``: the HTTP router (``parlab serve router``), with ``router_relay.py`` and
  ``router_stats.py``;
- ``engine/``: continuous batching over a paged KV cache; ``replica.py`` and
  ``replica_endpoints.py`` its HTTP server (``parlab serve replica``); ``tp.py`` the
  tensor-parallel replica;
- ``stub.py``: a model-free endpoint with a timing model; ``launch.py`` third-party engines
  as replicas; ``procs.py`` replicas as child processes;
- ``kvxfer.py``: KV-cache transfer over send/recv; ``sim/``: the discrete-event simulator.
"""

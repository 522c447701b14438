"""A discrete-event simulator of serving replicas behind a router.

Each replica schedules as the reference engine does (``engine/scheduler.py``): every step
advances each running request by a token and, when requests wait and slots are free, first
admits them first come, first served within the token budget (``max_step_tokens``, at least
one request); an admitted request gets its first token at the step's end. A step costs
(``ReplicaProfile``)::

    decode_base_s + decode_per_seq_s * running + decode_per_token_s * context tokens
      + sum over admitted requests of (prefill_base_s + prefill_per_token_s * uncached
                                      + prefill_per_cached_token_s * cached)

plus the serving loop's ``loop_base_s + loop_per_seq_s * requests`` given a token, and every
request pays ``path_s`` through the router. The numbers come from a measured profile of a
real replica (``profiling.profile_engine``, ``POST /engine/profile``) or from a real run's
step log (``fit_profile``, ``fit_loop``). Each replica has a prefix cache (``BlockLRU``); the
router runs the real router's policy code (``policy.py``).

Decode steps are simulated in leaps: a replica jumps to its next completion (a heap of
finishing step counts) in one event, and an arrival that can be admitted cuts the leap at
the end of the step in progress, as the engine would.

Disaggregated mode: ``prefill_replicas`` only prefill, then send the KV to the least-loaded
of ``decode_replicas`` (``kv_base_s + prompt tokens * kv_bytes_per_token / kv_bandwidth``,
from ``kvxfer.py``), which only decode; TTFT is the prefill's end.

Not modelled: ITL per token, a prompt's chunks over several steps (a prompt is admitted
whole), network time between client and router.

``profile.py``: the step costs and their fits; ``workload.py``: the requests as arrays and
the prefill/decode split; ``events.py``: the simulation.
"""

from parlab.serve.sim.events import simulate
from parlab.serve.sim.profile import (
    PROFILE_TERMS,
    ReplicaProfile,
    fit_loop,
    fit_profile,
)
from parlab.serve.sim.workload import (
    Disaggregation,
    Workload,
    from_dataset,
    shared_prefix_arrays,
)

__all__ = [
    "PROFILE_TERMS",
    "Disaggregation",
    "ReplicaProfile",
    "Workload",
    "fit_loop",
    "fit_profile",
    "from_dataset",
    "shared_prefix_arrays",
    "simulate",
]

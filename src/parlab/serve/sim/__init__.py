"""A discrete-event simulator of serving replicas behind a router.

Each simulated replica schedules as the reference engine does (``engine/scheduler.py``):
every step advances each running request by a token; when requests wait and slots are
free, the step also admits them first come, first served, up to its token budget
(``max_step_tokens``, at least one request), and each admitted request gets its first
token at the step's end. A step costs (``ReplicaProfile.step_s``)::

    decode_base_s + decode_per_seq_s * running + decode_per_token_s * context tokens
      + sum over admitted requests of (prefill_base_s + prefill_per_token_s * uncached
                                      + prefill_per_cached_token_s * cached)

plus the replica's serving loop (``loop_base_s + loop_per_seq_s * requests`` that got a
token: the hand-offs to the engine thread and the streamed tokens), and every request pays
its path through the router (``path_s``, added to TTFT and end-to-end latency). Those
numbers come from a short measured profile of a real replica (``profiling.profile_engine``,
the replica's ``POST /engine/profile``, and the serving project's probe of its serving
loop), or from the step log of a real run (``fit_profile``), so simulated times rest on
measured ones. A cached prompt token is not free: the new tokens attend to it. Each replica
has a prefix cache (``BlockLRU``); the router runs the same policy code as the real router
(``policy.py``).

Decode steps are simulated in leaps: between two events nothing changes, so a replica jumps
to its next completion (a heap of per-request finishing step counts) in one event; an
arrival that can be admitted cuts the leap at the end of the step in progress, as the
engine would. That keeps the cost per request to a few heap operations: 1,000 replicas and
1M requests take minutes on one core.

Disaggregated mode (the prefill/decode split): ``prefill_replicas`` only prefill, then send
the request's KV to the least-loaded of ``decode_replicas`` (``kv_base_s + prompt tokens *
kv_bytes_per_token / kv_bandwidth``, from the measured NCCL send/recv of ``kvxfer.py``),
which only decode; TTFT is the prefill's end, as in colocated serving.

Not modelled: ITL per token (the summary gives TTFT, TPOT, E2E), a prompt's chunks over
several steps (a prompt is admitted whole: its cost is its tokens' either way), network
time between client and router.

``profile.py`` holds the step costs and their fits, ``workload.py`` the requests as
arrays and the prefill/decode split, ``events.py`` the simulation itself.
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

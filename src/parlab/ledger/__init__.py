"""parlab.ledger: per-rank memory (``predict``) and what each layout puts on the wire (``traffic``).

Analytic only: no torch, no process group. ``predict`` returns a ``Ledger`` of
named byte items per pipeline stage with the predicted peak, for the ``Implementation`` it is
given; ``parlab.ledger.traffic.traffic`` returns the ``WireItem`` table every
communication-aware part of parlab reads; ``parlab.ledger.sharding`` holds the
sharding rules (ZeRO flat units, FSDP dim-0 shards, TP/PP/EP splits).
"""

from parlab.ledger.implementation import Implementation
from parlab.ledger.inference import kv_cache_bytes, predict_inference
from parlab.ledger.items import Ledger, LedgerItem
from parlab.ledger.policy import OPTIMIZERS, POLICIES, DtypePolicy, dtype_policy, models_compiled
from parlab.ledger.predict import predict
from parlab.ledger.stages import OFFLOADS, STRATEGIES

__all__ = [
    "OFFLOADS",
    "OPTIMIZERS",
    "POLICIES",
    "STRATEGIES",
    "DtypePolicy",
    "Implementation",
    "Ledger",
    "LedgerItem",
    "dtype_policy",
    "kv_cache_bytes",
    "models_compiled",
    "predict",
    "predict_inference",
]

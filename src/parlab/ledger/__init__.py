"""parlab.ledger: per-rank memory (``predict``) and what each layout puts on the wire (``traffic``).

Analytic only: no torch, no process group. ``predict`` returns a ``Ledger`` of
named byte items per pipeline stage with the predicted peak;
``parlab.ledger.traffic.traffic`` returns the ``WireItem`` table every
communication-aware part of parlab reads; ``parlab.ledger.sharding`` holds the
sharding rules (ZeRO flat units, FSDP dim-0 shards, TP/PP/EP splits).
"""

from parlab.ledger.predict import (
    OPTIMIZERS,
    POLICIES,
    STRATEGIES,
    DtypePolicy,
    Ledger,
    LedgerItem,
    dtype_policy,
    kv_cache_bytes,
    models_compiled,
    predict,
    predict_inference,
)

__all__ = [
    "OPTIMIZERS",
    "POLICIES",
    "STRATEGIES",
    "DtypePolicy",
    "Ledger",
    "LedgerItem",
    "dtype_policy",
    "kv_cache_bytes",
    "models_compiled",
    "predict",
    "predict_inference",
]

"""The dtype policies (element sizes of each kind of tensor under a precision recipe), the
optimizers' states, and the two questions the ledger asks of a recipe: does it run autocast,
and does the ledger model its compiled blocks."""

from __future__ import annotations

from dataclasses import dataclass

from parlab.dtypes import check_recipe
from parlab.ledger import activations as act
from parlab.models.spec import ModelSpec


@dataclass(frozen=True, kw_only=True)
class DtypePolicy:
    """Element sizes of each kind of tensor under one precision recipe."""

    name: str
    """Policy name."""
    param_bytes: int
    """Bytes per parameter element as stored (and as the optimizer updates it)."""
    grad_bytes: int
    """Bytes per gradient element (and of the gradient reduction)."""
    master_bytes: int
    """Bytes per element of a separate master copy (0: none; the params are the master)."""
    state_bytes: int
    """Bytes per optimizer-state element (AdamW's exp_avg, exp_avg_sq)."""
    compute_bytes: int
    """Bytes per element of activations and of gathered (ZeRO-3/FSDP) parameters."""
    residual_bytes: int
    """Bytes per element of the residual stream (fp32 under autocast)."""
    autocast: bool
    """Compute runs under ``torch.autocast`` over fp32 parameters."""


POLICIES: dict[str, DtypePolicy] = {
    "fp32": DtypePolicy(
        name="fp32", param_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4,
        compute_bytes=4, residual_bytes=4, autocast=False,
    ),
    # fp32 params are the master copy; bf16 compute (autocast, or FSDP2's param_dtype=bf16
    # with reduce_dtype=fp32): the common torch recipe.
    "bf16-compute": DtypePolicy(
        name="bf16-compute", param_bytes=4, grad_bytes=4, master_bytes=0, state_bytes=4,
        compute_bytes=2, residual_bytes=4, autocast=True,
    ),
    # bf16 params and grads with a separate fp32 master (Megatron / DeepSpeed): 2+2+4+8.
    "bf16-params": DtypePolicy(
        name="bf16-params", param_bytes=2, grad_bytes=2, master_bytes=4, state_bytes=4,
        compute_bytes=2, residual_bytes=2, autocast=False,
    ),
    # everything bf16, AdamW states too (torch's AdamW allocates them in the param dtype).
    "bf16-all": DtypePolicy(
        name="bf16-all", param_bytes=2, grad_bytes=2, master_bytes=0, state_bytes=2,
        compute_bytes=2, residual_bytes=2, autocast=False,
    ),
}  # fmt: skip

OPTIMIZERS: dict[str, tuple[int, bool]] = {
    "adamw": (2, True),
    "adamw-fused": (2, False),
    "adam": (2, True),
    "sgd": (0, False),
    "sgd-momentum": (1, False),
}
"""Optimizer -> (state tensors per parameter, whether a foreach step makes a state-sized temporary)."""


def runs_autocast(dtype: str | DtypePolicy, strategy: str) -> bool:
    """Whether the blocks compute under autocast over fp32 parameters: the policy's autocast,
    except where ZeRO-3/FSDP gather the parameters already in the compute dtype (FSDP2's
    param_dtype, ZeRO-3's gather dtype) and the whole forward runs in it."""
    pol = dtype_policy(dtype)
    sharded = strategy in ("zero3", "fsdp", "fsdp-hybrid")
    return pol.autocast and not (sharded and pol.param_bytes > pol.compute_bytes)


def models_compiled(
    spec: ModelSpec, *, dtype: str | DtypePolicy, strategy: str, recompute: str
) -> bool:
    """Whether the ledger's ``norm_kernel="compiled"`` describes this run's torch.compile'd
    blocks: every block ``compiled_modelled`` (dense SwiGLU, no autocast) and no op-level
    selective recompute (whose policy would choose what is kept as well)."""
    autocast = runs_autocast(dtype, strategy)
    return recompute != "op-selective" and all(
        act.compiled_modelled(spec, i, autocast=autocast) for i in range(spec.layers)
    )


def dtype_policy(name: str | DtypePolicy) -> DtypePolicy:
    """The named recipe (``parlab.dtypes.RECIPES``: ``fp32``, ``bf16-compute``, ``bf16-params``,
    ``bf16-all``); a retired name is ``UsageError`` naming the new one.

    ``LEDGER_SPELLINGS`` (the ledger's own names before ``docs/cli.md``) still resolve while
    ``parlab.plan`` passes them; every command's ``--dtype`` refuses them at parse time."""
    if isinstance(name, DtypePolicy):
        return name
    key = LEDGER_SPELLINGS.get(name, name)
    if key not in POLICIES:
        check_recipe(name)  # the one line naming the new spelling
    return POLICIES[key]


LEDGER_SPELLINGS = {"bf16-mixed": "bf16-compute", "bf16-master": "bf16-params", "bf16": "bf16-all"}

"""The memory ledger of one training step: per-rank bytes of a layout, as named items.

``predict(spec, strategy=..., topology=..., micro_batch=..., seq_len=..., impl=...)``
returns a ``Ledger``: every item in bytes on every pipeline stage (ranks of one stage hold the
same bytes; ``Ledger.per_rank`` spreads them over the world), and the predicted peak with the
phase it happens in. ``impl`` (``Implementation``) says how the model and the loop are built.
Pure arithmetic: no torch, no process group; microseconds per call.

State items (exact: what the tensors of a real implementation hold, by the rules of
``parlab.ledger.sharding``; P: parameters this rank's stage holds after TP/PP/EP):

=================  =========================================================================
item               bytes per rank
=================  =========================================================================
``params``         ddp: P x param_bytes. zero1/zero2: the padded flat units (sum of
                   ``ceil(u / N) * N``) x param_bytes. zero3: ``sum ceil(u / N)``.
                   fsdp / fsdp-hybrid: ``sum ceil(dim0 / N) * rest`` per parameter.
``grads``          as params with grad_bytes; zero1 keeps full flat grads, zero2/zero3 shards.
``optimizer``      AdamW: exp_avg + exp_avg_sq (2 x state_bytes) of what the optimizer steps
                   on (ddp: P; zero*: the shards; fsdp: the dim-0 shards). SGD: none;
                   sgd-momentum: 1. Adam's ``step`` scalars are not counted.
``master_params``  fp32 master copy where the dtype policy keeps one (``bf16-params``),
                   sharded like the optimizer states.
``master_grads``   its fp32 gradient, cast for the optimizer step (optimizer phase only).
=================  =========================================================================

N is the shard count: ``dp`` (``fsdp-hybrid``: ``shard_size``); routed experts (ep > 1) shard
over ``N / ep``. Activations follow the dtype policy: under ``bf16-compute`` DDP/ZeRO-1/2 run
autocast over fp32 parameters (fp32 residual stream, a bf16 copy per linear input); ZeRO-3 and
FSDP gather their parameters in bf16 and run the whole forward in it, as FSDP2's
``param_dtype`` does.

Transient items (forward/backward): ``activations`` (per layer from ``parlab.ledger.activations``,
times the micro-batches in flight), ``recompute_buffer`` (full recompute: one layer's
activations during its backward; ``op-selective``: the part it recomputes), ``logits`` (the
float32 logits the loss reads), ``loss_buffers`` (cross-entropy's float32 log-probabilities and
their gradient; vocab-parallel: its softmax, the one-hot target and its masked copy),
``pending_loss_buffers`` (GPipe: the other micro-batches' log-probs on the last stage),
``held_logits`` (the model's output, kept through backward by the loop), ``backward_transient``
(one block's activation gradients), ``autocast_weight_copies`` (bf16 copies of fp32 matmul
weights), ``gather_buffers`` (ZeRO-3/FSDP: unsharded units in use and prefetched),
``reduce_buffers`` (one unit's unsharded gradients before their reduce-scatter). Buffers:
``ddp_buckets`` (DDP's gradient buckets, a copy of every gradient unless ``bucket_view``),
``ddp_old_buckets`` and ``ddp_rebuild`` (torch DDP's first-iteration buckets and their rebuild).
Optimizer phase: ``optimizer_temporaries`` (foreach AdamW: one state-sized temporary; fused:
none). ``allocator_overhead``: an explicit, settable number, never a hidden factor.

Peak (per stage) = resident (params, optimizer, master, ddp_buckets, overhead, and the gradients
where they live in persistent buffers: DDP with ``bucket_view``, ZeRO-1's flat gradients) +
the largest of

- forward/backward = activations + recompute_buffer + autocast_weight_copies + gather_buffers +
  held_logits + ddp_old_buckets + the gradients already accumulated (all of them when they
  accumulate over micro-batches; GPipe: all but one micro-batch's activations' worth) +
  max(logits + loss_buffers, backward_transient + the output unit's gradients +
  reduce_buffers): the loss region is freed before the blocks' backward starts;
- optimizer step = grads + optimizer_temporaries + master_grads;
- FSDP's end of backward = grads + reduce_buffers (the root unit's reduce-scatter input);
- torch DDP's bucket rebuild = ddp_rebuild over the resident states alone.

CPU offload moves items to the host (``offload="optimizer"``: optimizer and master;
``"params"``: params, grads, optimizer and master); host items are listed with
``on_device=False`` and left out of the peak. ``tests/test_ledger.py`` and
``tests/test_ledger_revisions.py`` hold it against the tracked tensor bytes of real steps;
``docs/accuracy.md`` against the GPU runs.
"""

from __future__ import annotations

from parlab.errors import UsageError
from parlab.ledger import activations as act
from parlab.ledger.implementation import Implementation
from parlab.ledger.items import FORMULA, KIND, Ledger, LedgerItem
from parlab.ledger.policy import OPTIMIZERS, DtypePolicy, dtype_policy
from parlab.ledger.rows import Step, stage_peak, stage_row
from parlab.ledger.stages import (
    OFFLOADS,
    StageNumbers,
    check_layout,
    check_positive,
    offloaded,
    stage_numbers,
)
from parlab.models.spec import ModelSpec
from parlab.topology import Topology


def predict(
    spec: ModelSpec,
    *,
    strategy: str = "ddp",
    topology: Topology | None = None,
    micro_batch: int = 1,
    seq_len: int | None = None,
    dtype: str | DtypePolicy = "bf16-mixed",
    optimizer: str = "adamw",
    recompute: str = "none",
    pp_schedule: str = "1f1b",
    microbatches: int = 1,
    virtual_stages: int = 1,
    sp: bool = False,
    shard_size: int | None = None,
    offload: str = "none",
    reshard_after_forward: bool = True,
    overhead_bytes: int = 0,
    impl: Implementation | None = None,
) -> Ledger:
    """The per-rank memory ledger of one training step (see the module docstring).

    ``micro_batch`` sequences of ``seq_len`` tokens per rank per micro-batch; ``microbatches``
    micro-batches per step (pipeline micro-batches, or gradient accumulation without PP);
    ``impl``: how the model and the loop are built (default ``Implementation()``).
    """
    topo = topology or Topology(world_size=1)
    impl = impl or Implementation()
    seq_len = seq_len or spec.max_seq_len
    schedule = _checked_schedule(
        topo, impl, micro_batch=micro_batch, seq_len=seq_len, microbatches=microbatches,
        virtual_stages=virtual_stages, overhead_bytes=overhead_bytes, recompute=recompute,
        optimizer=optimizer, offload=offload, sp=sp, pp_schedule=pp_schedule,
    )  # fmt: skip
    pol = dtype_policy(dtype)
    n = check_layout(
        spec, topo, strategy=strategy, shard_size=shard_size, virtual_stages=virtual_stages,
        kv_replicate=impl.kv_replicate,
    )  # fmt: skip
    step = Step(
        spec=spec, topo=topo, strategy=strategy, impl=impl, pol=pol, n=n,
        micro_batch=micro_batch, seq_len=seq_len, microbatches=microbatches,
        virtual_stages=virtual_stages, pp_schedule=schedule, optimizer=optimizer,
        recompute=recompute, sp=sp, offload=offload, reshard_after_forward=reshard_after_forward,
        overhead_bytes=overhead_bytes, shard_size=shard_size,
    )  # fmt: skip
    items: dict[str, list[int]] = {}
    detail: dict[str, list[tuple[int, ...]]] = {}
    peaks: list[int] = []
    phases: list[str] = []
    for stage in range(topo.pp):
        sn = stage_numbers(
            spec, topo.tp, topo.pp, topo.ep, stage, virtual_stages, strategy, n,
            impl.vocab_parallel, step.v_shape,
        )  # fmt: skip
        row, flight, last = stage_row(step, sn, stage)
        peak, phase = stage_peak(step, sn, row, flight=flight, last=last)
        peaks.append(peak)
        phases.append(phase)
        for k, v in row.items():
            items.setdefault(k, []).append(v)
        _add_shard_detail(step, sn, detail)
    return _ledger(step, items, detail, peaks, phases)


def _checked_schedule(
    topo: Topology,
    impl: Implementation,
    *,
    micro_batch: int,
    seq_len: int,
    microbatches: int,
    virtual_stages: int,
    overhead_bytes: int,
    recompute: str,
    optimizer: str,
    offload: str,
    sp: bool,
    pp_schedule: str,
) -> str:
    """``UsageError`` naming the first input ``predict`` cannot take; the schedule's name."""
    check_positive(micro_batch=micro_batch, seq_len=seq_len, microbatches=microbatches)
    check_positive(virtual_stages=virtual_stages)
    if overhead_bytes < 0:
        raise UsageError(f"overhead_bytes = {overhead_bytes}: give 0 or more")
    if recompute not in act.RECOMPUTE:
        raise UsageError(f"recompute = {recompute!r}: use one of {', '.join(act.RECOMPUTE)}")
    if optimizer not in OPTIMIZERS:
        raise UsageError(f"optimizer = {optimizer!r}: use one of {', '.join(OPTIMIZERS)}")
    if offload not in OFFLOADS:
        raise UsageError(f"offload = {offload!r}: use one of {', '.join(OFFLOADS)}")
    if seq_len % topo.cp:
        raise UsageError(f"seq_len = {seq_len} is not divisible by cp = {topo.cp}")
    if impl.sp_gather == "per-linear" and not (sp and impl.sp_saves_gathered):
        raise UsageError(
            "sp_gather = 'per-linear' is parlab's sequence parallelism saving the gathered input: "
            "give sp=True and sp_saves_gathered=True"
        )
    if impl.norm_kernel == "compiled" and recompute == "op-selective":
        raise UsageError(
            "norm_kernel = 'compiled' with op-level selective recompute is not modelled (the "
            "checkpoint's policy and the compiled partition both choose what is kept)"
        )
    schedule = act.schedule_name(pp_schedule)
    if schedule == "zbv" and (virtual_stages != 2 or topo.pp < 2):
        raise UsageError("pp_schedule = 'zbv' needs pp > 1 and virtual_stages = 2 (the V)")
    if virtual_stages > 1 and schedule not in ("interleaved", "zbv"):
        raise UsageError("virtual_stages > 1 needs pp_schedule = 'interleaved'")
    return schedule


def _add_shard_detail(
    step: Step, sn: StageNumbers, detail: dict[str, list[tuple[int, ...]]]
) -> None:
    """FSDP's unpadded shards: the optimizer states (and master) per shard index."""
    if sn.chunks is None:
        return
    pol = step.pol
    detail.setdefault("optimizer", []).append(
        tuple(step.n_states * c * pol.state_bytes for c in sn.chunks)
    )
    if pol.master_bytes:
        for k in ("master_params", "master_grads"):
            detail.setdefault(k, []).append(tuple(c * pol.master_bytes for c in sn.chunks))


def _ledger(
    step: Step,
    items: dict[str, list[int]],
    detail: dict[str, list[tuple[int, ...]]],
    peaks: list[int],
    phases: list[str],
) -> Ledger:
    """The ``Ledger`` of the stages' rows: the items that hold anything, notes and knobs."""
    host = offloaded(step.offload)
    impl, n, ep = step.impl, step.n, step.topo.ep
    ledger_items = tuple(
        LedgerItem(
            name=k, per_stage=tuple(v), kind=KIND[k], formula=FORMULA[k], on_device=k not in host
        )
        for k, v in items.items()
        if any(v) or k in ("params", "grads", "optimizer", "activations")
    )
    notes = [
        f"shard count N = {n}" + (f" (experts over N/ep = {max(1, n // ep)})" if ep > 1 else ""),
        f"gradients alive at the start of backward: {'all (accumulating)' if step.accumulate else 'output layer only'}",
    ]
    if impl.attention_kernel != "flash":
        notes.append("math attention: s x s scores kept per layer")
    knobs = dict(
        micro_batch=step.micro_batch, seq_len=step.seq_len, microbatches=step.microbatches,
        dtype=step.pol.name, optimizer=step.optimizer, recompute=step.recompute,
        pp_schedule=step.pp_schedule, virtual_stages=step.virtual_stages, sp=step.sp,
        sp_saves_gathered=impl.sp_saves_gathered, sp_gather=impl.sp_gather,
        shard_size=step.shard_size, offload=step.offload,
        flash=impl.attention_kernel == "flash", kv_repeat=impl.kv_repeat,
        norm_kernel=impl.norm_kernel, bucket_view=impl.bucket_view,
        ddp_old_buckets=impl.ddp_old_buckets, ddp_one_rank=impl.ddp_one_rank,
        ddp_rebuild=impl.ddp_rebuild, loss_parallel=impl.loss_parallel,
        vocab_parallel=impl.vocab_parallel, logits_held=impl.logits_held,
        reshard_after_forward=step.reshard_after_forward, overhead_bytes=step.overhead_bytes,
    )  # fmt: skip
    return Ledger(
        model=step.spec.name,
        strategy=step.strategy,
        topology=step.topo,
        knobs=knobs,
        items=ledger_items,
        peak_per_stage=tuple(peaks),
        peak_phase=tuple(phases),
        notes=tuple(notes),
        shard_detail={k: tuple(v) for k, v in detail.items()},
        shard_count=n,
    )

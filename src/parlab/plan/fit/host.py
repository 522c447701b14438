"""The host's share of a step: ops dispatched per step x host seconds per dispatched op.

torch's DTensor tensor parallelism dispatches every op on a DTensor through Python (sharding
propagation, redistribution, the local op). On a fast GPU the host then issues the step's
kernels more slowly than the GPU runs them, and the step takes the host's time, not the GPU's.
The planner's model of such a run::

    host_s = ops_per_step x host_s_per_op
    ops_per_step = microbatches x (a + b x layers) + (c + d x layers)
    step_s = max(gpu_s, host_s)        (gpu_s: the roofline's step), or, serialized,
    step_s = host_s + gpu_s

Which of the two is the probe's own finding (``HostDispatch.serialized``): it times the same
step, the same ops, at two widths; if the wider step takes longer (by more than
``SERIAL_GROWTH``), the GPU's work added to the host's instead of hiding under it -- the
step's kernels do not run while the host dispatches the next ones -- and the two add. On an
H200 the probe's step grew from 203 ms at hidden 128 to 224 ms at hidden 256 with 5,256 ops
each (``results/PAR-MODEL-INTERNAL/host-dispatch-20261130T211413-10ee83.json``): serialized.

``a, b`` (each micro-batch: batch to the device, forward, loss, backward) and ``c, d`` (the
optimizer step) are op counts, and ``host_s_per_op`` a measurement, from one
``benchmarks/host_dispatch_probe.py`` document (a ``host-dispatch-calibration`` under
``PAR-MODEL-INTERNAL``): the runs' DTensor TP step at a width where the GPU idles, its step time
divided by the ops it dispatched. The counts are per model structure (norm, activation,
attention kind; ``block``), not per width, so the law carries to other layer counts of the same
structure; the seconds per op belong to the probe's host, torch and GPU.

Not modelled: why the two serialize (syncs inside DTensor's dispatch, or the step's loss read
back between backward and the optimizer); the probe's host seconds per op include its own
small GPU time, so a serialized prediction counts that much twice. Nothing here imports torch
or a process group.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from parlab.errors import UsageError
from parlab.plan.fit.probes import newest_device_calibrations

FORMAT = "parlab-host-dispatch/v1"
KIND = "host-dispatch-calibration"
SERIAL_GROWTH = 0.05
"""A probe step that grows by more than this when its width doubles is serialized."""


def block(spec: Any) -> str:
    """The structure that sets a model's op count per layer (not its widths)."""
    kv = spec.kv_heads or spec.heads
    return "/".join(
        (
            spec.norm,
            spec.activation,
            spec.position,
            "mla" if spec.mla is not None else "mha" if kv == spec.heads else "gqa",
            "moe" if spec.moe is not None else "dense",
            "bias" if spec.linear_bias or spec.qkv_bias else "nobias",
            "tied" if spec.tied_embeddings else "untied",
        )
    )


@dataclass(frozen=True, kw_only=True)
class HostDispatch:
    """One host-dispatch calibration (``benchmarks/host_dispatch_probe.py``)."""

    run_id: str
    """The probe document it comes from."""
    evidence_level: str
    """``real-training`` (GPU, NCCL) or ``cpu-mechanism`` (gloo)."""
    device: str
    """The GPU it ran on (``cpu`` on gloo)."""
    model: str
    """The model whose structure it ran (layers, heads, vocabulary kept; width cut)."""
    block: str
    """That model's ``block`` signature."""
    microbatch_fixed: float
    """Ops per micro-batch outside the layers (``a``)."""
    microbatch_per_layer: float
    """Ops per micro-batch per layer (``b``)."""
    optimizer_fixed: float
    """Ops of the optimizer step outside the layers (``c``)."""
    optimizer_per_layer: float
    """Ops of the optimizer step per layer (``d``)."""
    microbatches: int
    """Micro-batches per step in the probe (the law is measured there only)."""
    norm_kernel: str
    """The implementation whose ops it counted (``fused`` on CUDA: one kernel per RMSNorm)."""
    host_s_per_op: float
    """Host seconds per dispatched op: the probe's step time / its ops per step."""
    step_s_by_hidden: tuple[tuple[int, float], ...] = ()
    """The probe's step seconds at each width it ran (the same ops at every width)."""

    @property
    def serialized(self) -> bool:
        """The probe's step grew with its width (``SERIAL_GROWTH``): the GPU's time adds to the
        host's (``combine``)."""
        if len(self.step_s_by_hidden) < 2:
            return False
        (_, narrow), (_, wide) = min(self.step_s_by_hidden), max(self.step_s_by_hidden)
        return wide > narrow * (1 + SERIAL_GROWTH)

    def __post_init__(self) -> None:
        if self.host_s_per_op <= 0:
            raise ValueError(f"{self.run_id}: host seconds per op {self.host_s_per_op} <= 0")

    def ops_per_step(self, layers: int, microbatches: int = 1) -> float:
        """Ops dispatched per step by ``layers`` layers and ``microbatches`` micro-batches."""
        per_mb = self.microbatch_fixed + self.microbatch_per_layer * layers
        return microbatches * per_mb + self.optimizer_fixed + self.optimizer_per_layer * layers

    def host_s(self, layers: int, microbatches: int = 1) -> float:
        """Host seconds per step."""
        return self.ops_per_step(layers, microbatches) * self.host_s_per_op

    @property
    def label(self) -> str:
        return f"host-dispatch:{self.run_id} ({self.host_s_per_op * 1e6:.1f} us/op, {self.device})"


def bound(gpu_s: float, host_s: float) -> tuple[float, str]:
    """(predicted step, the term that sets it: ``host`` or ``gpu``) = max of the two."""
    return (host_s, "host") if host_s > gpu_s else (gpu_s, "gpu")


def with_host(pred: float | None, host: float | None) -> float | None:
    """The step predicted with the host's time (``bound``): the longer of the GPU's (the
    roofline's) and the host's, which issues the GPU's work; ``pred`` where either is unknown."""
    if pred is None or host is None:
        return pred
    return bound(pred, host)[0]


def combine(gpu_s: float, host_s: float, serialized: bool) -> tuple[float, str]:
    """(predicted step, how): serialized, ``host_s + gpu_s`` (``"host+gpu"``); else ``bound``."""
    return (host_s + gpu_s, "host+gpu") if serialized else bound(gpu_s, host_s)


def load_host_dispatch(doc: Any) -> HostDispatch:
    """The calibration a probe document holds; ``UsageError`` when it holds none."""
    body = (doc.workload or {}).get("calibration") or {}
    if doc.workload.get("kind") != KIND or body.get("format") != FORMAT:
        raise UsageError(f"{doc.run_id}: not a {KIND} document ({FORMAT})")
    from parlab.models import get_spec

    ops = body["ops"]
    return HostDispatch(
        run_id=doc.run_id,
        evidence_level=doc.evidence_level,
        device=str(body["device"]),
        model=str(body["model"]),
        block=block(get_spec(str(body["model"]))),
        microbatch_fixed=float(ops["microbatch"]["fixed"]),
        microbatch_per_layer=float(ops["microbatch"]["per_layer"]),
        optimizer_fixed=float(ops["optimizer"]["fixed"]),
        optimizer_per_layer=float(ops["optimizer"]["per_layer"]),
        microbatches=int(body.get("microbatches", 1)),
        norm_kernel=str(body.get("norm_kernel", "")),
        host_s_per_op=float(body["host_s_per_op"]),
        step_s_by_hidden=tuple(
            (int(h), float(t))
            for h, t in zip(body.get("hidden", []), body.get("step_s_by_hidden", []), strict=False)
        ),
    )


def newest_gpu_calibration(root: Any, project: str, prefix: str, load: Any) -> Any:
    """``load(doc)`` of the newest GPU (``real-training``) document ``prefix-*.json`` under
    ``root``/``project`` that ``load`` reads, or None (this module's host dispatch)."""
    cals = newest_device_calibrations(root, project, prefix, load)
    return cals[-1] if cals else None


def host_dispatch_calibration(root: Any) -> HostDispatch | None:
    """The newest GPU (``real-training``) host-dispatch calibration under
    ``root``/PAR-MODEL-INTERNAL, or None."""
    return newest_gpu_calibration(root, "PAR-MODEL-INTERNAL", "host-dispatch", load_host_dispatch)


STEP_FORMAT = "parlab-host-step/v1"
STEP_KIND = "host-step-calibration"


def at_width(
    model: str, hidden: int, *, name: str, layers: int | None = None, vocab: int | None = None
) -> Any:
    """``model``'s spec at width ``hidden``, the FFN in proportion (a multiple of 64, at least
    64); heads, KV heads, biases, norm and activation kept, the layers and the vocabulary too
    unless given: the host probes' models, whose width they cut until the GPU idles."""
    from parlab.models import get_spec

    s = get_spec(model)
    return dataclasses.replace(
        s,
        name=name,
        hidden=hidden,
        ffn_hidden=max(64, round(s.ffn_hidden * hidden / s.hidden / 64) * 64),
        head_dim=None,
        layers=layers or s.layers,
        vocab_size=vocab or s.vocab_size,
        published_params=None,
    )


def narrow_spec(model: str, head_dim: int) -> Any:
    """``model``'s spec at ``head_dim`` per head (hidden = heads x head_dim, ``at_width``), every
    layer and parameter tensor and the vocabulary kept: the host-step probe's narrowed model."""
    from parlab.models import get_spec

    s = get_spec(model)
    return at_width(model, s.heads * head_dim, name=f"{s.name}-hd{head_dim}")


@dataclass(frozen=True, kw_only=True)
class HostStep:
    """The host's time per step of ``parlab train`` configurations on one device
    (``benchmarks/host_step_probe.py``: the model narrowed to a few elements per head, every
    layer, parameter tensor and the vocabulary kept, so the GPU's work is a small part of it)."""

    run_ids: tuple[str, ...]
    """The probe documents it rests on."""
    device: str
    steps: dict[tuple[str, str, int, int, str], tuple[float, ...]]
    """(model, strategy, micro-batch, sequence, recompute) -> the narrowed runs' median steps,
    every width of every probe."""
    params: dict[tuple[str, str, int, int, str], tuple[int, ...]] = field(default_factory=dict)
    """The same keys -> the narrowed models' parameter counts, one per step in ``steps``."""
    full: dict[tuple[str, str, int, int, str], tuple[float, ...]] = field(default_factory=dict)
    """The same keys -> the model's own steps on one sequence of a few tokens (``--tokens``):
    the host's step with every parameter, on one rank."""

    def host_s(self, key: tuple[str, str, int, int, str]) -> float | None:
        """The mean of ``key``'s narrowed steps, or None where no probe ran it (the model by
        any of its names: ``8b`` is ``llama3.1-8b``)."""
        got = self.steps.get(_canonical(key))
        return sum(got) / len(got) if got else None

    def narrow_params(self, key: tuple[str, str, int, int, str]) -> float:
        """The mean parameter count of ``key``'s narrowed models (0 where none is known)."""
        got = self.params.get(_canonical(key))
        return sum(got) / len(got) if got else 0.0

    def own_s(self, key: tuple[str, str, int, int, str]) -> float | None:
        """The mean of the model's own few-token steps for ``key`` (``full``), or None.

        A few-token step runs one sequence of a few tokens whatever the configuration's own
        micro-batch and length, so every probed shape of the same model, strategy and recompute
        measured the same step: a shape no probe ran takes theirs (one micro-batch per step, as
        the probe runs)."""
        model, strategy, _, _, recompute = _canonical(key)
        got = self.full.get((model, strategy, key[2], key[3], recompute)) or tuple(
            t
            for (m, s, _, _, r), ts in sorted(self.full.items())
            if (m, s, r) == (model, strategy, recompute)
            for t in ts
        )
        return sum(got) / len(got) if got else None


def _canonical(key: tuple[str, str, int, int, str]) -> tuple[str, str, int, int, str]:
    """``key`` with the catalog's name of its model (``parlab.plan.fit.shapes.canonical``)."""
    from parlab.plan.fit.shapes import canonical

    return (canonical(key[0]), *key[1:])  # type: ignore[return-value]


def host_per_param_s(work: Any, strategy: str, params: float, shard: int = 1) -> float:
    """The host's seconds per step that grow with the parameters rather than with the ops:
    fused AdamW over each rank's parameters (``params / shard`` under FSDP and ZeRO, where each
    rank steps its shard; all of them under DDP), at the host seconds per parameter that
    ``work`` (``parlab.plan.fit.paramwork.ParamWork``) measured; 0 without them, and for DeepSpeed
    (its own optimizer: not modelled).

    Not here: FSDP2's reduce-scatter copy-in (``_chunk_cat``), whose CUDA kernel table is built
    on the CPU, one entry per 2 KiB of each rank's chunk. Its host time per byte depends on the
    call, not on the bytes alone: the param-work probes timed 16 tensors of 4096 x 4096 at
    5.5-7 ms per GB and 16 of 2048 x 2048 at 1.8 (``results/PAR-TRAINING-STATE/
    param-work-20261201T1125*``). On one rank the probe's few-token steps of the model itself
    include it (``host_estimate``); on more ranks it is left out."""
    if work is None or strategy.startswith("deepspeed"):
        return 0.0
    per = getattr(work, "host_s_per_param", {}) or {}
    per_rank = params / shard if strategy.startswith(("fsdp", "zero")) else params
    return per.get("adamw", 0.0) * per_rank


def host_estimate(
    steps: HostStep | None,
    work: Any,
    key: tuple[str, str, int, int, str],
    *,
    params: float,
    shard: int = 1,
) -> float | None:
    """The host's seconds per step of configuration ``key`` at the model's own width on
    ``shard`` ranks: on one rank, the model's own few-token steps where the probe made them
    (``HostStep.full``); else the host-step probe's narrowed step with its narrowed model's
    per-parameter host time (``host_per_param_s``, one rank) replaced by the model's
    (``params``, ``shard`` ranks); None where no probe ran the configuration."""
    own = steps.own_s(key) if steps is not None and shard == 1 else None
    if own is not None:
        return own
    host = steps.host_s(key) if steps is not None else None
    if steps is None or host is None:
        return None
    strategy = key[1]
    narrow = host_per_param_s(work, strategy, steps.narrow_params(key), 1)
    return host - narrow + host_per_param_s(work, strategy, params, shard)


def run_key(doc: Any) -> tuple[str, str, int, int, str]:
    """(model, strategy, micro-batch, sequence, recompute) of a training run's document, as the
    host-step probe's configurations are keyed."""
    from parlab.plan.fit.calibrate import knobs
    from parlab.plan.fit.shapes import run_batch

    model, mb, seq, *_ = run_batch(doc)
    strategy = str((doc.layout or {}).get("strategy", ""))
    return model, strategy, mb, seq, str(knobs(doc).get("recompute") or "none")


def run_host_s(doc: Any, steps: HostStep | None, work: Any) -> float | None:
    """``host_estimate`` for a training run's document: its configuration (``run_key``), its
    model's parameters and the ranks its FSDP shards over (the mesh's ``dp_shard``, else the
    world); None where no probe ran the configuration."""
    if steps is None:
        return None
    layout = doc.layout or {}
    mesh = layout.get("mesh") or {}
    ranks = int(mesh.get("dp_shard") or layout.get("world_size") or 1)
    params = float((doc.workload or {}).get("params") or 0.0)
    return host_estimate(steps, work, run_key(doc), params=params, shard=ranks)


def load_host_step(doc: Any) -> HostStep:
    """The narrowed steps one probe document holds; ``UsageError`` when it holds none. The
    model's own width (an entry naming its run, ``run_id``) is the measured configuration, not
    the host's time, and is left out."""
    body = (doc.workload or {}).get("calibration") or {}
    if doc.workload.get("kind") != STEP_KIND or body.get("format") != STEP_FORMAT:
        raise UsageError(f"{doc.run_id}: not a {STEP_KIND} document ({STEP_FORMAT})")
    steps: dict[tuple[str, str, int, int, str], tuple[float, ...]] = {}
    params: dict[tuple[str, str, int, int, str], tuple[int, ...]] = {}
    full: dict[tuple[str, str, int, int, str], tuple[float, ...]] = {}
    for r in body["runs"]:
        key = _canonical((str(r["model"]), str(r["strategy"]), int(r["micro_batch"]),
                          int(r["seq"]), str(r["recompute"])))  # fmt: skip
        narrow = [w for w in r["widths"] if "run_id" not in w and "tokens" not in w]
        own = tuple(float(w["step_s"]) for w in r["widths"] if "tokens" in w)
        if own:
            full[key] = full.get(key, ()) + own
        if narrow:
            steps[key] = steps.get(key, ()) + tuple(float(w["step_s"]) for w in narrow)
            params[key] = params.get(key, ()) + tuple(_narrow_params(key[0], w) for w in narrow)
    return HostStep(
        run_ids=(doc.run_id,), device=str(body["device"]), steps=steps, params=params, full=full
    )


def _narrow_params(model: str, width: dict[str, Any]) -> int:
    """The parameters of ``model`` narrowed to the entry's head dim; 0 where the catalog does
    not know the model (its per-parameter host time is then left as measured)."""
    try:
        return int(narrow_spec(model, int(width["head_dim"])).num_params())
    except ValueError:
        return 0


def host_step_calibration(root: Any) -> HostStep | None:
    """The GPU (``real-training``) host-step probes under ``root``/PAR-TRAINING-STATE of the
    newest one's device, merged (each configuration's steps from every probe), or None."""
    cals = newest_device_calibrations(root, "PAR-TRAINING-STATE", "host-step", load_host_step)
    if not cals:
        return None
    steps: dict[tuple[str, str, int, int, str], tuple[float, ...]] = {}
    params: dict[tuple[str, str, int, int, str], tuple[int, ...]] = {}
    full: dict[tuple[str, str, int, int, str], tuple[float, ...]] = {}
    for c in cals:
        for k, v in c.steps.items():
            steps[k] = steps.get(k, ()) + v
            params[k] = params.get(k, ()) + c.params.get(k, ())
        for k, v in c.full.items():
            full[k] = full.get(k, ()) + v
    return HostStep(
        run_ids=tuple(r for c in cals for r in c.run_ids),
        device=cals[-1].device,
        steps=steps,
        params=params,
        full=full,
    )


TRAIN_RECOMPUTE = {"none": "none", "full": "full", "op-selective": "selective"}
"""The planner's recompute names as ``parlab train`` (and so the host-step probe) names them;
the planner's ``selective`` (Megatron's attention core) has no ``parlab train`` form."""


def host_note(
    steps: HostStep | None,
    model: str,
    cand: Any,
    seq: int,
    gpu_s: float,
    *,
    work: Any = None,
    params: float = 0.0,
) -> str:
    """A plan's line on the host for candidate ``cand`` of ``model`` at ``seq`` whose GPU work
    the roofline puts at ``gpu_s``, where a host-step probe ran that configuration (the same
    strategy, micro-batch, sequence and recompute, on one rank; no tensor, pipeline or context
    parallelism); "" where none did. With ``work`` (``parlab.plan.fit.paramwork.ParamWork``) and the
    model's ``params``, the host's time is ``host_estimate``'s, on ``cand.dp`` ranks."""
    rc = TRAIN_RECOMPUTE.get(cand.recompute)
    split = (getattr(cand, "tp", 1), getattr(cand, "pp", 1), getattr(cand, "cp", 1))
    if steps is None or rc is None or split != (1, 1, 1):
        return ""
    key = (model, cand.strategy, cand.micro_batch, seq, rc)
    narrowed = steps.host_s(key)
    dp = int(getattr(cand, "dp", 1))
    host = host_estimate(steps, work, key, params=params, shard=dp)
    if host is None:
        return ""
    verdict = (
        f"host-bound there: the step is the host's, predicted {host:.3f} s, which differs from "
        "one machine to the next and can reach the host's and the GPU's time added; a larger "
        "micro-batch amortizes it (the host's time per step does not grow with it)"
        if bound(gpu_s, host)[1] == "host"
        else f"GPU-bound there (the host alone {host / gpu_s:.2f} of the GPU's time)"
    )
    took = []
    if narrowed is not None:
        took.append(
            f"{narrowed:.3f} s a step on one rank with the model narrowed until the GPU idles"
        )
    if dp == 1 and steps.own_s(key) is not None:  # the model's own width: every parameter
        took.append(f"{host:.3f} s at the model's own width on one sequence of a few tokens")
    elif work is not None and narrowed is not None and abs(host - narrowed) > 5e-4:
        took.append(
            f"{host:.3f} s with the host's per-parameter work of the model's {params / 1e9:.2f} B "
            f"parameters on {dp} rank{'s' if dp > 1 else ''} (param-work probe: {work.label})"
        )
    return (
        f"host: parlab train of {cand.strategy} at {cand.micro_batch} x {seq}, recompute {rc}, "
        f"took {'; '.join(took)} (host-step probe: {' + '.join(steps.run_ids)}, {steps.device}), "
        f"against the roofline's {gpu_s:.3f} s of GPU work: {verdict}"
    )

"""The host's per-parameter work (``parlab.plan.fit.host.host_per_param_s``, ``host_estimate``):
what FSDP2 runs that costs the host in proportion to the gradients, on 2 gloo ranks, and how the
host-step probe's narrowed step is carried to the model's own parameters and ranks."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import torch

from parlab.plan.fit.host import HostStep, host_estimate, host_note, host_per_param_s, narrow_spec
from parlab.runtime.testing import run_ranks

WORK = SimpleNamespace(host_s_per_param={"adamw": 1e-12, "chunk_cat": 2e-12}, label="pw-1")
"""A param-work probe: fused AdamW's host seconds per parameter (the copy-in's unused)."""
KEY = ("llama3.1-8b", "fsdp", 1, 1024, "full")


class _Stack(torch.nn.Module):
    """Two blocks (``layers``, as parlab's strategies wrap them), no root parameters."""

    def __init__(self) -> None:
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(8, 8) for _ in range(2))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            x = layer(x)
        return x


def _copy_ins(ctx: Any, strategy: str) -> list[int]:
    """Each ``fsdp.chunk_cat`` of one backward: its output's elements (FSDP2's reduce-scatter
    copy-in) -- or none under DDP."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from parlab.parallel import fsdp
    from parlab.topology import Topology

    torch.manual_seed(0)
    model = _Stack()

    def make(params: list[torch.nn.Parameter]) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=0.1)

    if strategy == "fsdp":
        mesh = Topology(world_size=ctx.world_size, dp=ctx.world_size).build_mesh("cpu")
        strat: Any = fsdp.TorchFSDP(model, mesh, make)
    else:
        strat = fsdp.TorchDDP(model, torch.distributed.group.WORLD, make)

    sizes: list[int] = []

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            if "chunk_cat" in str(func):
                sizes.append(int(kwargs["out"].numel()) if "out" in kwargs else -1)
            return out

    x = torch.randn(4, 8)
    loss = strat(x).sum()
    with Seen():
        loss.backward()
    return sizes


@pytest.mark.parametrize("strategy", ["fsdp", "ddp"])
def test_fsdp_copies_each_units_gradients_in_once_per_backward(strategy: str) -> None:
    """Under FSDP2 every unit's backward copies its float32 gradients into the reduce-scatter
    buffer with ``fsdp.chunk_cat`` (``torch._chunk_cat``), each rank's chunk 1/world of them:
    host work that grows with the gradients (on CUDA the copy's block table is built on the
    CPU), which the narrowed host-step probe leaves out and its few-token steps of the model
    itself include (``parlab.plan.fit.host.host_estimate``); DDP runs none of it."""
    sizes = run_ranks(_copy_ins, 2, strategy)
    if strategy == "ddp":
        assert sizes == [[], []]
        return
    per_unit = 8 * 8 + 8  # one Linear(8, 8): weight and bias
    # one copy-in per unit on each rank (the root holds no parameters of its own), its buffer
    # every rank's chunk: world x (elements / world)
    assert sizes == [[per_unit, per_unit], [per_unit, per_unit]]


def test_per_parameter_host_time_follows_what_each_rank_steps() -> None:
    """Fused AdamW over each rank's parameters (all of them under DDP, 1/shard under FSDP and
    ZeRO); FSDP's copy-in is not priced per parameter; DeepSpeed and no probe: nothing."""
    p = 8e9
    assert host_per_param_s(WORK, "fsdp", p, 1) == pytest.approx(p * 1e-12)
    assert host_per_param_s(WORK, "fsdp", p, 2) == pytest.approx(p / 2 * 1e-12)
    assert host_per_param_s(WORK, "ddp", p, 2) == pytest.approx(p * 1e-12)
    assert host_per_param_s(WORK, "zero2", p, 2) == pytest.approx(p / 2 * 1e-12)
    assert host_per_param_s(WORK, "deepspeed-zero3", p, 2) == 0.0
    assert host_per_param_s(None, "fsdp", p, 1) == 0.0
    assert host_per_param_s(SimpleNamespace(host_s_per_param={}), "fsdp", p, 1) == 0.0


def test_host_estimate_replaces_the_narrowed_models_parameters_with_the_models() -> None:
    """The probe's narrowed step less its narrowed model's per-parameter host time (one rank),
    plus the model's own on the run's ranks; None where no probe ran the configuration."""
    steps = HostStep(run_ids=("host-step-1",), device="NVIDIA H200",
                     steps={KEY: (0.2, 0.3)}, params={KEY: (1e8, 3e8)})  # fmt: skip
    assert steps.narrow_params(KEY) == 2e8
    one = host_estimate(steps, WORK, KEY, params=8e9, shard=1)
    assert one == pytest.approx(0.25 - 2e8 * 1e-12 + 8e9 * 1e-12)
    two = host_estimate(steps, WORK, KEY, params=8e9, shard=2)
    assert two == pytest.approx(0.25 - 2e8 * 1e-12 + 4e9 * 1e-12)
    assert host_estimate(steps, None, KEY, params=8e9) == pytest.approx(0.25)
    assert host_estimate(steps, WORK, (*KEY[:4], "none"), params=8e9) is None
    assert host_estimate(None, WORK, KEY, params=8e9) is None


def test_narrowed_parameter_counts_are_the_probes_models() -> None:
    """``narrow_spec`` (the probe's narrowed model) keeps the vocabulary: an 8B narrowed to 16
    per head still holds two 128,256-row embeddings of width 512. A probe of a model the catalog
    does not know still loads, its narrowed parameters counted as none."""
    from parlab.plan.fit.host import _narrow_params

    n = narrow_spec("llama3.1-8b", 16)
    assert n.hidden == 512 and n.num_params() > 2 * 128_256 * 512
    assert n.num_params() < 0.05 * narrow_spec("llama3.1-8b", 128).num_params()
    assert _narrow_params("8b", {"head_dim": 16}) == n.num_params()
    assert _narrow_params("no-such-model", {"head_dim": 16}) == 0


def test_plan_note_adds_the_models_per_parameter_host_work() -> None:
    """``parlab plan --roofline``'s host line gives the narrowed step and, with a param-work
    probe, the model's own; none for a candidate with tensor or pipeline parallelism (the probe
    ran one rank of plain data parallelism)."""
    steps = HostStep(run_ids=("host-step-1",), device="NVIDIA H200",
                     steps={KEY: (0.25,)}, params={KEY: (2e8,)})  # fmt: skip
    cand = SimpleNamespace(strategy="fsdp", micro_batch=1, recompute="full", dp=1, tp=1, pp=1, cp=1)
    note = host_note(steps, KEY[0], cand, 1024, 0.25, work=WORK, params=8e9)
    total = 0.25 - 2e8 * 1e-12 + 8e9 * 1e-12
    assert "took 0.250 s a step" in note and f"{total:.3f} s" in note and "pw-1" in note
    assert "host-bound there" in note  # 0.258 s of host over 0.25 s of GPU work
    assert "host-bound" not in host_note(steps, KEY[0], cand, 1024, 0.255)  # without the probe
    tp = SimpleNamespace(**{**vars(cand), "tp": 2})
    assert host_note(steps, KEY[0], tp, 1024, 0.26, work=WORK, params=8e9) == ""


def test_the_models_own_few_token_steps_are_the_host_on_one_rank() -> None:
    """Where the probe ran the model at its own width on a few tokens (``--tokens``), those
    steps are the host's on one rank (every parameter's host work in them); on more ranks the
    narrowed step carried by the per-parameter work, as without them."""
    steps = HostStep(run_ids=("host-step-1",), device="NVIDIA H200", steps={KEY: (0.25,)},
                     params={KEY: (2e8,)}, full={KEY: (0.30, 0.34)})  # fmt: skip
    assert host_estimate(steps, WORK, KEY, params=8e9, shard=1) == pytest.approx(0.32)
    # the model by any of its names: a run of ``8b`` is the probe's llama3.1-8b
    assert host_estimate(steps, WORK, ("8b", *KEY[1:]), params=8e9) == pytest.approx(0.32)
    assert host_estimate(steps, WORK, KEY, params=8e9, shard=2) == pytest.approx(
        0.25 - 2e8 * 1e-12 + 4e9 * 1e-12
    )
    cand = SimpleNamespace(strategy="fsdp", micro_batch=1, recompute="full", dp=1, tp=1, pp=1, cp=1)
    note = host_note(steps, KEY[0], cand, 1024, 0.22, params=8e9)
    assert "0.320 s at the model's own width on one sequence of a few tokens" in note
    assert "host-bound" in note


def test_a_few_token_step_stands_for_every_shape_of_its_configuration() -> None:
    """A few-token step is one sequence of a few tokens whatever shape the probe's entry names:
    an unprobed micro-batch or length of the same model, strategy and recompute takes the
    probed shapes' steps (its own where a probe ran it); another strategy or recompute none."""
    other = (KEY[0], KEY[1], 4, 2048, KEY[4])
    steps = HostStep(run_ids=("host-step-1",), device="NVIDIA H200", steps={},
                     full={KEY: (0.30, 0.34), other: (0.40,)})  # fmt: skip
    assert steps.own_s(KEY) == pytest.approx(0.32)  # its own entry first
    assert steps.own_s(other) == pytest.approx(0.40)
    unprobed = (KEY[0], KEY[1], 2, 8192, KEY[4])
    assert steps.own_s(unprobed) == pytest.approx((0.30 + 0.34 + 0.40) / 3)
    assert steps.own_s(("8b", *unprobed[1:])) == pytest.approx((0.30 + 0.34 + 0.40) / 3)
    assert steps.own_s((KEY[0], "ddp", 2, 8192, KEY[4])) is None
    assert steps.own_s((*unprobed[:4], "none" if KEY[4] != "none" else "full")) is None

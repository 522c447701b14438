"""Training-state mechanisms against single-process training, and against the ledger.

Every strategy (parlab's DDP/ZeRO forms and torch's DDP/FSDP2) trains the
tiny reference model on 2 (some on 4, and 1) gloo ranks through the same rank
function ``parlab train`` uses; the rank-averaged losses and the final
parameters must equal one process training on the whole batch (SGD: AdamW
magnifies float noise on zero-gradient parameters). With AdamW, the per-rank
state bytes of each item and the comm meter's bytes per step must equal the
ledger's prediction exactly, on every rank.
"""

from __future__ import annotations

import functools
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch._dynamo
import torch.nn.functional as F

from parlab.data import SyntheticTokens
from parlab.ledger.sharding import gradient_buckets
from parlab.models import get_spec
from parlab.models.reference import build_model
from parlab.projects.training_state import TrainConfig, ledger_predictions, train_rank
from parlab.projects.training_state.documents import layout
from parlab.runtime.testing import run_ranks

pytestmark = pytest.mark.timeout(120)

STEPS, WARMUP, SEQ, MICRO, LR = 2, 1, 16, 2, 0.5


def cfg_for(strategy: str, nproc: int, **kw: object) -> TrainConfig:
    base = {
        "model": "tiny",
        "nproc": nproc,
        "steps": STEPS,
        "warmup": WARMUP,
        "seq": SEQ,
        "micro_batch": MICRO,
        "optimizer": "sgd",
        "lr": LR,
    }
    base.update(kw)
    return TrainConfig(strategy=strategy, **base)  # type: ignore[arg-type]


@functools.cache
def reference(global_batch: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the whole batch, plain SGD: the losses and the final parameters."""
    spec = get_spec("tiny")
    model = build_model(spec, seed=0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    data = SyntheticTokens(vocab_size=spec.vocab_size, seq=SEQ, seed=0)
    losses = []
    for step in range(WARMUP + STEPS + 1):  # + the metered step
        b = data.global_batch(step, global_batch)
        loss = F.cross_entropy(model(b.inputs).flatten(0, 1).float(), b.labels.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad()
        losses.append(loss.item())
    return losses, {n: p.detach().clone() for n, p in model.named_parameters()}


def check_equal(
    results: list[dict],
    nproc: int,
    ref: tuple[list[float], dict[str, torch.Tensor]] | None = None,
    *,
    rtol: float = 1e-4,
    atol: float = 1e-6,
) -> None:
    """Every rank's losses and final (fp32) parameters equal the reference's (default: plain
    SGD in one process on the whole batch)."""
    ref_losses, ref_params = ref or reference(MICRO * nproc)
    for r in results:
        assert r["losses"] == pytest.approx(ref_losses, rel=1e-5, abs=1e-6)
        assert set(r["params"]) == set(ref_params)
        for name, p in r["params"].items():
            torch.testing.assert_close(
                torch.from_numpy(p), ref_params[name], rtol=rtol, atol=atol, msg=name
            )


TWO_RANK = [
    "ddp",
    "ddp-naive",
    "ddp-bucket",
    "zero1",
    "zero1-naive",
    "zero2",
    "zero2-naive",
    "zero3",
    "zero3-naive",
    "fsdp",
    "fsdp-hybrid",
]


@pytest.mark.parametrize("strategy", TWO_RANK)
def test_two_ranks_equal_single_process(strategy: str) -> None:
    cfg = cfg_for(strategy, 2)
    check_equal(run_ranks(train_rank, 2, return_params=True, **cfg.to_json()), 2)


@pytest.mark.parametrize("strategy", ["zero3", "fsdp-hybrid"])
def test_four_ranks_equal_single_process(strategy: str) -> None:
    cfg = cfg_for(strategy, 4)
    check_equal(run_ranks(train_rank, 4, return_params=True, **cfg.to_json()), 4)


@pytest.mark.parametrize("strategy", ["ddp-bucket", "zero3"])
def test_world_size_one_is_plain_training(strategy: str) -> None:
    cfg = cfg_for(strategy, 1)
    results = run_ranks(train_rank, 1, return_params=True, **cfg.to_json())
    check_equal(results, 1)
    assert results[0]["comm_bytes_per_step"] >= 0


def test_bucketed_ddp_overlaps_in_fewer_messages_than_naive() -> None:
    naive, bucket = (
        run_ranks(train_rank, 2, **cfg_for(s, 2, bucket_mb=0.25).to_json())[0]
        for s in ("ddp-naive", "ddp-bucket")
    )
    assert naive["comm_bytes_per_step"] == bucket["comm_bytes_per_step"]
    params = list(build_model(get_spec("tiny"), device="meta").parameters())
    assert naive["comm_by_op"]["all_reduce"]["count"] == len(params)
    # one all-reduce per bucket of the plan (fp32 gradients in backward order, 0.25 MiB)
    plan = gradient_buckets([p.numel() * 4 for p in reversed(params)], int(0.25 * 2**20))
    assert bucket["comm_by_op"]["all_reduce"]["count"] == len(plan)
    assert (
        1 < bucket["comm_by_op"]["all_reduce"]["count"] < naive["comm_by_op"]["all_reduce"]["count"]
    )


@pytest.mark.parametrize(
    ("strategy", "nproc"),
    [("ddp", 2), ("zero1", 2), ("zero2", 2), ("zero3", 2), ("fsdp", 2), ("fsdp-hybrid", 4)],
)
def test_state_and_comm_bytes_equal_the_ledger(strategy: str, nproc: int) -> None:
    cfg = cfg_for(strategy, nproc, optimizer="adamw", lr=1e-3)
    results = run_ranks(train_rank, nproc, **cfg.to_json())
    preds, _ = ledger_predictions(cfg, "gloo")
    for r in results:
        for item in ("params", "grads", "optimizer"):
            assert r["state_bytes"][item] == preds[f"state_bytes.{item}"].value, (
                f"rank {r['rank']} {item}"
            )
        assert r["state_bytes"]["optimizer"] > 0
        assert r["comm_bytes_per_step"] == preds["comm_bytes_per_step"].value
        for op, v in r["comm_by_op"].items():
            assert v["bytes"] == preds[f"comm_bytes_per_step.{op}"].value, f"{op} rank {r['rank']}"
        assert r["peak_memory"] > sum(r["state_bytes"].values())
        assert r["comm_time"] > 0


def test_recompute_keeps_results() -> None:
    """Full recompute under parlab's ZeRO-3 (gathers must survive the recomputation) and
    selective recompute under FSDP2 give the same training."""
    full = run_ranks(
        train_rank, 2, return_params=True, **cfg_for("zero3", 2, recompute="full").to_json()
    )
    check_equal(full, 2)
    sel = run_ranks(
        train_rank, 2, return_params=True, **cfg_for("fsdp", 2, recompute="selective").to_json()
    )
    check_equal(sel, 2)


def test_manual_gc_keeps_results_and_is_recorded() -> None:
    """Garbage collection by hand (every 2 steps) trains exactly as the automatic one, and the
    document records the knob (it is part of what a repeat of the run must match)."""
    cfg = cfg_for("fsdp", 2, manual_gc=2)
    check_equal(run_ranks(train_rank, 2, return_params=True, **cfg.to_json()), 2)
    assert layout(cfg, "gloo")["knobs"]["manual_gc"] == 2
    assert layout(cfg_for("fsdp", 2), "gloo")["knobs"]["manual_gc"] == 50  # the default
    assert "manual_gc" not in layout(cfg_for("fsdp", 2, manual_gc=0), "gloo")["knobs"]


def _parlab(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "parlab", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_oom_gives_failure_document_and_clean_exit(tmp_path: Path) -> None:
    from parlab.contract import read_results

    proc = _parlab(
        "train", "--strategy", "zero2", "--model", "tiny", "--nproc", "1", "--steps", "1",
        "--warmup", "1", "--seq", "16", "--memory-cap", "600KiB", "--results", str(tmp_path),
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr.split("[parlab rank")[0]
    entries, skipped = read_results(tmp_path)
    assert not skipped and len(entries) == 1
    doc = entries[0].doc
    assert doc.role == "failure" and doc.status == "failed"
    assert doc.failure is not None and doc.failure.kind == "oom"
    peak = doc.predictions["peak_memory"].value
    assert peak is not None and peak > 600 * 1024  # the ledger said it would not fit
    assert "ledger predicted" in proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["--strategy", "ddp", "--nproc", "2", "--global-batch", "3"],
        ["--strategy", "zero4", "--nproc", "2"],
        ["--strategy", "ddp", "--model", "no-such-model"],
        ["--strategy", "fsdp-hybrid", "--nproc", "4", "--hybrid-shard", "3"],
        ["--strategy", "ddp", "--recompute", "sometimes"],
        ["--strategy", "fsdp", "--numa-binding", "near"],
        ["--strategy", "fsdp", "--manual-gc", "-1"],
    ],
)
def test_bad_input_one_line_exit_2_nothing_written(
    args: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from parlab.cli import main

    with pytest.raises(SystemExit) as exc:
        main(["train", *args, "--results", str(tmp_path / "r")])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("parlab: error:") and "\n" not in err
    assert not (tmp_path / "r").exists()


def test_ledger_state_predictions_are_exact_integers() -> None:
    preds, _ = ledger_predictions(cfg_for("zero3", 2, optimizer="adamw"), "gloo")
    p = preds["state_bytes.params"].value
    assert p is not None and p == int(p) and not math.isnan(p)


def _zero_overlap_rank(ctx: object, stage: int) -> dict[str, int]:
    """What a non-naive ZeRO-1/2 has in flight at each point of one step."""
    import torch.distributed as dist

    from parlab.parallel.zero import ZeroDataParallel

    spec = get_spec("tiny")
    model = build_model(spec, seed=0)
    z = ZeroDataParallel(
        model, dist.group.WORLD, lambda ps: torch.optim.SGD(ps, lr=0.1), stage=stage
    )
    tokens = torch.randint(0, spec.vocab_size, (2, 9), generator=torch.Generator().manual_seed(1))
    out: dict[str, int] = {"units": len(z.units)}
    for step in range(2):
        logits = z(tokens[:, :-1])
        F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten()).backward()
        out[f"reduced_in_backward_{step}"] = len(z._reduced)
        z.finish_backward()
        z.step()
        out[f"gathers_after_step_{step}"] = len(z._param_work)
        z.zero_grad()
    z(tokens[:, :-1])
    out["gathers_after_forward"] = len(z._param_work)
    return out


@pytest.mark.parametrize("stage", [1, 2])
def test_zero12_overlap_reduce_scatter_with_backward_and_gather_with_forward(stage: int) -> None:
    """Every unit's reduce-scatter is issued inside backward (as its gradients are ready), every
    unit's all-gather is left in flight by step() and waited by that unit's next forward."""
    for r in run_ranks(_zero_overlap_rank, 2, stage, timeout=60):
        n = r["units"]
        assert r["reduced_in_backward_0"] == r["reduced_in_backward_1"] == n
        assert r["gathers_after_step_0"] == r["gathers_after_step_1"] == n
        assert r["gathers_after_forward"] == 0


@functools.cache
def reference_bf16_master(nproc: int) -> tuple[list[float], dict[str, torch.Tensor]]:
    """One process, the bf16-master recipe with plain SGD, data parallelism unsharded: each of
    ``nproc`` slices of the global batch gives its bf16 gradients; their average is taken in
    bf16 (each divided by ``nproc``, then summed, as the ranks' reduce-scatter does); the fp32
    master copy steps on it cast to fp32 and is cast back into the bf16 parameters."""
    from parlab.data import rank_batch

    spec = get_spec("tiny")
    model = build_model(spec, seed=0)
    master = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.to(torch.bfloat16)
    params = dict(model.named_parameters())
    data = SyntheticTokens(vocab_size=spec.vocab_size, seq=SEQ, seed=0)
    losses = []
    for step in range(WARMUP + STEPS + 1):  # + the metered step
        batch = data.global_batch(step, MICRO * nproc)
        total: dict[str, torch.Tensor] = {}
        step_loss = 0.0
        for r in range(nproc):
            b = rank_batch(batch, r, nproc)
            loss = F.cross_entropy(model(b.inputs).flatten(0, 1).float(), b.labels.flatten())
            grads = torch.autograd.grad(loss, list(params.values()))
            for n, g in zip(params, grads, strict=True):
                g = g / nproc
                total[n] = g if n not in total else total[n] + g
            step_loss += loss.item() / nproc
        with torch.no_grad():
            for n, p in params.items():
                master[n] -= LR * total[n].float()
                p.copy_(master[n])
        losses.append(step_loss)
    return losses, master


@pytest.mark.parametrize("strategy", ["zero1", "zero2"])
def test_bf16_master_zero_equals_single_process_recipe(strategy: str) -> None:
    """ZeRO-1/2 with bf16 parameters and fp32 master shards on 2 ranks: the fp32 masters and
    the losses equal one process running the same recipe over the same batch slices; then,
    with AdamW, every rank holds exactly the ledger's bf16-master state items and moves the
    ledger's bytes (bf16 on the wire)."""
    cfg = cfg_for(strategy, 2, dtype="bf16-params")
    results = run_ranks(train_rank, 2, return_params=True, **cfg.to_json())
    check_equal(results, 2, reference_bf16_master(2), rtol=1e-5, atol=1e-7)
    cfg = cfg_for(strategy, 2, dtype="bf16-params", optimizer="adamw", lr=1e-3)
    results = run_ranks(train_rank, 2, **cfg.to_json())
    preds, _ = ledger_predictions(cfg, "gloo")
    for r in results:
        for item in ("params", "grads", "optimizer", "master_params", "master_grads"):
            assert r["state_bytes"][item] == preds[f"state_bytes.{item}"].value, item
        assert r["state_bytes"]["master_params"] > 0 and r["state_bytes"]["master_grads"] > 0
        assert r["comm_bytes_per_step"] == preds["comm_bytes_per_step"].value


def test_bf16_master_is_refused_outside_zero12() -> None:
    with pytest.raises(ValueError, match="runs under zero1, zero2"):
        cfg_for("fsdp", 2, dtype="bf16-params")


def test_phase_times_cover_each_timed_step() -> None:
    """Every rank records, for each timed step, the host's seconds to issue each phase in step
    order; together they are the step's host time between the step timer's marks (CPU ranks:
    the step timer is the same host clock), less only the loop's bookkeeping around them."""
    cfg = cfg_for("fsdp", 2)
    for r in run_ranks(train_rank, 2, **cfg.to_json()):
        host = r["phase_times"]["host"]
        assert list(host) == ["data", "forward", "backward", "optimizer", "zero_grad"]
        assert "device" not in r["phase_times"]  # CPU ranks: no CUDA events
        assert all(len(ts) == STEPS and min(ts) > 0 for ts in host.values())
        for i, step in enumerate(r["step_times"]):
            issued = sum(ts[i] for ts in host.values())
            assert 0.5 * step < issued <= step

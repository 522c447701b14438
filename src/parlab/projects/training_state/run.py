"""Launch training-state runs and compare them: one run, the comparison set, its report.

``run_training(cfg)`` launches ``rank.train_rank`` on ``cfg.nproc`` ranks through torchrun
(NCCL on GPUs, gloo on CPU) and turns what comes back into one contract document.
``run_project`` runs the comparison set (DDP, ZeRO-1/2/3, FSDP and FSDP's knobs), writes every
document and renders the report from them.
"""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path
from typing import Any

import torch

from parlab.contract import Document, read_results, write_result
from parlab.errors import UsageError
from parlab.hardware.env import snapshot
from parlab.projects.training_state.config import PROJECT, STRATEGIES, TrainConfig
from parlab.projects.training_state.documents import document, predict_step
from parlab.projects.training_state.report import TITLE, blocks, figure_paths, run_label
from parlab.report.blocks import Report
from parlab.report.markdown import write_markdown
from parlab.runtime.launch import LaunchConfig, launch

# (strategy, knob overrides): torch's paths beside parlab's, and FSDP's reshard/recompute knobs.
_VARIANTS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("fsdp", {"reshard_after_forward": False}),
    ("fsdp", {"recompute": "selective"}),
    ("fsdp", {"recompute": "full"}),
)
CPU_SET = (("ddp", {}), ("ddp-bucket", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}),
           ("fsdp", {}), *_VARIANTS)  # fmt: skip
GPU_SET = (("ddp", {}), ("zero1", {}), ("zero2", {}), ("zero3", {}), ("fsdp", {}), *_VARIANTS)


def backend_for(nproc: int) -> str:
    return "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= nproc else "gloo"


def run_training(cfg: TrainConfig, *, command: str, predict_from: Path | None = None) -> Document:
    """Launch one run on ``cfg.nproc`` ranks and return its document (not yet written); with
    ``predict_from`` (a results folder), the step time predicted from it before the launch
    (``predict_step``) is recorded beside the ledger's predictions."""
    backend = backend_for(cfg.nproc)
    environment = None
    predicted = None
    if predict_from is not None:
        environment = snapshot(probe_links=backend == "nccl")
        predicted = predict_step(
            cfg, command=command, backend=backend, environment=environment, root=predict_from
        )
    res = launch(
        "parlab.projects.training_state.rank:train_rank",
        cfg.to_json(),
        LaunchConfig(
            nproc=cfg.nproc,
            backend=backend,
            timeout_s=cfg.timeout_s,
            numa_binding=cfg.numa_binding if backend == "nccl" else None,
        ),
    )
    return document(
        cfg,
        res.results if res.ok else None,
        None if res.ok else res.failure,
        command=command,
        backend=backend,
        environment=environment,
        step_prediction=predicted,
    )


def comparison_configs(
    *, model: str | None, nproc: int | None, steps: int | None, gpu: bool, seq: int | None
) -> list[TrainConfig]:
    """The comparison set: GPU size (1.3B, bf16, seq 4096) on GPUs, CPU size otherwise."""
    if gpu:
        base = {
            "model": model or "1.3b",
            "nproc": nproc or torch.cuda.device_count(),
            "steps": steps or 5,
            "warmup": 3,
            "micro_batch": 2,
            "seq": seq or 4096,
            "dtype": "bf16",
        }
        names = GPU_SET
    else:
        base = {
            "model": model or "tiny",
            "nproc": nproc or 2,
            "steps": steps or 3,
            "warmup": 1,
            "micro_batch": 2,
            "seq": seq or 64,
            "dtype": "fp32",
        }
        names = CPU_SET
    return [TrainConfig(strategy=s, **{**base, **knobs}) for s, knobs in names]


def train_command(cfg: TrainConfig) -> str:
    """The ``parlab train`` line that reproduces one run of a set."""
    args = ["parlab", "train", "--strategy", cfg.strategy, "--model", cfg.model]
    defaults = TrainConfig(strategy=cfg.strategy, model=cfg.model)
    flags = {
        "nproc": "--nproc", "steps": "--steps", "warmup": "--warmup",
        "micro_batch": "--micro-batch", "global_batch": "--global-batch", "seq": "--seq",
        "dtype": "--dtype", "recompute": "--recompute", "optimizer": "--optimizer", "lr": "--lr",
        "seed": "--seed", "hybrid_shard": "--hybrid-shard", "data": "--data",
        "memory_cap": "--memory-cap", "timeout_s": "--timeout",
    }  # fmt: skip
    for field, flag in flags.items():
        value = getattr(cfg, field)
        if value != getattr(defaults, field) and value is not None:
            args += [flag, str(value)]
    if cfg.compile:
        args.append("--compile")
    if not cfg.reshard_after_forward:
        args.append("--no-reshard")
    return shlex.join(args)


def run_set(configs: list[TrainConfig], *, grouped: bool) -> list[Document]:
    """Run every config; ``grouped`` runs them in one launch (falling back to one each on failure)."""
    if grouped and len({c.nproc for c in configs}) == 1 and len(configs) > 1:
        backend = backend_for(configs[0].nproc)
        res = launch(
            "parlab.projects.training_state.rank:train_many",
            {"runs": [c.to_json() for c in configs]},
            LaunchConfig(
                nproc=configs[0].nproc,
                backend=backend,
                timeout_s=max(c.timeout_s for c in configs),
            ),
        )
        if res.ok:
            env = snapshot(probe_links=backend == "nccl")
            return [
                document(
                    c,
                    [per_rank[i] for per_rank in res.results],
                    None,
                    command=train_command(c),
                    backend=backend,
                    environment=env,
                )
                for i, c in enumerate(configs)
            ]
    return [run_training(c, command=train_command(c)) for c in configs]


def render_report(docs: list[Document], out_dir: Path) -> dict[str, Path]:
    """``training-state.md`` and its figures in ``out_dir``; returns name -> path."""
    paths = write_markdown(
        Report(title=TITLE, blocks=blocks(docs)), out_dir / "training-state.md", "."
    )
    return figure_paths(paths)


def run_project(
    results: Path,
    *,
    model: str | None = None,
    nproc: int | None = None,
    steps: int | None = None,
    seq: int | None = None,
    only: list[str] | tuple[str, ...] | None = None,
    report_only: bool = False,
    console: Any = None,
) -> dict[str, Path]:
    """``parlab project training-state``: run the comparison set, write documents, render the report."""
    out_dir = results / PROJECT
    if report_only:
        entries, _ = read_results(results)
        latest: dict[str, Document] = {}
        for e in entries:  # the latest document of each distinct run (label)
            if e.doc.project == PROJECT and e.doc.task == "T2":
                latest[run_label(e.doc)] = e.doc
        if not latest:
            raise UsageError(f"no {PROJECT} documents under {results}: run the set first")
        return render_report(list(latest.values()), out_dir)
    gpu = torch.cuda.is_available() and torch.cuda.device_count() >= (nproc or 1)
    configs = comparison_configs(model=model, nproc=nproc, steps=steps, gpu=gpu, seq=seq)
    if only:
        unknown = [s for s in only if s not in STRATEGIES]
        if unknown:
            raise UsageError(f"unknown strategy {unknown[0]!r}: use one of {', '.join(STRATEGIES)}")
        base = configs[0]
        configs = [dataclasses.replace(base, strategy=s) for s in only]
    docs = run_set(configs, grouped=not gpu)
    for d in docs:
        path = write_result(d, results)
        if console is not None:
            status = "ok" if d.failure is None else f"failed ({d.failure.kind})"
            console.print(f"{d.layout['strategy']}: {status} -> {path}")
    return render_report(docs, out_dir)

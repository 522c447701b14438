"""The host's time per training step of ``parlab train``, set beside the GPU's (the roofline).

Why: on one H200 some training runs take longer than every kernel they launch. FSDP on one rank
of Llama-3.1 8B and Qwen2.5 7B at 1 x 1024 tokens (full recompute) ran 0.29-0.43 s a step
(eight runs, three machines) where the roofline's GPU work is 0.21-0.22 s; a profile of the 8B
(``results/PAR-TRAINING-STATE/profile-train-fsdp-20261201T045000-9a446e``) shows 0.205 s of
kernels in a 0.396 s step, the GPU idle about 2 ms before each block's backward, and no
allocator retries (``alloc_retries`` 0 in the runs of ``scripts/gpu/fit_edge.sh``). GPT-2 124M at
1 x 1024 takes 22 ms a step over 9.7 ms of kernels
(``profile-train-ddp-20261201T053707-1a2db9``). There the host -- Python, the autograd engine,
FSDP2's hooks, the optimizer's dispatch -- issues the step more slowly than the GPU runs it.

What runs: for each ``--run STRATEGY:MODEL:MBxSEQ:RECOMPUTE``, the same ``parlab train`` step on
one rank (``parlab.projects.training_state.run_training``: the real loop, its optimizer, its
strategy, bf16) on the model with every layer, head, parameter tensor and the vocabulary kept
but the width cut to ``--head-dims`` per head (default 16 and 32: hidden = heads x head dim,
the FFN in proportion), so the GPU's work is a small fraction of the step and the step's time is
the host's. Two widths: equal steps say the GPU does not set them; a step that grows with the
width (by more than ``parlab.plan.fit.host.SERIAL_GROWTH``) says the GPU's work adds to the host's.
The narrowed model reaches ``parlab train`` as a Hugging Face ``config.json`` (``hf_config``),
which ``parlab.models.get_spec`` reads.

The narrowed model leaves out the host's work that grows with the parameters: FSDP2's
reduce-scatter copy-in builds its CUDA kernel's block table on the CPU (a profile of FSDP on one
rank of the 8B showed the GPU idle about 2 ms before each block's table copy) and fused
AdamW packs every tensor chunk's address into its launches. ``--tokens`` measures it: the model
at its own width on one sequence of a few tokens (``1 x T``), every parameter there and the
GPU's work still a small part of the step (its entries carry ``tokens``; these runs are not
written as training runs). ``parlab.plan.fit.host.host_estimate`` takes them, where a probe made
them, for the configuration on one rank.

Output: one ``distributed-benchmark/v1`` document under ``RESULTS_DIR/PAR-TRAINING-STATE/``
(``host-step-<stamp>.json``, task T6, role baseline, evidence ``real-training`` on a GPU and
``cpu-mechanism`` on the CPU) whose ``workload.calibration`` lists, per run, the median step of
each width (``parlab.plan.fit.host.load_host_step`` reads it); the narrowed runs' own documents are
not written (their step times are in the calibration); it records no ``step_time`` metric, so
it is never taken for a training run.

    python3 benchmarks/host_step_probe.py RESULTS_DIR --run fsdp:llama3.1-8b:1x1024:full
    python3 benchmarks/host_step_probe.py RESULTS_DIR --run ... --tokens 32,64
    scripts/gpu/host_step.sh OUT_DIR      # the GPU run

Without a GPU the runs are one gloo CPU rank in fp32 (a dry run: the times say nothing of a GPU
machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from parlab.plan.fit.host import narrow_spec  # the probe's narrowed model

FORMAT = "parlab-host-step/v1"
KIND = "host-step-calibration"


@dataclasses.dataclass(frozen=True)
class Run:
    """One ``--run``: what ``parlab train`` runs, as the measured runs did."""

    strategy: str
    model: str
    micro_batch: int
    seq: int
    recompute: str

    @classmethod
    def parse(cls, text: str) -> Run:
        parts = text.split(":")
        if len(parts) != 4 or "x" not in parts[2]:
            raise ValueError(f"--run {text!r}: give STRATEGY:MODEL:MBxSEQ:RECOMPUTE")
        mb, seq = (int(x) for x in parts[2].lower().split("x"))
        return cls(parts[0], parts[1], mb, seq, parts[3])


def hf_config(spec: Any) -> dict[str, Any]:
    """A Hugging Face ``config.json`` that ``parlab.models.hf.load_hf_config`` reads back as
    ``spec`` (GPT-2, Qwen2 or Llama kinds: the structures parlab's reference model builds)."""
    if spec.norm == "layernorm" and spec.position == "learned":
        return {
            "model_type": "gpt2",
            "_name_or_path": spec.name,
            "n_embd": spec.hidden,
            "n_layer": spec.layers,
            "n_head": spec.heads,
            "n_inner": spec.ffn_hidden,
            "vocab_size": spec.vocab_size,
            "n_positions": spec.max_seq_len,
            "layer_norm_epsilon": spec.norm_eps,
            "tie_word_embeddings": spec.tied_embeddings,
        }
    if spec.moe is not None or spec.mla is not None or spec.norm != "rmsnorm":
        raise ValueError(f"{spec.name}: only GPT-2, Qwen2 and Llama structures are probed")
    return {
        "model_type": "qwen2" if spec.qkv_bias else "llama",
        "_name_or_path": spec.name,
        "hidden_size": spec.hidden,
        "num_hidden_layers": spec.layers,
        "num_attention_heads": spec.heads,
        "num_key_value_heads": spec.kv_heads or spec.heads,
        "intermediate_size": spec.ffn_hidden,
        "vocab_size": spec.vocab_size,
        "max_position_embeddings": spec.max_seq_len,
        "rms_norm_eps": spec.norm_eps,
        "rope_theta": spec.rope_theta,
        "attention_bias": spec.qkv_bias,
        "hidden_act": "silu" if spec.activation == "swiglu" else "gelu",
        "tie_word_embeddings": spec.tied_embeddings,
    }


def _phases(doc: Any) -> dict[str, Any]:
    """The run's rank-0 time by phase (``workload.phase_times``: host and device seconds per
    timed step of data, forward, backward, optimizer, zero_grad), where it recorded them."""
    ph = doc.workload.get("phase_times")
    return {"phase_times": ph} if ph else {}


def time_run(
    run: Run,
    head_dim: int,
    *,
    gpu: bool,
    steps: int,
    warmup: int,
    tmp: Path,
    tokens: int | None = None,
) -> Any:
    """The narrowed run's document (``parlab train`` on one rank; head dim 0: the model itself,
    the measured configuration; ``tokens``: the model itself on one sequence of that many
    tokens); raises on a failed run."""
    from parlab.projects.training_state import TrainConfig, run_training

    model = run.model
    if head_dim:
        spec = narrow_spec(run.model, head_dim)
        cfg_path = tmp / f"{spec.name}.json"
        cfg_path.write_text(json.dumps(hf_config(spec)))
        model = str(cfg_path)
    cfg = TrainConfig(
        strategy=run.strategy,
        model=model,
        nproc=1,
        steps=steps,
        warmup=warmup,
        micro_batch=1 if tokens else run.micro_batch,
        seq=tokens or run.seq,
        dtype="bf16-compute" if gpu else "fp32",
        recompute=run.recompute,
        timeout_s=240.0,
    )
    what = f"1x{tokens} tokens" if tokens else f"hd{head_dim}"
    doc = run_training(cfg, command=f"host_step_probe {run} {what}")
    if doc.status != "ok" or doc.metric("step_time") is None:
        why = f"{doc.failure.kind}: {doc.failure.message}" if doc.failure else doc.status
        raise RuntimeError(f"{run} at {what}: the run failed: {why}")
    return doc


def measure(
    run: Run,
    head_dims: list[int],
    *,
    gpu: bool,
    steps: int,
    warmup: int,
    results: str,
    tokens: list[int] | None = None,
) -> dict[str, Any]:
    """One run's entry of the calibration: each width's median step and every step. The model's
    own width (head dim 0) is a real run of the configuration: its document is written under
    ``results`` as any ``parlab train`` run's, and the entry names it (``run_id``)."""
    from parlab.contract import write_result
    from parlab.models import get_spec

    widths = []
    with tempfile.TemporaryDirectory(prefix="parlab-host-step-") as tmp:
        for hd in head_dims:
            doc = time_run(run, hd, gpu=gpu, steps=steps, warmup=warmup, tmp=Path(tmp))
            full = {}
            if not hd:
                write_result(doc, results)
                full = {"run_id": doc.run_id}
            spec = narrow_spec(run.model, hd) if hd else get_spec(run.model)
            widths.append({
                **full,
                "head_dim": hd or spec.d_head,
                "hidden": spec.hidden,
                "step_s": float(doc.metric("step_time")),
                "step_times": list(doc.workload.get("step_times") or []),
                **_phases(doc),
            })  # fmt: skip
        for t in tokens or []:  # the model's own width, few tokens: nothing written
            doc = time_run(run, 0, gpu=gpu, steps=steps, warmup=warmup, tmp=Path(tmp), tokens=t)
            spec = get_spec(run.model)
            widths.append({
                "tokens": t,
                "head_dim": spec.d_head,
                "hidden": spec.hidden,
                "step_s": float(doc.metric("step_time")),
                "step_times": list(doc.workload.get("step_times") or []),
                **_phases(doc),
            })  # fmt: skip
    return {
        **dataclasses.asdict(run),
        "model": get_spec(run.model).name,
        "layers": get_spec(run.model).layers,
        "widths": widths,
    }


def calibration(entries: list[dict[str, Any]], *, device: str, backend: str) -> dict[str, Any]:
    return {"format": FORMAT, "device": device, "backend": backend, "runs": entries}


def document(body: dict[str, Any], *, command: str, environment: dict[str, Any]) -> Any:
    """The contract document holding ``body`` (see the module docstring)."""
    from parlab.plan.fit.probes import probe_document

    return probe_document(
        prefix="host-step",
        project="PAR-TRAINING-STATE",
        kind=KIND,
        body=body,
        gpu=body["backend"] == "cuda",
        command=command,
        environment=environment,
        layout={"world_size": 1, "mesh": {}, "strategy": "host-step-probe"},
        metrics={},
        notes=[
            "each run: parlab train on one rank with every layer, head, parameter tensor and "
            "the vocabulary of its model, the width cut to a few elements per head; the median "
            "step of each width (the GPU's work a small fraction of it: the host's time); "
            "entries with 'tokens': the model at its own width on one sequence of that many "
            "tokens (every parameter's host work in the step)"
        ],
    )


def summary(body: dict[str, Any]) -> list[str]:
    lines = [f"host step on {body['device']} ({body['backend']})"]
    for r in body["runs"]:
        steps = ", ".join(
            (f"1x{w['tokens']} tokens" if "tokens" in w
             else f"{'full ' if 'run_id' in w else ''}hd {w['head_dim']}")
            + f": {w['step_s'] * 1e3:.1f} ms"
            for w in r["widths"]
        )  # fmt: skip
        lines.append(
            f"  {r['strategy']:<5} {r['model']:<12} {r['micro_batch']}x{r['seq']:<6} "
            f"{r['recompute']:<9} {steps}"
        )
    return lines


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("results", help="results folder (the document goes to PAR-TRAINING-STATE/)")
    ap.add_argument("--run", action="append", required=True,
                    help="STRATEGY:MODEL:MBxSEQ:RECOMPUTE, e.g. fsdp:llama3.1-8b:1x1024:full")  # fmt: skip
    ap.add_argument("--head-dims", default="16,32",
                    help="widths per head, comma-separated; 0: the model's own (a real run, "
                         "written beside the calibration)")  # fmt: skip
    ap.add_argument("--tokens", default="",
                    help="also the model at its own width on one sequence of each of these "
                         "lengths, comma-separated (e.g. 32,64): the host's step with every "
                         "parameter, the GPU's work a small part of it (not written as runs)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=3)
    a = ap.parse_args()
    try:
        runs = [Run.parse(r) for r in a.run]
        head_dims = [int(x) for x in a.head_dims.split(",") if x]
        tokens = [int(x) for x in a.tokens.split(",") if x]
        if any(t < 1 for t in tokens):
            raise ValueError(f"--tokens {a.tokens!r}: give positive sequence lengths")
        from parlab.models import get_spec

        for r in runs:
            get_spec(r.model)
            for hd in head_dims:
                if hd:
                    hf_config(narrow_spec(r.model, hd))
    except ValueError as exc:  # UsageError is a ValueError
        ap.error(str(exc))
    import torch

    from parlab.contract import write_result
    from parlab.hardware.env import snapshot
    from parlab.runtime import meters

    gpu = torch.cuda.is_available()
    dev = torch.device("cuda", 0) if gpu else torch.device("cpu")
    env = snapshot(probe_links=False)
    entries = []
    try:
        for r in runs:
            entries.append(
                measure(
                    r,
                    head_dims,
                    gpu=gpu,
                    steps=a.steps,
                    warmup=a.warmup,
                    results=a.results,
                    tokens=tokens,
                )
            )
            print("\n".join(summary(calibration(entries[-1:], device="", backend=""))[1:]))
    except KeyboardInterrupt:
        print("interrupted: nothing written")
        return 130
    body = calibration(entries, device=meters.device_name(dev), backend=dev.type)
    print("\n".join(summary(body)))
    doc = document(body, command=" ".join(["python3", *sys.argv]), environment=env)
    print(f"written {write_result(doc, a.results)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

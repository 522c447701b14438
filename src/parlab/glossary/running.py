"""Glossary terms: cutting the model, routing experts, time and failures."""

from __future__ import annotations

from parlab.glossary.term import G_ROUTE, G_SPLIT, G_TIME, Term

TERMS: list[Term] = [
    Term(
        name="TP",
        aliases=(
            "tensor parallel",
            "tensor parallelism",
            "tensor model parallel",
            "mp",
            "model parallel",
        ),
        meaning="Split each weight matrix over t ranks: column-parallel (heads / FFN features) "
        "then row-parallel, so one all-reduce of the activations closes each attention and "
        "MLP block in forward and one in backward. On the critical path: keep it inside one "
        "NVLink domain.",
        elsewhere="Megatron tensor-model-parallel-size; PyTorch DTensor ColwiseParallel / "
        "RowwiseParallel; DeepSpeed 'AutoTP'; vLLM --tensor-parallel-size.",
        measure="parlab layout; parlab project model-internal (tp2); parlab profile tp",
        group=G_SPLIT,
        formula="per layer: 2 all-reduces of b x s x h elements in forward (after attention and after the MLP) and 2 in backward, all blocking",
    ),
    Term(
        name="SP",
        aliases=("sequence parallel", "sequence parallelism", "megatron sp"),
        meaning="Megatron-style sequence parallelism, a companion of TP: the parts TP leaves "
        "replicated (norms, dropout, residual) are split along the sequence over the same t "
        "ranks; each all-reduce becomes a reduce-scatter + all-gather (same bytes) and "
        "activation memory there drops by t.",
        elsewhere="Not the same as DeepSpeed-Ulysses 'sequence parallelism' (that one is CP); "
        "PyTorch SequenceParallel style in parallelize_module.",
        measure="parlab project model-internal (tp2-sp); parlab profile tp",
        group=G_SPLIT,
    ),
    Term(
        name="CP",
        aliases=(
            "context parallel",
            "context parallelism",
            "ring attention",
            "ulysses",
            "deepspeed-ulysses",
            "sequence parallelism (ulysses)",
        ),
        meaning="Split the whole sequence over c ranks for every layer (long contexts). "
        "Attention needs all keys/values: ring attention passes K/V blocks around a ring "
        "(c-1 send/recv steps overlapped with blockwise attention, any head count); Ulysses "
        "does two all-to-alls per attention to switch from sequence-split to head-split and "
        "back (needs heads divisible by c, lower latency at moderate c).",
        elsewhere="Megatron --context-parallel-size (ring, with all-gather/a2a variants); "
        "PyTorch context_parallel (ring); DeepSpeed-Ulysses calls Ulysses 'sequence "
        "parallelism'.",
        measure="parlab project model-internal (cp2-ring); parlab layout",
        group=G_SPLIT,
    ),
    Term(
        name="PP",
        aliases=(
            "pipeline parallel",
            "pipeline parallelism",
            "1f1b",
            "gpipe",
            "interleaved",
            "interleaved 1f1b",
            "virtual pipeline",
            "vpp",
            "micro-batch",
            "microbatch",
        ),
        meaning="Split the layers into p stages on p ranks; activations go stage to stage by "
        "send/recv. The batch is cut into m micro-batches so stages work at once. GPipe runs "
        "all forwards then all backwards; 1F1B alternates (same bubble, activation memory for "
        "p micro-batches instead of m); interleaved 1F1B gives each rank v virtual stages "
        "(bubble / v, v x the sends).",
        elsewhere="Megatron --pipeline-model-parallel-size, --num-layers-per-virtual-pipeline-"
        "stage; torch.distributed.pipelining ScheduleGPipe / Schedule1F1B / "
        "ScheduleInterleaved1F1B; DeepSpeed PipelineModule.",
        measure="parlab project model-internal (pp2-gpipe, pp2-1f1b, pp2-interleaved); "
        "parlab layout",
        group=G_SPLIT,
        formula="each stage boundary sends one micro-batch's b x s x h activation forward and its gradient back, per micro-batch",
    ),
    Term(
        name="bubble",
        aliases=("pipeline bubble", "pp bubble", "fill and drain"),
        meaning="The idle share of a pipeline step while it fills and drains: (p-1)/(m+p-1) "
        "for GPipe and 1F1B with p stages and m micro-batches, about (p-1)/(v*m) interleaved. "
        "Keep m >= 4p.",
        elsewhere="Megatron 'pipeline bubble'; zero-bubble schedules (ZB-H1/H2, DualPipe) "
        "split backward into input and weight gradients to fill it.",
        measure="parlab project model-internal (metrics.pp_bubble); parlab doctor",
        group=G_SPLIT,
        formula="idle share = (p-1)/(m+p-1) for GPipe and 1F1B (p stages, m micro-batches), about (p-1)/(v x m + p-1) with v chunks per rank; relative to the useful time: (p-1)/m",
    ),
    Term(
        name="device mesh",
        aliases=("mesh", "devicemesh", "parallel dims", "topology"),
        meaning="The ranks arranged as an n-D grid with named axes (pp, dp, cp, tp; ep splits "
        "dp); each axis's rows are the process groups of that parallelism. Innermost axes "
        "(tp) should map to the fastest links.",
        elsewhere="PyTorch init_device_mesh; torchtitan ParallelDims; Megatron parallel_state "
        "groups; JAX Mesh.",
        measure="parlab layout",
        group=G_SPLIT,
    ),
    Term(
        name="EP",
        aliases=(
            "expert parallel",
            "expert parallelism",
            "moe",
            "mixture of experts",
            "dispatch",
            "combine",
        ),
        meaning="Mixture-of-experts layers place different experts on different ranks; a "
        "router picks top-k experts per token, an all-to-all dispatches tokens to the experts' "
        "ranks and a second all-to-all combines the outputs back. Load follows the router, so "
        "ranks can be uneven.",
        elsewhere="Megatron --expert-model-parallel-size; DeepSpeed-MoE ep_size; vLLM "
        "--enable-expert-parallel; 'EP' in DeepSeek-V3's papers.",
        measure="parlab project moe",
        group=G_ROUTE,
        formula="dispatch buffer per rank = tokens x k x hidden x bytes; (ep-1)/ep of it crosses the wire with uniform routing",
    ),
    Term(
        name="capacity factor",
        aliases=("capacity", "token dropping", "overflow", "dropless", "overflow rate"),
        meaning="Each expert takes at most capacity = ceil(k*T/E x factor) tokens per batch; "
        "the rest overflow (dropped, or carried only by the residual). Factor 1 is exactly "
        "even; 1.25-2 absorbs skew; dropless (no cap) keeps every token and lets the slowest "
        "rank set the time.",
        elsewhere="GShard/Switch 'capacity factor'; Megatron --moe-expert-capacity-factor and "
        "--moe-token-drop-policy; DeepSpeed-MoE capacity_factor.",
        measure="parlab project moe --capacity-factor F --sweep 0.5,1,1.25,2",
        group=G_ROUTE,
        formula="capacity per expert = capacity factor x tokens x k / E; overflow = 1 - kept / routed assignments",
    ),
    Term(
        name="load balancing loss",
        aliases=("aux loss", "auxiliary loss", "aux-loss-free", "expert bias"),
        meaning="A loss term (or, aux-loss-free, a per-expert bias on the router scores updated "
        "from the observed load) that pushes the router towards even expert load.",
        elsewhere="Switch/GShard auxiliary loss; DeepSeek-V3 auxiliary-loss-free balancing; "
        "Megatron --moe-router-load-balancing-type aux_loss|seq_aux_loss|none.",
        measure="parlab project moe --balance none,aux,bias",
        group=G_ROUTE,
    ),
    Term(
        name="overlap",
        aliases=("compute-communication overlap", "comm overlap", "overlap fraction"),
        meaning="The part of communication time during which compute also runs: "
        "|comm ∩ compute| / |comm| per step. Comm that overlaps costs (almost) nothing.",
        elsewhere="Holistic Trace Analysis 'comm-comp overlap %'; Nsight 'overlap'.",
        measure="parlab profile (metrics.overlap_fraction)",
        group=G_TIME,
        formula="overlap = |comm and compute at once| / |comm| per step (Holistic Trace Analysis)",
    ),
    Term(
        name="exposed communication",
        aliases=("exposed comm", "exposed", "critical path communication", "non-overlapped"),
        meaning="Communication time with no compute beside it: comm - overlap. This, not the "
        "total comm time, is what a collective adds to the step.",
        elsewhere="'exposed communication' in Megatron/torchtitan discussions; HTA reports it "
        "as the non-overlapped part.",
        measure="parlab profile (metrics.exposed_comm_time, exposed_comm_fraction)",
        group=G_TIME,
        formula="exposed = comm - overlapped comm; step ~ compute + exposed + idle",
    ),
    Term(
        name="MFU",
        aliases=("model flops utilization", "model flop utilisation", "hfu"),
        meaning="Model FLOPs per second achieved / the GPU's peak FLOP/s for the dtype: "
        "6*N*tokens (+ attention) per step over step time. Unknown (not guessed) when the "
        "GPU's peak is not in the catalog. HFU counts recompute FLOPs too; MFU does not.",
        elsewhere="PaLM's MFU definition; nanoGPT estimate_mfu; torchtitan 'mfu'.",
        measure="parlab train (metrics.mfu); parlab project model-internal",
        group=G_TIME,
        formula="MFU = achieved model FLOP/s / the GPU's peak FLOP/s = tokens/s x FLOP per token / peak; FLOP per token = 6N + 12 L H Q T",
    ),
    Term(
        name="scaling efficiency",
        aliases=("speedup", "speed-up", "weak scaling", "strong scaling"),
        meaning="Speed-up over one GPU divided by the number of GPUs, at the same global batch "
        "(strong scaling) -- 1.0 is perfect.",
        elsewhere="",
        measure="parlab project model-internal (metrics.scaling_efficiency, speedup_vs_single)",
        group=G_TIME,
        formula="efficiency = speed-up over one GPU / GPUs (strong scaling: the same global batch), or tokens/s per GPU / one GPU's (weak scaling)",
    ),
    Term(
        name="straggler",
        aliases=("slow rank", "slowest rank", "late rank"),
        meaning="A rank that reaches the collectives late; every other rank waits, and its "
        "lateness shows up as their communication time.",
        elsewhere="HTA 'straggler'; NCCL 'slow rank'.",
        measure="parlab profile (metrics.straggler_rank, straggler_lateness); parlab project "
        "moe (slowest_rank)",
        group=G_TIME,
    ),
    Term(
        name="step-time spread",
        aliases=("run-to-run variance", "jitter", "noise", "repeats", "gc pause", "manual gc"),
        meaning="How far the same configuration's step time moves: between the steps of one "
        "run (a garbage-collection pause, a slow collective) and between runs of the same "
        "command. A prediction is judged against the median of repeats; a single run that "
        "differs from its repeats by more than the target says more about the machine than "
        "about the model.",
        elsewhere="torchtitan training.gc_freq and Megatron --manual-gc (collect garbage by "
        "hand, between steps); nccl-tests' -n/-w iterations and warm-up.",
        measure="parlab train (workload.step_times, --manual-gc N: default 50, Python's "
        "automatic collection off, which paused one step in every 10-step GPT-2 FSDP run); "
        "parlab project model-internal (workload.step_times)",
        group=G_TIME,
    ),
    Term(
        name="host-bound",
        aliases=(
            "cpu-bound",
            "launch-bound",
            "cpu overhead",
            "host overhead",
            "gpu idle",
            "host step",
        ),
        meaning="A step whose time is set by the host -- Python, the autograd engine, FSDP's "
        "hooks, a dispatch mode -- issuing kernels more slowly than the GPU runs them: the GPU "
        "idles between kernels, and the step takes the host's time, which differs from one "
        "machine to the next. Small micro-batches, many small parameter tensors, per-op "
        "Python dispatch (DTensor, op-level selective recompute) make it so. The planner "
        "predicts the GPU's time only; its accuracy benchmark lists host-bound runs apart, "
        "decided by each run's own phase timing (the device's backward against the host's).",
        elsewhere="PyTorch performance guides 'CPU overhead' / 'launch-bound' (CUDA graphs and "
        "torch.compile remove it); HTA's 'idle time'.",
        measure="parlab profile (per-step idle: the GPU waiting on the host); parlab train "
        "(workload.phase_times: each phase's host and device time, printed after the run)",
        group=G_TIME,
    ),
    Term(
        name="allocator retries",
        aliases=(
            "alloc retries",
            "num_alloc_retries",
            "cudamalloc retry",
            "fragmentation",
            "peak reserved",
            "expandable segments",
        ),
        meaning="Times PyTorch's caching allocator found no free block, released its cached "
        "blocks (cudaFree, which synchronizes the device) and tried again: a run at its memory "
        "edge stalls there. Reserved memory above allocated memory is the cache and its "
        "fragmentation.",
        elsewhere="torchtitan's memory monitor 'num_alloc_retries'; "
        "torch.cuda.memory_stats()['num_alloc_retries']; PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:True to fragment less.",
        measure="parlab train (metrics.alloc_retries over the timed steps, metrics.peak_reserved)",
        group=G_TIME,
    ),
    Term(
        name="flight recorder",
        aliases=(
            "nccl flight recorder",
            "torch_nccl_trace_buffer_size",
            "torch_fr_buffer_size",
            "hang",
            "timeout",
            "fr_trace",
        ),
        meaning="A ring buffer of the last N collectives per rank kept by ProcessGroupNCCL "
        "(TORCH_FR_BUFFER_SIZE=N; older torch: TORCH_NCCL_TRACE_BUFFER_SIZE), dumped on timeout (TORCH_NCCL_DUMP_ON_TIMEOUT=1, "
        "files at TORCH_NCCL_DEBUG_INFO_TEMP_FILE<rank>). Read them with python -m "
        "torch.distributed.flight_recorder.fr_trace DIR: the first collective a rank never "
        "reached names the hang.",
        elsewhere="NCCL_DEBUG=INFO logs; TORCH_DISTRIBUTED_DEBUG=DETAIL checks collective order.",
        measure="parlab doctor --reproduce collective-timeout",
        group=G_TIME,
    ),
    Term(
        name="evidence level",
        aliases=(
            "evidence",
            "cpu-mechanism",
            "real-nccl",
            "real-training",
            "analytic",
            "env-precheck",
            "serving-benchmark",
        ),
        meaning="What a number rests on: analytic (formulas), cpu-mechanism (real processes and "
        "collectives on gloo CPU ranks: correctness and volumes, not speed), env-precheck, "
        "real-nccl, real-training, serving-benchmark.",
        elsewhere="",
        measure="parlab results (the evidence column)",
        group=G_TIME,
    ),
]

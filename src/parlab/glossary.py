"""The glossary: the field's terms, where frameworks name the same thing differently,
and the parlab command that measures each.

This module is the one source of truth: ``parlab explain TERM`` reads it and
``docs/glossary.md`` is generated from it (``python -m parlab.glossary >
docs/glossary.md``; a test keeps the two equal). Nothing crosses the wire here.
"""

from __future__ import annotations

import difflib
import re
import sys
from dataclasses import dataclass

from parlab.errors import UsageError


@dataclass(frozen=True, kw_only=True)
class Term:
    """One glossary entry."""

    name: str
    """The term as the docs write it."""
    aliases: tuple[str, ...]
    """Other spellings and names that look it up (case-insensitive)."""
    meaning: str
    """What it is, in a few sentences."""
    elsewhere: str
    """How frameworks name it (or the same thing) differently; empty if they agree."""
    measure: str
    """The parlab command that measures or computes it."""
    group: str
    """Section of the glossary."""


G_STATE, G_COMM, G_SPLIT, G_ROUTE, G_TIME, G_SERVE = (
    "Training state: replicated to sharded",
    "Collectives and bandwidth",
    "Cutting the model: TP, SP, CP, PP",
    "Dynamic routing: experts",
    "Time: overlap, utilisation, failures",
    "Serving",
)

TERMS: list[Term] = [
    Term(
        name="DDP",
        aliases=("data parallel", "data parallelism", "dp", "distributeddataparallel"),
        meaning="Every rank holds the whole model, params, grads and optimizer state, and trains "
        "on its own slice of the batch; gradients are all-reduced (summed over ranks) in "
        "buckets during backward, so the sync overlaps the remaining backward compute.",
        elsewhere="PyTorch DistributedDataParallel; DeepSpeed ZeRO stage 0; Megatron's DDP "
        "wrapper (contiguous grad buffer).",
        measure="parlab train --strategy ddp; parlab ledger; parlab profile ddp-buckets",
        group=G_STATE,
    ),
    Term(
        name="bucket",
        aliases=("bucket_cap_mb", "gradient bucket", "ddp bucket"),
        meaning="DDP packs gradients into buckets of about bucket_cap_mb (torch default 25 MB) "
        "and all-reduces each bucket once all its gradients are ready. Small buckets start the "
        "sync early but pay a fixed latency per all-reduce; large buckets amortise it but start "
        "late.",
        elsewhere="DeepSpeed reduce_bucket_size / allgather_bucket_size (elements, not MB); "
        "Megatron bucket_size in its DDP config.",
        measure="parlab profile ddp-buckets --buckets 1,25,250",
        group=G_STATE,
    ),
    Term(
        name="ZeRO",
        aliases=(
            "zero-1",
            "zero-2",
            "zero-3",
            "zero1",
            "zero2",
            "zero3",
            "zero stage",
            "optimizer state sharding",
        ),
        meaning="Zero Redundancy Optimizer: shard what DDP replicates over the data-parallel "
        "ranks. ZeRO-1 shards the optimizer state (and fp32 master weights); ZeRO-2 also the "
        "gradients (reduce-scatter instead of all-reduce); ZeRO-3 also the parameters "
        "(all-gathered before each layer's forward and again in backward). Traffic: ZeRO-1/2 "
        "move the same bytes as DDP (reduce-scatter + all-gather = all-reduce); ZeRO-3 adds "
        "one more parameter all-gather (about 1.5x DDP).",
        elsewhere="ZeRO-3 = PyTorch FSDP FULL_SHARD = FSDP2 fully_shard(reshard_after_forward="
        "True); ZeRO-2 ~ FSDP SHARD_GRAD_OP = FSDP2 reshard_after_forward=False (params stay "
        "gathered from forward to backward); ZeRO-1 ~ Megatron's distributed optimizer "
        "(--use-distributed-optimizer), which shards optimizer state and main params but keeps "
        "a full gradient buffer, and reduce-scatters grads / all-gathers params like ZeRO-2.",
        measure="parlab train --strategy zero1|zero2|zero3; parlab ledger; "
        "parlab project training-state",
        group=G_STATE,
    ),
    Term(
        name="FSDP",
        aliases=(
            "fully sharded data parallel",
            "full_shard",
            "shard_grad_op",
            "hybrid_shard",
            "fsdp2",
            "fully_shard",
            "hsdp",
            "hybrid shard",
        ),
        meaning="PyTorch's ZeRO: parameters, grads and optimizer state sharded over the "
        "data-parallel ranks, per wrapped unit (a transformer block). Strategies: FULL_SHARD "
        "(ZeRO-3), SHARD_GRAD_OP (ZeRO-2-like: no reshard after forward), HYBRID_SHARD "
        "(FULL_SHARD inside a shard group, e.g. a node, replicated across groups: all-gathers "
        "stay on NVLink, only the gradient all-reduce crosses nodes), NO_SHARD (DDP).",
        elsewhere="FSDP2 (fully_shard) spells these as reshard_after_forward=True/False and a "
        "2-D (replicate, shard) device mesh for hybrid (HSDP); DeepSpeed ZeRO-3 (+ ZeRO++ hpZ "
        "for the hybrid idea); Megatron-FSDP.",
        measure="parlab train --strategy fsdp|fsdp-hybrid [--no-reshard]; parlab profile fsdp",
        group=G_STATE,
    ),
    Term(
        name="distributed optimizer",
        aliases=("megatron distributed optimizer", "use-distributed-optimizer"),
        meaning="Megatron-LM's optimizer sharding: each data-parallel rank owns 1/d of the "
        "optimizer state and fp32 main parameters; gradients are reduce-scattered into the "
        "owner, it steps its shard, parameters are all-gathered back.",
        elsewhere="Memory like ZeRO-1 (the full-size grad buffer stays), traffic like ZeRO-2.",
        measure="parlab ledger (zero1/zero2 rows); parlab train --strategy zero1",
        group=G_STATE,
    ),
    Term(
        name="master weights",
        aliases=(
            "mixed precision",
            "bf16-params",
            "bf16-compute",
            "bf16-master",
            "fp32 master",
            "main params",
            "autocast",
            "param_dtype",
            "reduce_dtype",
        ),
        meaning="Training in bf16 while the optimizer steps fp32 values. Two recipes: compute "
        "in bf16 over fp32 parameters (autocast casts each weight per matmul; gradients and "
        "collectives fp32), or keep the parameters and gradients in bf16 and an fp32 master "
        "copy (sharded under ZeRO) that the optimizer steps and casts back -- half the bytes "
        "on the wire and no per-step weight casts.",
        elsewhere="DeepSpeed bf16 (bf16 params, fp32 master partitions); Megatron --bf16 "
        "(fp32 main params in its optimizer); FSDP2 MixedPrecisionPolicy(param_dtype=bf16, "
        "reduce_dtype=fp32): fp32 shards gathered in bf16, gradients reduced in fp32; "
        "torch.autocast is the first recipe.",
        measure="parlab train --strategy zero1 --dtype bf16-compute vs --dtype bf16-params; "
        "parlab ledger --dtype bf16-params (master_params, master_grads)",
        group=G_STATE,
    ),
    Term(
        name="recompute",
        aliases=(
            "activation checkpointing",
            "gradient checkpointing",
            "activation recomputation",
            "selective recompute",
        ),
        meaning="Keep only some activations in forward and recompute the rest in backward: "
        "trades ~1/3 more compute (full) or a few percent (selective: attention internals only) "
        "for activation memory, which sharding the states does not reduce.",
        elsewhere="PyTorch checkpoint / checkpoint_wrapper; Megatron --recompute-granularity "
        "full|selective; DeepSpeed activation_checkpointing; HF gradient_checkpointing.",
        measure="parlab fit; parlab train --recompute selective|full",
        group=G_STATE,
    ),
    Term(
        name="all-reduce",
        aliases=(
            "allreduce",
            "all_reduce",
            "collective",
            "collectives",
            "all-gather",
            "all_gather",
            "reduce-scatter",
            "reduce_scatter",
            "all-to-all",
            "all_to_all",
            "alltoall",
            "broadcast",
            "send/recv",
        ),
        meaning="The collectives: all-reduce (every rank ends with the sum), reduce-scatter "
        "(each rank ends with 1/n of the sum), all-gather (each rank ends with everyone's "
        "pieces), all-to-all (rank i sends its j-th piece to rank j), broadcast, send/recv. "
        "all-reduce = reduce-scatter + all-gather; ring algorithms move 2(n-1)/n of the "
        "buffer per rank for all-reduce and (n-1)/n for the others.",
        elsewhere="NCCL ncclAllReduce...; torch.distributed all_reduce / all_gather_into_tensor "
        "/ reduce_scatter_tensor / all_to_all_single; MPI_Allreduce...",
        measure="parlab collectives --op all",
        group=G_COMM,
    ),
    Term(
        name="algbw",
        aliases=("algorithm bandwidth", "algbw"),
        meaning="Size / time: the buffer size S a collective was called with divided by its "
        "time. Depends on the collective and n, so it cannot be compared with the link speed.",
        elsewhere="nccl-tests 'algbw'; many blogs call it just 'bandwidth'.",
        measure="parlab collectives (the algbw column)",
        group=G_COMM,
    ),
    Term(
        name="busbw",
        aliases=("bus bandwidth", "busbw"),
        meaning="algbw times the collective's factor: all-reduce 2(n-1)/n; all-gather, "
        "reduce-scatter, all-to-all (n-1)/n (S = the whole gathered buffer); broadcast, reduce, "
        "send/recv 1. It is the bytes each rank's link actually carries per second, comparable "
        "with the link peak whatever n is.",
        elsewhere="nccl-tests 'busbw' (parlab uses the same factors and the same size convention).",
        measure="parlab collectives (busbw, % of the link from parlab env)",
        group=G_COMM,
    ),
    Term(
        name="alpha-beta model",
        aliases=("alpha beta", "latency-bandwidth model", "hockney", "calibration"),
        meaning="t = alpha + S * beta per call: alpha the fixed latency, 1/beta the bandwidth. "
        "Below S ~ alpha/beta a call is latency-bound (its count matters, not its bytes).",
        elsewhere="Hockney model; NCCL's internal tuning model (per algorithm/protocol).",
        measure="parlab collectives --fit; parlab collectives --explain MODEL --layout ...",
        group=G_COMM,
    ),
    Term(
        name="c10d",
        aliases=("processgroupnccl", "process group", "torch.distributed", "pynccl", "--via"),
        meaning="torch.distributed's collective layer: dist.all_reduce goes through the "
        "ProcessGroup and its NCCL backend (ProcessGroupNCCL), which adds a work object, CUDA "
        "events, the flight recorder and a watchdog thread (timeouts) around each NCCL call. "
        "For small messages this host work costs about as much as the op itself; calling NCCL "
        "directly skips it, and loses the timeout detection (benchmarks/"
        "collectives_small_probe.py times each layer).",
        elsewhere="NCCL called from C (nccl-tests) or Python ctypes (vLLM's pynccl, parlab's "
        "parlab.comm.nccl_direct); torch's functional collectives and DTensor also go through "
        "c10d.",
        measure="parlab collectives --op all_reduce -b 8 -e 256KiB --via torch|nccl (the "
        "difference is c10d's cost per call)",
        group=G_COMM,
    ),
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
    ),
    Term(
        name="scaling efficiency",
        aliases=("speedup", "speed-up", "weak scaling", "strong scaling"),
        meaning="Speed-up over one GPU divided by the number of GPUs, at the same global batch "
        "(strong scaling) -- 1.0 is perfect.",
        elsewhere="",
        measure="parlab project model-internal (metrics.scaling_efficiency, speedup_vs_single)",
        group=G_TIME,
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
        "Python dispatch (DTensor, op-level selective recompute) make it so. "
        "benchmarks/host_step_probe.py times the host alone: the same step with the model "
        "narrowed until the GPU idles, or (--tokens) the model itself on one sequence of a few "
        "tokens, which keeps the host work that grows with the parameters (FSDP2's "
        "reduce-scatter copy-in builds its kernel's table on the CPU: on one rank of an 8B the "
        "GPU idles about 2 ms before each block's copy); parlab's accuracy benchmark predicts "
        "such a step as the host alone.",
        elsewhere="PyTorch performance guides 'CPU overhead' / 'launch-bound' (CUDA graphs and "
        "torch.compile remove it); HTA's 'idle time'.",
        measure="parlab profile (per-step idle: the GPU waiting on the host); parlab train "
        "(workload.phase_times: each phase's host and device time, printed after the run, "
        "and with --host-probe T the host's step on T tokens in the run's own processes); "
        "parlab plan --roofline (the GPU's time, and the host's where a host-step probe ran "
        "the configuration)",
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
    Term(
        name="TTFT",
        aliases=("time to first token",),
        meaning="Time from sending a request to receiving its first output token: queueing + "
        "prefill. The user-visible latency of a chat reply starting.",
        elsewhere="vLLM/SGLang benchmark_serving 'TTFT' (parlab uses the same definitions).",
        measure="parlab bench serve; parlab project serving",
        group=G_SERVE,
    ),
    Term(
        name="TPOT",
        aliases=("time per output token",),
        meaning="(end-to-end latency - TTFT) / (output tokens - 1), per request: the decode "
        "speed a request saw, averaged over its tokens.",
        elsewhere="vLLM 'TPOT'; some papers say 'TBT' or 'per-token latency'.",
        measure="parlab bench serve",
        group=G_SERVE,
    ),
    Term(
        name="ITL",
        aliases=("inter-token latency", "inter token latency", "tbt"),
        meaning="The gap between consecutive streamed tokens, every gap of every request (so "
        "its tail shows decode stalls, e.g. a long prefill batched in; TPOT averages them "
        "away).",
        elsewhere="vLLM 'ITL'; 'TBT' (time between tokens) in scheduling papers.",
        measure="parlab bench serve",
        group=G_SERVE,
    ),
    Term(
        name="goodput",
        aliases=("slo", "request goodput"),
        meaning="Requests per second that met every latency SLO (e.g. TTFT <= 500 ms and "
        "TPOT <= 50 ms): throughput that counts.",
        elsewhere="DistServe's goodput; vLLM benchmark --goodput ttft:MS tpot:MS.",
        measure="parlab bench serve --goodput ttft:500 --goodput tpot:50 (metrics.request_goodput)",
        group=G_SERVE,
    ),
    Term(
        name="router policy",
        aliases=(
            "router",
            "load balancer",
            "round robin",
            "least outstanding",
            "power of two",
            "cache-aware routing",
            "prefix-aware routing",
        ),
        meaning="How requests are assigned to replicas: round-robin, random, least outstanding "
        "requests, power-of-two choices, cache-aware (prefix locality with a load bound). "
        "Load-blind policies build queues on one replica and fatten the TTFT tail.",
        elsewhere="SGLang router cache_aware; vLLM production-stack router; Envoy LEAST_REQUEST.",
        measure="parlab project serving; parlab serve router",
        group=G_SERVE,
    ),
]

GROUPS = (G_STATE, G_COMM, G_SPLIT, G_ROUTE, G_TIME, G_SERVE)


def _key(text: str) -> str:
    return re.sub(r"[\s_\-]+", "-", text.strip().lower())


def _index() -> dict[str, Term]:
    idx: dict[str, Term] = {}
    for t in TERMS:
        for k in (t.name, *t.aliases):
            idx.setdefault(_key(k), t)
    return idx


def lookup(text: str) -> Term:
    """The term named ``text`` (name or alias, any case); ``UsageError`` with close matches."""
    idx = _index()
    key = _key(text)
    if key in idx:
        return idx[key]
    close = difflib.get_close_matches(key, list(idx), n=4, cutoff=0.6)
    names = list(dict.fromkeys(idx[c].name for c in close))
    hint = f"did you mean {', '.join(names)}?" if names else "see `parlab explain --list`"
    raise UsageError(f"unknown term {text!r}: {hint}")


def render_markdown() -> str:
    """``docs/glossary.md``, generated from ``TERMS``."""
    lines = [
        "# Glossary",
        "",
        "<!-- generated by `python -m parlab.glossary > docs/glossary.md`; edit "
        "src/parlab/glossary.py, not this file -->",
        "",
        "The terms of the field, where frameworks name the same thing differently, and the "
        "parlab command that measures each. `parlab explain TERM` prints one entry.",
        "",
    ]
    for g in GROUPS:
        lines += [f"## {g}", ""]
        for t in (t for t in TERMS if t.group == g):
            lines += [f"### {t.name}", "", t.meaning, ""]
            if t.elsewhere:
                lines += [f"- **Elsewhere:** {t.elsewhere}"]
            lines += [f"- **Measure it:** `{t.measure}`" if ";" not in t.measure else
                      "- **Measure it:** " + "; ".join(f"`{m.strip()}`"
                                                       for m in t.measure.split(";"))]  # fmt: skip
            lines += [f"- **Also looked up as:** {', '.join(t.aliases)}", ""]
    return "\n".join(lines).rstrip() + "\n"


if __name__ == "__main__":
    sys.stdout.write(render_markdown())

"""Glossary terms: training state, collectives and bandwidth."""

from __future__ import annotations

from parlab.glossary.term import G_COMM, G_STATE, Term

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
        formula="bytes per parameter per rank = P + G + O = 4 + 4 + 8 = 16 (fp32 weights and grads, AdamW's two fp32 moments); sent per rank per step = 2(n-1)/n x gradient bytes",
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
        formula="bytes per parameter per rank over N ranks: ZeRO-1 P + G + O/N, ZeRO-2 P + (G + O)/N, ZeRO-3 (P + G + O)/N (16/N under bf16-mixed AdamW)",
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
        formula="state per rank = (P + G + O)/N; per step it all-gathers the params twice (forward, backward) and reduce-scatters the grads",
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
        formula="ring: each rank sends and receives 2(n-1)/n x S bytes in 2(n-1) steps (a reduce-scatter, then an all-gather)",
    ),
    Term(
        name="algbw",
        aliases=("algorithm bandwidth", "algbw"),
        meaning="Size / time: the buffer size S a collective was called with divided by its "
        "time. Depends on the collective and n, so it cannot be compared with the link speed.",
        elsewhere="nccl-tests 'algbw'; many blogs call it just 'bandwidth'.",
        measure="parlab collectives (the algbw column)",
        group=G_COMM,
        formula="algbw = S / t (S: the buffer size as nccl-tests counts it, t: one call's time)",
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
        formula="busbw = algbw x factor: all-reduce 2(n-1)/n; all-gather, reduce-scatter, all-to-all (n-1)/n; broadcast, reduce, send/recv 1",
    ),
    Term(
        name="alpha-beta model",
        aliases=("alpha beta", "latency-bandwidth model", "hockney", "calibration"),
        meaning="t = alpha + S * beta per call: alpha the fixed latency, 1/beta the bandwidth. "
        "Below S ~ alpha/beta a call is latency-bound (its count matters, not its bytes).",
        elsewhere="Hockney model; NCCL's internal tuning model (per algorithm/protocol).",
        measure="parlab collectives --fit; parlab collectives --explain MODEL --layout ...",
        group=G_COMM,
        formula="t(S) = k_alpha x alpha + k_beta x S x beta (ring all-reduce: k_alpha = 2(n-1), k_beta = 2(n-1)/n); 1/beta is the bandwidth",
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
]

"""Glossary terms: serving, and parlab's own words (ledger, roofline, Pareto front, sync points)."""

from __future__ import annotations

from parlab.glossary.term import G_PARLAB, G_SERVE, Term

TERMS: list[Term] = [
    Term(
        name="TTFT",
        aliases=("time to first token",),
        meaning="Time from sending a request to receiving its first output token: queueing + "
        "prefill. The user-visible latency of a chat reply starting.",
        elsewhere="vLLM/SGLang benchmark_serving 'TTFT' (parlab uses the same definitions).",
        measure="parlab bench serve; parlab project serving",
        group=G_SERVE,
        formula="TTFT = queueing + prefill of the prompt",
    ),
    Term(
        name="TPOT",
        aliases=("time per output token",),
        meaning="(end-to-end latency - TTFT) / (output tokens - 1), per request: the decode "
        "speed a request saw, averaged over its tokens.",
        elsewhere="vLLM 'TPOT'; some papers say 'TBT' or 'per-token latency'.",
        measure="parlab bench serve",
        group=G_SERVE,
        formula="TPOT = (end-to-end latency - TTFT) / (output tokens - 1), per request",
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
        formula="goodput = requests per second that met every SLO",
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
    Term(
        name="KV cache",
        aliases=("kv-cache", "key-value cache", "kv bytes per token", "kv cache bytes"),
        meaning="The keys and values of every attention layer for every token a request has "
        "seen, kept on the replica so each decode step attends to them without recomputing "
        "them. It grows by one token per generated token and is what limits how many requests "
        "decode at once; grouped-query attention (fewer KV heads) shrinks it.",
        formula="KV bytes per token = 2 (K and V) x layers x KV heads x head dim x bytes; "
        "per request = that x (prompt + generated tokens); MLA caches kv_lora_rank + "
        "qk_rope_head_dim per token and layer instead",
        elsewhere="vLLM gpu_memory_utilization / KV blocks; SGLang mem_fraction_static; "
        "TensorRT-LLM kv_cache_free_gpu_mem_fraction.",
        measure="parlab models (layers, heads / kv); parlab serve kv-transfer "
        "(metrics.kv_bytes_per_token)",
        group=G_SERVE,
    ),
    Term(
        name="prefill and decode",
        aliases=(
            "prefill",
            "decode",
            "prefill/decode",
            "pd disaggregation",
            "prefill-decode split",
        ),
        meaning="The two phases of answering a request. Prefill runs the whole prompt through "
        "the model in one pass (compute-bound, long matmuls) and writes its KV cache; decode then "
        "produces one token per step for every running request (memory-bound: each step reads "
        "the weights and the caches for a few tokens). Prefill sets TTFT, decode TPOT; "
        "disaggregated serving runs them on different replicas and ships the KV cache between.",
        formula="TTFT ~ queueing + prefill(prompt tokens); TPOT ~ one decode step at the running "
        "batch; KV transfer ~ base + KV bytes per token x prompt tokens / bandwidth",
        elsewhere="vLLM chunked prefill; DistServe and Mooncake (disaggregated prefill/decode); "
        "SGLang PD disaggregation.",
        measure="parlab bench serve; parlab serve sim --prefill-replicas 1; parlab serve "
        "kv-transfer",
        group=G_SERVE,
    ),
    Term(
        name="continuous batching",
        aliases=("iteration-level scheduling", "in-flight batching", "dynamic batching"),
        meaning="The replica admits waiting requests into the running batch at every decode "
        "step and retires finished ones, instead of running a fixed batch to completion "
        "(static batching). Short answers do not wait for long ones, so throughput rises with "
        "the batch while each request's TPOT grows only as the step gets longer.",
        formula="output tokens/s ~ running requests / decode step time; running requests <= "
        "KV slots (--max-batch)",
        elsewhere="Orca's iteration-level scheduling; vLLM max_num_seqs; TensorRT-LLM in-flight "
        "batching; TGI max_batch_total_tokens.",
        measure="parlab serve replica --max-batch 16; parlab bench serve "
        "(metrics.replica_decode_batch_mean)",
        group=G_SERVE,
    ),
    Term(
        name="paged attention",
        aliases=("pagedattention", "kv blocks", "block table", "prefix cache", "radix cache"),
        meaning="The KV cache stored in fixed-size blocks with a block table per sequence, so "
        "memory is taken as a sequence grows (no reservation of the longest length) and requests "
        "with a common prompt prefix can share its blocks. parlab's reference replica keeps one "
        "KV slot per running request and caches prompt prefixes in 16-token blocks, the block "
        "reuse that prefix caching builds on.",
        formula="blocks per sequence = ceil(tokens / block size); KV memory = blocks x block size "
        "x KV bytes per token; a prefix hit skips the prefill of its cached blocks",
        elsewhere="vLLM PagedAttention (block_size 16) and automatic prefix caching; SGLang "
        "RadixAttention; TensorRT-LLM paged KV cache.",
        measure="parlab serve replica --cache-blocks 4096; parlab bench serve "
        "(metrics.cache_hit_rate)",
        group=G_SERVE,
    ),
    Term(
        name="ledger",
        aliases=("memory ledger", "state ledger", "parlab ledger"),
        meaning="parlab's account of one layout's memory on each rank: named items (params, "
        "grads, optimizer, master copy, activations, logits, buffers, temporaries, overhead), "
        "each with the formula that sizes it, per pipeline stage, and the peak, the largest sum "
        "alive at one phase (forward-backward, end of backward, optimizer step). Training runs "
        "record the ledger's prediction before they start, so the measured peak can be set "
        "against it.",
        formula="peak = max over phases of the items alive in it; states per parameter: 16 B "
        "under DDP (bf16-mixed AdamW), divided by N as ZeRO shards them; activations = "
        "micro-batches in flight x layers x bytes per token per layer x tokens",
        elsewhere="DeepSpeed estimate_zero3_model_states_mem_needs and accelerate estimate-memory "
        "(states only); PyTorch's memory snapshot (measured, not predicted).",
        measure="parlab ledger 1.3b --strategy zero3 --dp 2 --seq 4096 --micro-batch 2; parlab fit",
        group=G_PARLAB,
    ),
    Term(
        name="roofline",
        aliases=("roofline model", "arithmetic intensity", "--roofline"),
        meaning="A time bound from the two resources work needs: its FLOPs at the GPU's peak "
        "FLOP/s, and its bytes at the memory bandwidth; whichever takes longer bounds it. parlab "
        "fits a roofline of GEMMs, attention and memory-bound work on measured training runs "
        "(--roofline RESULTS) and uses it to predict a step before it runs.",
        formula="t >= max(FLOPs / peak FLOP/s, bytes / memory bandwidth); arithmetic intensity = "
        "FLOPs / bytes, compute-bound above peak FLOP/s / bandwidth",
        elsewhere="Williams et al., 'Roofline' (2009); Nsight Compute's roofline chart.",
        measure="parlab plan --model 1.3b --gpus 2xH200 --gpus-per-node 2 --global-batch 4 "
        "--roofline results; parlab train --roofline results",
        group=G_PARLAB,
    ),
    Term(
        name="Pareto front",
        aliases=("pareto", "pareto frontier", "pareto optimal"),
        meaning="The layouts that no other layout beats on both throughput and peak memory: a "
        "layout off the front is slower and hungrier than one on it, so it is never the right "
        "choice; choosing among the front is choosing the memory headroom to pay for speed.",
        formula="A is dominated when some B has tokens/s(B) >= tokens/s(A) and peak(B) <= "
        "peak(A), one of them strictly; the front is every layout not dominated",
        elsewhere="",
        measure="parlab plan (rows marked *, and its Pareto front line)",
        group=G_PARLAB,
    ),
    Term(
        name="sync points",
        aliases=("sync point", "synchronisation points", "blocking collectives"),
        meaning="The places in a step where a rank must wait for others before it can go on: a "
        "blocking collective (TP's all-reduce between two matmuls, ZeRO-3's all-gather before a "
        "layer), a pipeline stage's receive, the optimizer step after the last gradient. Each "
        "one ties the step to the slowest rank; parlab counts them per step for each layout.",
        formula="sync points per step = calls per step of the wire table's blocking items "
        "(parlab.ledger.traffic)",
        elsewhere="Megatron and torchtitan do not name them; Nsight Systems shows them as NCCL "
        "kernels the compute stream waits on.",
        measure="parlab fit llama3.1-8b --gpus H100 (the sync points column); parlab ledger 1.3b "
        "--strategy zero3 --dp 2",
        group=G_PARLAB,
    ),
]

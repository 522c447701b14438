"""The ledger's compiled blocks (``norm_kernel="compiled"``) against what torch.compile keeps.

AOTAutograd's min-cut partition, as inductor runs it (its decompositions, ``compiler=
"inductor"``), decides which forward tensors a compiled block keeps for backward; that choice
does not depend on the device, so the forward graph's extra outputs on the CPU, storages counted
once, are the block's saved bytes. The ledger's terms must equal them per token for dense
SwiGLU blocks in the compute dtype (MHA and GQA); the blocks it does not model raise.
"""

from __future__ import annotations

import functools

import pytest
import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.partitioners import min_cut_rematerialization_partition
from torch._inductor.decomposition import select_decomp_table

from parlab.errors import UsageError
from parlab.ledger.activations import compiled_modelled, layer_bytes_per_token, layer_terms
from parlab.models import get_spec
from parlab.models.reference import TransformerBlock, rope_table

pytestmark = pytest.mark.timeout(300)


def compiled_saved_per_token(name: str, batch: int = 2, seq: int = 32) -> float:
    """Bytes per token the compiled block's forward hands to its backward (its input included;
    parameters, the RoPE table and the block's output left out)."""
    spec = get_spec(name)
    block = TransformerBlock(spec, 0).to(torch.bfloat16)
    rope = rope_table(torch.arange(seq), spec.d_head, spec.rope_theta)
    x = torch.randn(batch, seq, spec.hidden, dtype=torch.bfloat16, requires_grad=True)
    outs: list[torch.Tensor] = []

    def forward_compiler(gm: torch.fx.GraphModule, _: object) -> object:
        def run(*args: object) -> object:
            got = gm(*args)
            outs.extend(got)
            return got

        return run

    backend = aot_autograd(
        fw_compiler=forward_compiler,
        bw_compiler=lambda gm, _: gm,
        partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
        decompositions=select_decomp_table(),
    )
    torch._dynamo.reset()
    y = torch.compile(block, backend=backend, fullgraph=True)(x, rope)
    skip = {p.untyped_storage().data_ptr() for p in block.parameters()}
    skip |= {rope.untyped_storage().data_ptr(), y.untyped_storage().data_ptr()}
    seen: set[int] = set()
    total = 0
    for t in outs[1:]:  # the first output is the block's own
        if not isinstance(t, torch.Tensor):
            continue
        ptr = t.untyped_storage().data_ptr()
        if ptr in skip or ptr in seen:
            continue
        seen.add(ptr)
        total += t.untyped_storage().nbytes()
    return total / (batch * seq)


@pytest.mark.parametrize("name", ["tiny", "small"])
def test_compiled_terms_are_what_the_partition_keeps(name: str) -> None:
    spec = get_spec(name)
    terms = layer_terms(spec, 0, seq_len=32, r=2, e=2, autocast=False, norm_kernel="compiled")
    ledger = layer_bytes_per_token(terms, r=2, hidden=spec.hidden)
    assert compiled_saved_per_token(name) == pytest.approx(ledger)
    # the eager fused kernel keeps silu's output too: 2 bytes x f more per token
    fused = layer_terms(spec, 0, seq_len=32, r=2, e=2, autocast=False, norm_kernel="fused")
    assert layer_bytes_per_token(fused, r=2, hidden=spec.hidden) - ledger == 2 * spec.ffn_hidden


def test_blocks_the_compiled_terms_do_not_describe_raise() -> None:
    gpt2 = get_spec("gpt2-124m")  # GeLU
    assert not compiled_modelled(gpt2, 0, autocast=False)
    with pytest.raises(UsageError, match="SwiGLU blocks without autocast"):
        layer_terms(gpt2, 0, seq_len=32, r=2, e=2, autocast=False, norm_kernel="compiled")
    llama = get_spec("tiny")
    assert compiled_modelled(llama, 0, autocast=False)
    with pytest.raises(UsageError, match="autocast True"):
        layer_terms(llama, 0, seq_len=32, r=4, e=2, autocast=True, norm_kernel="compiled")


def test_under_a_dispatch_mode_a_compiled_function_runs_its_original_code() -> None:
    """Why a compiled model-internal run's metered step leaves parlab's comm meter (a dispatch
    mode) off: under it, torch.compile's graph is not called -- the step would run eager, and
    its peak would be the eager blocks' (as the runs before ``layout.metered_step`` did)."""
    from parlab.projects.model_internal import RunConfig, metered
    from parlab.runtime.comm_meter import CommMeter

    calls = []

    def backend(gm: torch.fx.GraphModule, _: object) -> object:
        def run(*args: object) -> object:
            calls.append(1)
            return gm(*args)

        return run

    torch._dynamo.reset()
    f = torch.compile(lambda x: torch.nn.functional.silu(x) * x, backend=backend)
    x = torch.randn(8)
    f(x)
    assert len(calls) == 1  # compiled, and its graph called
    with CommMeter():
        f(x)
    assert len(calls) == 1  # under the mode: the original code, not the graph
    meter = CommMeter()
    cfg = RunConfig(name="single-pp2-1f1b-compiled", model="tiny", nproc=1, compile=True)
    assert metered(meter, cfg) is not meter
    assert metered(meter, RunConfig(name="single-pp2-1f1b", model="tiny", nproc=1)) is meter

"""FLOPs per token and MFU."""

from __future__ import annotations

import pytest

from parlab.errors import UsageError
from parlab.hardware.catalog import peak_flops
from parlab.models import get_spec
from parlab.models.flops import (
    forward_flops_per_token,
    mfu,
    mfu_for,
    train_flops_per_token,
    training_flops_per_token,
)


def test_formula_6n_plus_attention() -> None:
    s = get_spec("1.3b")
    n = s.num_params() - s.vocab_size * s.hidden  # without the embedding table
    want = 6 * n + 12 * s.layers * s.heads * s.d_head * 4096
    assert training_flops_per_token(s, 4096) == want
    assert train_flops_per_token(s, seq=4096) == want
    assert forward_flops_per_token(s, 4096) == pytest.approx(want / 3)


def test_moe_counts_active_params_only() -> None:
    m = get_spec("mixtral-8x7b")
    dense_equiv = 6 * m.num_params(embedding=False)
    assert training_flops_per_token(m, 1) < dense_equiv / 3


def test_mfu_known_and_unknown() -> None:
    s = get_spec("1.3b")
    fpt = training_flops_per_token(s, 4096)
    value = mfu_for(s, seq_len=4096, tokens_per_s=2 * 47_000, gpus=2, gpu="NVIDIA H200")
    assert value == pytest.approx(47_000 * fpt / peak_flops("H200"))
    assert 0.4 < value < 0.6
    assert mfu_for(s, seq_len=4096, tokens_per_s=1e5, gpus=1, gpu="Tesla V100") is None
    assert mfu(1e5, fpt, 1, None) is None
    with pytest.raises(UsageError, match="seq_len"):
        training_flops_per_token(s, 0)

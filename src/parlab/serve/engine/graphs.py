"""The fixed inputs and outputs of a decode step at one batch bucket: what its CUDA graph
reads and writes.

A decode-only step of ``b`` sequences runs at the smallest bucket ``>= b``
(``EngineConfig.buckets``). Its inputs live at fixed addresses: one int64 and one float32
device buffer, laid out as ``StepInputs.pack`` lays out a step of ``bucket`` rows (the page
table at its full width), and a pinned host twin of each. ``fill`` writes a step into the
host twins -- first the padding template (token 0 at position 0 of the null page, one key,
greedy), then the ``b`` real rows -- and copies each to the device in one asynchronous copy
(the previous step's copy is done: its tokens were read back). The graph, where captured,
replays the forward and the greedy pick over those buffers; without one the same function
runs eagerly on them (CPU tests of the very inputs a graph reads).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from parlab.serve.engine.config import EngineConfig
from parlab.serve.engine.inputs import empty_decode, pad_decode


@dataclass
class StaticStep:
    """One bucket's buffers, layout and (where captured) graph."""

    bucket: int
    inp: Any
    """The padded template step (``runner.StepInputs``), whose layout the buffers follow."""
    where: dict[str, tuple[int, int]]
    host_ints: torch.Tensor
    """Pinned (on CUDA) host twins of the device buffers."""
    host_floats: torch.Tensor
    ints: torch.Tensor
    floats: torch.Tensor
    template_ints: np.ndarray
    template_floats: np.ndarray
    graph: Any = None
    tokens: torch.Tensor | None = None
    logits: torch.Tensor | None = None

    @classmethod
    def make(cls, cfg: EngineConfig, bucket: int, device: torch.device) -> StaticStep:
        inp = pad_decode(empty_decode(cfg), bucket)
        ints, floats, where = inp.pack()
        pin = device.type == "cuda"
        h_ints = torch.from_numpy(ints.copy())
        h_floats = torch.from_numpy(floats.copy())
        if pin:
            h_ints, h_floats = h_ints.pin_memory(), h_floats.pin_memory()
        return cls(
            bucket=bucket,
            inp=inp,
            where=where,
            host_ints=h_ints,
            host_floats=h_floats,
            ints=torch.from_numpy(ints).to(device),
            floats=torch.from_numpy(floats).to(device),
            template_ints=ints,
            template_floats=floats,
        )

    def fill(self, inp: Any) -> None:
        """Write the decode step ``inp`` (``n_decode <= bucket`` rows, its page table at full
        width) into the buffers."""
        B, M = inp.n_decode, inp.table.shape[1]
        hi, hf, w = self.host_ints.numpy(), self.host_floats.numpy(), self.where
        hi[:] = self.template_ints
        hf[:] = self.template_floats
        for name in ("tokens", "positions", "slots", "lens", "seed", "step", "eos_ok"):
            a = w[name][0]
            hi[a : a + B] = getattr(inp, name)
        a = w["table"][0]
        full = hi[a : a + self.bucket * M].reshape(self.bucket, M)
        full[:B] = inp.table
        hf[:B] = inp.temperature
        R = self.bucket
        hf[R : R + B] = inp.top_p
        self.ints.copy_(self.host_ints, non_blocking=True)
        self.floats.copy_(self.host_floats, non_blocking=True)

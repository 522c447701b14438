"""An idle engine's step costs, measured for the simulator (``sim.ReplicaProfile``).

``profile_engine`` runs short workloads through the engine itself (``Engine.generate``, no
HTTP) and fits the simulator's step model (``sim.PROFILE_TERMS``: per step, per admitted
request, per prompt token computed, per prompt token cached, per decoding request, per
context token) to the steps they logged, by non-negative least squares (``sim.fit_profile``):

- prefills: for each length of ``prefill_lens`` that fits, three prompts that cannot hit the
  prefix cache (each begins with its own two tokens) and, where they fit, three that hit the
  first one's pages (it plus ``hit_tokens`` new tokens), one output token each;
- decode: at each batch of ``batches`` (up to ``max_batch``), prompts of 32 and of
  ``long_prompt`` tokens, ``decode_steps`` tokens each -- decode steps at short and long
  contexts, so the per-context-token term is seen.

The first run of each workload is a warm-up and left out. The profile empties the prefix
cache (its prompts' pages would give a run free hits) and the engine's log. A few seconds
on a GPU, tens on the CPU with the tiny model.
"""

from __future__ import annotations

import itertools
from typing import Any

from parlab.errors import UsageError
from parlab.serve.engine import Engine
from parlab.serve.sim import fit_profile


def profile_engine(
    engine: Engine,
    *,
    prefill_lens: tuple[int, ...] = (32, 128, 512, 2048),
    hit_tokens: int = 64,
    batches: tuple[int, ...] = (1, 4, 8, 16, 32),
    long_prompt: int = 512,
    decode_steps: int = 6,
) -> dict[str, Any]:
    """The fitted step costs (``sim.PROFILE_TERMS``), the steps they rest on (``samples``)
    and the number of steps (``steps``)."""
    assert not engine.has_work(), "profile an idle engine"
    cfg = engine.config
    lens = [n for n in prefill_lens if n + 8 <= cfg.max_len]
    if not lens or cfg.max_len < 48:
        raise UsageError(
            f"profile: --max-len {cfg.max_len} leaves no room for its prompts (lengths "
            f"{prefill_lens} + 8, decode 32 + 8)"
        )
    words = engine.tokenizer.word_ids
    count = itertools.count()

    def fresh(n: int) -> list[int]:
        """``n`` tokens beginning with two no earlier prompt of the profile began with."""
        k = next(count)
        w = len(words)
        return [words[k // w % w], words[k % w], *([words[0]] * (n - 2))]

    steps: list[dict[str, float]] = []

    def run(prompts: list[list[int]], out: int, keep: bool) -> None:
        engine.log.clear()
        engine.generate(prompts, out, ignore_eos=True)
        if keep:
            steps.extend(engine.log)

    engine.reset_cache()
    try:
        for n in lens:
            first = fresh(n)
            for rep in range(3):
                run([first if rep == 0 else fresh(n)], 1, rep > 0)
            if n + hit_tokens + 8 <= cfg.max_len:
                for rep in range(3):
                    run([first + fresh(hit_tokens)], 1, rep > 0)
        plen = min(long_prompt, cfg.max_len - decode_steps - 2)
        for b in [b for b in batches if b <= cfg.max_batch]:
            for n in (32, plen):
                for rep in range(2):
                    run([fresh(n) for _ in range(b)], decode_steps, rep > 0)
    finally:
        engine.reset_cache()
    fit = fit_profile(steps)
    return {**fit, "steps": len(steps), "samples": steps}

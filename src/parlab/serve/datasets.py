"""Request datasets for the load generator and the simulator.

Three sources, all seeded and all producing ``SampleRequest`` lists:

- ``synthetic`` (vLLM's ``random`` dataset): prompts of random words, each word one token
  of parlab's tokenizer (``Tokenizer.words``), so a prompt of ``input_len`` words is exactly
  ``input_len`` tokens there (and for any engine serving that tokenizer, as the exported
  Hugging Face copy); lengths drawn uniformly within ``range_ratio`` of the given ones, as
  vLLM's ``--random-range-ratio``;
- ``shared_prefix``: groups of prompts sharing a long common system prompt
  followed by a short unique question, interleaved at random -- the workload
  where cache-aware routing matters (SGLang's ``generated-shared-prefix``);
- ``jsonl``: a local trace, one JSON object a line with ``prompt`` (or
  OpenAI chat ``messages``) and ``output_len`` (or ``max_tokens``), and an
  optional ``timestamp`` (seconds from the start). Bad lines are reported
  with their line numbers and skipped; the run goes on.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from parlab.errors import UsageError
from parlab.serve.tokenizer import get as get_tokenizer


@dataclass(frozen=True, kw_only=True)
class SampleRequest:
    """One request to send."""

    prompt: str
    """The prompt text (the user message for chat)."""
    prompt_len: int
    """Its length in parlab's tokenizer's tokens."""
    output_len: int
    """Tokens to generate (``max_tokens``)."""
    prefix_group: int | None = None
    """The shared-prefix group, where the dataset has groups."""
    prefix_len: int = 0
    """Length of the shared prefix, tokens."""
    timestamp: float | None = None
    """Arrival offset from the start, seconds (traces only)."""
    messages: list[dict[str, str]] | None = None
    """Chat messages as given by a trace (else built from ``prompt``)."""


@dataclass(frozen=True, kw_only=True)
class Dataset:
    """Requests plus what was wrong with the source."""

    name: str
    """``synthetic``, ``shared-prefix`` or ``jsonl:<path>``."""
    requests: list[SampleRequest]
    """The requests, in sending order."""
    params: dict[str, Any] = field(default_factory=dict)
    """How it was made (for the document's workload)."""
    bad_lines: list[tuple[int, str]] = field(default_factory=list)
    """``(line number, reason)`` for every line of a trace that was skipped."""


def _positive(name: str, value: int) -> None:
    if value < 1:
        raise UsageError(f"{name} {value} is below 1: give a positive number")


def synthetic(
    *, num_prompts: int, input_len: int, output_len: int, seed: int = 0, range_ratio: float = 0.0
) -> Dataset:
    """``num_prompts`` prompts of random words, ``input_len`` tokens each, asking for
    ``output_len`` (each drawn within ``range_ratio`` of it, as vLLM's random dataset)."""
    for name, v in (
        ("--num-prompts", num_prompts),
        ("--random-input-len", input_len),
        ("--random-output-len", output_len),
    ):
        _positive(name, v)
    if not 0 <= range_ratio < 1:
        raise UsageError(f"--random-range-ratio {range_ratio} must be in [0, 1)")
    rng = random.Random(seed)
    tok = get_tokenizer()

    def draw(n: int) -> int:
        return rng.randint(max(1, int(n * (1 - range_ratio))), int(n * (1 + range_ratio)))

    reqs = []
    for _ in range(num_prompts):
        n, out = draw(input_len), draw(output_len)
        reqs.append(SampleRequest(prompt=tok.words(rng, n), prompt_len=n, output_len=out))
    return Dataset(
        name="random",
        requests=reqs,
        params={
            "num_prompts": num_prompts,
            "input_len": input_len,
            "output_len": output_len,
            "range_ratio": range_ratio,
            "seed": seed,
        },
    )


def shared_prefix(
    *,
    num_groups: int,
    prompts_per_group: int,
    prefix_len: int,
    question_len: int,
    output_len: int,
    seed: int = 0,
) -> Dataset:
    """``num_groups`` system prompts of ``prefix_len`` tokens, each with
    ``prompts_per_group`` unique questions of ``question_len``; shuffled."""
    for name, v in (
        ("--num-groups", num_groups),
        ("--num-prompts / --num-groups", prompts_per_group),
        ("--prefix-len", prefix_len),
        ("--question-len", question_len),
        ("--output-len", output_len),
    ):
        _positive(name, v)
    rng = random.Random(seed)
    tok = get_tokenizer()
    reqs: list[SampleRequest] = []
    for g in range(num_groups):
        prefix = tok.words(rng, prefix_len)
        for _ in range(prompts_per_group):
            q = tok.words(rng, question_len)
            reqs.append(
                SampleRequest(
                    prompt=prefix + q,
                    prompt_len=prefix_len + question_len,
                    output_len=output_len,
                    prefix_group=g,
                    prefix_len=prefix_len,
                )
            )
    rng.shuffle(reqs)
    return Dataset(
        name="shared-prefix",
        requests=reqs,
        params={
            "num_groups": num_groups,
            "prompts_per_group": prompts_per_group,
            "prefix_len": prefix_len,
            "question_len": question_len,
            "output_len": output_len,
            "seed": seed,
        },
    )


def _parse_line(data: Any) -> SampleRequest:
    if not isinstance(data, dict):
        raise ValueError(f"a JSON {type(data).__name__}, not an object")
    messages = data.get("messages")
    prompt = data.get("prompt")
    if messages is not None:
        if not isinstance(messages, list) or not all(
            isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
        ):
            raise ValueError("'messages' must be a list of {role, content} objects")
        prompt = "\n".join(m["content"] for m in messages)
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("needs a non-empty string 'prompt' (or 'messages')")
    out = data.get("output_len", data.get("max_tokens"))
    if isinstance(out, bool) or not isinstance(out, int) or out < 1:
        raise ValueError("needs a positive integer 'output_len' (or 'max_tokens')")
    ts = data.get("timestamp")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0):
        raise ValueError("'timestamp' must be a number of seconds >= 0")
    plen = data.get("prompt_len")
    if not isinstance(plen, int) or isinstance(plen, bool) or plen < 1:
        plen = len(get_tokenizer().encode(prompt))
    return SampleRequest(
        prompt=prompt,
        prompt_len=plen,
        output_len=out,
        timestamp=float(ts) if ts is not None else None,
        messages=messages,
    )


def jsonl(path: str | Path, *, num_prompts: int | None = None) -> Dataset:
    """Read a JSONL trace; bad lines are listed (line number, reason) and skipped."""
    p = Path(path)
    try:
        lines = p.read_text(errors="replace").splitlines()
    except OSError as exc:
        raise UsageError(
            f"cannot read dataset {p}: {exc.strerror}: give an existing file"
        ) from None
    reqs: list[SampleRequest] = []
    bad: list[tuple[int, str]] = []
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            reqs.append(_parse_line(json.loads(line)))
        except json.JSONDecodeError as exc:
            bad.append((i, f"not JSON ({exc.msg})"))
        except ValueError as exc:
            bad.append((i, str(exc)))
        if num_prompts is not None and len(reqs) >= num_prompts:
            break
    if not reqs:
        raise UsageError(
            f"dataset {p} has no usable line ({len(bad)} bad): each line needs "
            "'prompt' and 'output_len'"
        )
    return Dataset(name=f"jsonl:{p}", requests=reqs, params={"path": str(p)}, bad_lines=bad)

"""From a parsed request to engine sequences, and from sampled ids back to text.

- ``prompt_ids``: each prompt's token ids (chat: the messages through the chat template),
  checked against the vocabulary and the context (``BadRequest`` names the field);
- ``Choice``: one choice's text as its tokens arrive -- detokenised a token at a time (every
  sampleable token is whole text, ``tokenizer.Tokenizer.sampleable``), ended by a ``stop``
  string as vLLM ends it (the text stops before the string; while streaming, the last
  ``len(longest stop) - 1`` characters are held back until they cannot begin one).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from parlab.serve.protocol import BadRequest, GenRequest
from parlab.serve.tokenizer import Tokenizer, render_chat


def prompt_ids(req: GenRequest, tok: Tokenizer, *, vocab: int, max_len: int) -> list[list[int]]:
    """Token ids of each prompt; ``BadRequest`` for an id outside the vocabulary or a prompt
    (plus ``max_tokens``) longer than the context."""
    if req.chat:
        prompts = [tok.encode(render_chat(req.messages))]
    else:
        prompts = []
        for p in req.prompts:
            ids = tok.encode(p) if isinstance(p, str) else list(p)
            if ids and max(ids) >= vocab:
                raise BadRequest(
                    f"'prompt' token id {max(ids)} is outside 0..{vocab - 1}", "prompt"
                )
            prompts.append(ids)
    for ids in prompts:
        if not ids:
            raise BadRequest("the prompt has no token", param="prompt")
        field_ = "messages" if req.chat else "prompt"
        if len(ids) >= max_len:
            raise BadRequest(
                f"the prompt is {len(ids)} tokens: the context is {max_len}, and at least one "
                "output token must fit",
                param=field_,
            )
        if req.max_tokens is not None and len(ids) + req.max_tokens > max_len:
            raise BadRequest(
                f"'max_tokens' {req.max_tokens} + the prompt's {len(ids)} tokens exceed the "
                f"context of {max_len} tokens: ask for at most {max_len - len(ids)}",
                param="max_tokens",
            )
    return prompts


@dataclass
class Choice:
    """One choice's text, built as its tokens arrive."""

    stop: tuple[str, ...] = ()
    text: str = ""
    sent: int = 0
    """Characters of ``text`` already handed out."""
    tokens: int = 0
    """Tokens received (the one that ended it included)."""
    finish_reason: str | None = None
    started: bool = False
    """A chunk of it was sent (chat: the role went with it)."""
    _hold: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        self._hold = max((len(s) for s in self.stop), default=1) - 1

    def add(self, piece: str, reason: str | None) -> str:
        """Take one token's text (``reason``: the engine ended the choice with it); return
        the text that may be handed out now."""
        self.tokens += 1
        start = max(0, len(self.text) - self._hold)
        self.text += piece
        cut = min((p for s in self.stop if (p := self.text.find(s, start)) >= 0), default=-1)
        if cut >= 0:
            self.text, reason = self.text[:cut], "stop"
        if reason is not None:
            self.finish_reason = reason
            upto = len(self.text)
        else:
            upto = max(self.sent, len(self.text) - self._hold)
        out, self.sent = self.text[self.sent : upto], upto
        return out

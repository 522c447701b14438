"""parlab's tokenizer: byte-level BPE trained with Hugging Face ``tokenizers`` on text parlab
generates itself (nothing is downloaded).

- ``corpus()``: the seeded training text (sentences of ``WORDS``, random lowercase text,
  numbers, chat turns);
- ``train()``: byte-level BPE (GPT-2's pre-tokenizer and byte alphabet) of ``VOCAB_SIZE``
  tokens, ``SPECIAL`` first; shipped as ``tokenizer.json`` beside this file, which a test
  keeps equal to a fresh ``train()``;
- ``Tokenizer``: encode/decode, the stop ids (``<|endoftext|>``, ``<|end|>``), the ids a
  sampler may pick (``sampleable``: each whole printable text) and the one-token words
  prompts of exact token lengths are built from (``word_ids``);
- ``export_hf(dir)``: a Hugging Face tokenizer folder (the chat template in Jinja), for
  ``transformers`` and vLLM's and SGLang's clients (``--tokenizer DIR``).

Chat template (``render_chat``), one turn per message, then the assistant's header::

    <|user|>\\nWhat is NCCL?<|end|>\\n<|assistant|>\\n
"""

from __future__ import annotations

import functools
import json
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

VOCAB_SIZE = 1024
"""Tokens in all, special tokens included."""
EOS = "<|endoftext|>"
END = "<|end|>"
ROLES = ("system", "user", "assistant")
"""Chat roles the template knows (``developer`` is read as ``system``)."""
SPECIAL = (EOS, END, *(f"<|{r}|>" for r in ROLES))
"""Special tokens, ids 0..4."""
PATH = Path(__file__).with_name("tokenizer.json")
"""The trained tokenizer shipped with parlab."""

_WORDS = (
    "the of and to in is it that for on with as was be by this are at from or an have not "
    "which one all but they had were we can there their has more when will been if so what "
    "about up out would into than some could time them other these two may then do its "
    "first any only new like also over such after most very where through between each "
    "just many those how because both should while under every same long own last being "
    "here well back still even before much never again might part world system model layer "
    "tensor rank node memory bandwidth latency token request replica router cache block "
    "batch prefill decode kernel stream graph device host copy send receive reduce gather "
    "scatter shard split parallel pipeline expert queue step iteration throughput schedule "
    "policy load prefix value key query head attention weight gradient state optimizer "
    "training serving engine page table free list hash prompt output input length number "
    "size data text word line"
)
WORDS = tuple(_WORDS.split())
"""Words the corpus writes sentences with."""
_LETTERS = "abcdefghijklmnopqrstuvwxyz     "


def corpus(seed: int = 0, lines: int = 6000) -> list[str]:
    """The training text, one string per line, from a seeded generator."""
    rng = random.Random(seed)
    out: list[str] = []
    for i in range(lines):
        kind = i % 4
        if kind == 0:  # a sentence of words
            words = rng.choices(WORDS, k=rng.randint(6, 24))
            out.append(" ".join(words).capitalize() + rng.choice(".?!,;:"))
        elif kind == 1:  # the load generator's random text (datasets._text)
            out.append("".join(rng.choices(_LETTERS, k=rng.randint(40, 160))))
        elif kind == 2:  # numbers and symbols
            nums = [str(rng.randint(0, 10 ** rng.randint(1, 6))) for _ in range(rng.randint(3, 9))]
            out.append(" ".join(nums) + rng.choice([" ms", " GB/s", " %", " tokens", ""]))
        else:  # a chat exchange
            q = " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))
            a = " ".join(rng.choices(WORDS, k=rng.randint(4, 12)))
            out.append(render_chat([{"role": "user", "content": q}]) + a + END)
    return out


def train(vocab_size: int = VOCAB_SIZE, seed: int = 0) -> Any:
    """A byte-level BPE ``tokenizers.Tokenizer`` of ``vocab_size`` tokens trained on
    ``corpus(seed)`` (deterministic)."""
    from tokenizers import Tokenizer as HFTokenizer  # lazy: tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers  # lazy: tokenizers

    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=2,
        special_tokens=list(SPECIAL),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(corpus(seed), trainer=trainer)
    return tok


def render_chat(messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
    """The chat template: ``<|role|>\\ncontent<|end|>\\n`` per message, then the assistant's
    header. ``messages``: ``{"role", "content"}`` with string content and a role of
    ``ROLES`` (``developer`` taken as ``system``)."""
    parts = []
    for m in messages:
        role = "system" if m["role"] == "developer" else m["role"]
        parts.append(f"<|{role}|>\n{m['content']}{END}\n")
    if add_generation_prompt:
        parts.append("<|assistant|>\n")
    return "".join(parts)


CHAT_TEMPLATE_JINJA = (
    "{% for m in messages %}{% set role = 'system' if m['role'] == 'developer' else m['role'] %}"
    "{{ '<|' + role + '|>\\n' }}"
    "{% if m['content'] is string %}{{ m['content'] }}"
    "{% else %}{% for p in m['content'] %}{{ p['text'] }}{% endfor %}{% endif %}"
    "{{ '<|end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\\n' }}{% endif %}"
)
"""``render_chat`` in Jinja, for the Hugging Face export."""


class Tokenizer:
    """parlab's tokenizer (the shipped ``tokenizer.json``)."""

    def __init__(self, hf: Any) -> None:
        self.hf = hf
        self.vocab_size: int = hf.get_vocab_size()
        self.eos_id: int = hf.token_to_id(EOS)
        self.end_id: int = hf.token_to_id(END)
        self.stop_ids: tuple[int, ...] = (self.eos_id, self.end_id)
        """What ends a generation unless ``ignore_eos``."""
        pieces = [hf.decode([i], skip_special_tokens=False) for i in range(self.vocab_size)]
        self.pieces: list[str] = pieces
        """Each id's text on its own (special tokens as their names)."""
        special = set(range(len(SPECIAL)))
        self.sampleable: list[int] = [
            i
            for i, p in enumerate(pieces)
            if i not in special and p and "\ufffd" not in p and (p.isprintable() or p == "\n")
        ]
        """Ids a sampler may pick besides the stop ids: whole, printable text each."""
        self.word_ids: list[int] = [
            i
            for i in self.sampleable
            if len(p := pieces[i]) > 2
            and p[0] == " "
            and p[1:].isalpha()
            and p[1:].isascii()
            and hf.encode(p).ids == [i]
        ]
        """Ids of one-token words (`` abc``): a text of ``n`` of them is ``n`` tokens (the
        pre-tokenizer cuts before every space, so no merge crosses two words)."""

    def encode(self, text: str) -> list[int]:
        """Token ids of ``text`` (special-token names in it are read as those tokens)."""
        return self.hf.encode(text).ids

    def decode(self, ids: Sequence[int]) -> str:
        """The text of ``ids``; special tokens are left out."""
        return self.hf.decode(list(ids), skip_special_tokens=True)

    def piece(self, i: int) -> str:
        """The text one output token adds (special tokens add none)."""
        return "" if i < len(SPECIAL) else self.pieces[i]

    def words(self, rng: random.Random, n: int) -> str:
        """``n`` random one-token words: a text of exactly ``n`` tokens."""
        return "".join(self.pieces[i] for i in rng.choices(self.word_ids, k=n))


@functools.cache
def get() -> Tokenizer:
    """The shipped tokenizer (loaded once per process)."""
    from tokenizers import Tokenizer as HFTokenizer  # lazy: tokenizers

    return Tokenizer(HFTokenizer.from_file(str(PATH)))


def export_hf(folder: str | Path) -> Path:
    """Write the tokenizer as a Hugging Face tokenizer folder; return it."""
    d = Path(folder)
    d.mkdir(parents=True, exist_ok=True)
    (d / "tokenizer.json").write_text(PATH.read_text())
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": None,
        "eos_token": END,
        "unk_token": None,
        "pad_token": EOS,
        "model_max_length": 1 << 20,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE_JINJA,
        "additional_special_tokens": [t for t in SPECIAL if t not in (EOS, END)],
    }
    (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2))
    (d / "special_tokens_map.json").write_text(json.dumps({"eos_token": END, "pad_token": EOS}))
    return d

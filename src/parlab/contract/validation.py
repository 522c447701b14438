"""The JSON Schema that ships with the package, and the check of a document against it (where
``jsonschema`` is installed), with a cache of the documents that passed it.

The cache: a file of the digests (BLAKE2b of the bytes) of documents that passed, one per line,
under ``$PARLAB_CACHE_DIR`` (default ``$XDG_CACHE_HOME/parlab``, else ``~/.cache/parlab``; ``off``
disables it), named by the digest of the schema and the ``jsonschema`` version. The same bytes
against the same schema give the same verdict, so a reader checks each file's bytes once: a
report rebuilt over 10,000 documents checks only the new ones (``benchmarks/report_speed.py``
times both). A document that fails is never cached.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from collections.abc import Mapping
from importlib import resources
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

SCHEMA_ID = "distributed-benchmark/v1"


def schema() -> dict[str, Any]:
    """The JSON Schema that ships with the package."""
    text = resources.files("parlab").joinpath("schema/distributed-benchmark-v1.schema.json")
    return json.loads(text.read_text())


@functools.cache
def _validator() -> Any:
    """The schema's validator, its own schema checked once (``jsonschema.validate`` checks it
    again on every call: 20 of the 22 s it took to read 457 documents); None without
    ``jsonschema``."""
    try:
        import jsonschema
    except ImportError:
        return None
    body = schema()
    cls = jsonschema.validators.validator_for(body)
    cls.check_schema(body)
    return cls(_inline_refs(body))


def _inline_refs(body: dict[str, Any]) -> dict[str, Any]:
    """The schema with each ``{"$ref": "#/$defs/name"}`` replaced by that definition (the
    shipped schema's references do not recurse): the same rules, checked without resolving a
    reference per metric (0.41 against 0.65 s for the committed documents)."""
    defs = body.get("$defs", {})

    def inline(x: Any, depth: int) -> Any:
        if depth > 16:
            raise ValueError("the schema's $refs recurse: they cannot be inlined")
        if isinstance(x, dict):
            ref = x.get("$ref")
            if len(x) == 1 and isinstance(ref, str) and ref.startswith("#/$defs/"):
                return inline(defs[ref.removeprefix("#/$defs/")], depth + 1)
            return {k: inline(v, depth) for k, v in x.items()}
        if isinstance(x, list):
            return [inline(v, depth) for v in x]
        return x

    return inline({k: v for k, v in body.items() if k != "$defs"}, 0)


def validate(data: Mapping[str, Any]) -> None:
    """Validate against the JSON Schema where ``jsonschema`` is installed.

    The dataclass invariants hold regardless; the GPU machines' image has no
    ``jsonschema``, and parlab must run there from the source tree.
    """
    validator = _validator()
    if validator is None:
        return
    from jsonschema.exceptions import best_match

    exc = best_match(validator.iter_errors(dict(data)))
    if exc is not None:  # the error jsonschema.validate would raise
        where = "/".join(str(p) for p in exc.absolute_path) or "<root>"
        raise ValueError(
            f"document fails the {SCHEMA_ID} schema at {where}: {exc.message}"
        ) from None


def _cache_file() -> Path | None:
    """Where the digests of documents that passed the schema live; None when disabled or
    without ``jsonschema``."""
    env = os.environ
    if _validator() is None:
        return None
    return _cache_path(env.get("PARLAB_CACHE_DIR"), env.get("XDG_CACHE_HOME"), env.get("HOME"))


@functools.lru_cache(maxsize=8)
def _cache_path(base: str | None, xdg: str | None, home: str | None) -> Path | None:
    """``_cache_file`` for these variables (worked out once per reader, not once per file)."""
    if base == "off":
        return None
    if not base:
        xdg = xdg or os.path.join(os.path.expanduser("~"), ".cache")
        base = os.path.join(xdg, "parlab")
    return Path(base) / f"schema-passed-{_schema_digest()}.txt"


@functools.cache
def _schema_digest() -> str:
    """The digest of the schema and the checker's version: a verdict holds for both."""
    try:
        checker = version("jsonschema")
    except PackageNotFoundError:
        checker = "?"
    text = json.dumps(schema(), sort_keys=True) + checker
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


@functools.cache
def _passed(where: Path | None) -> set[str]:
    """The digests already known to pass (read once per process and cache file)."""
    if where is None:
        return set()
    try:
        return {line for line in where.read_text().split() if len(line) == 32}
    except (OSError, UnicodeDecodeError):
        return set()


def validate_bytes(raw: bytes, data: Mapping[str, Any]) -> None:
    """``validate(data)``, where ``data`` was parsed from ``raw``, unless those bytes passed
    before; a pass is remembered in the cache file (best effort: a cache that cannot be
    written only costs the check again)."""
    where = _cache_file()
    if where is None:
        validate(data)
        return
    digest = hashlib.blake2b(raw, digest_size=16).hexdigest()
    passed = _passed(where)
    if digest in passed:
        return
    validate(data)
    passed.add(digest)
    try:
        where.parent.mkdir(parents=True, exist_ok=True)
        with open(where, "a") as f:  # one short line per append: writers cannot tear it
            f.write(digest + "\n")
    except OSError:
        pass

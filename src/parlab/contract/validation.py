"""The JSON Schema that ships with the package, and the check of a document against it, where
``jsonschema_rs`` (the ``jsonschema-rs`` package, a compiled validator) is installed. Without
it the dataclass invariants still hold: the GPU machines' image has no schema checker, and
parlab must run there from the source tree.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from importlib import resources
from typing import Any

SCHEMA_ID = "distributed-benchmark/v1"


def schema() -> dict[str, Any]:
    """The JSON Schema that ships with the package."""
    text = resources.files("parlab").joinpath("schema/distributed-benchmark-v1.schema.json")
    return json.loads(text.read_text())


@functools.cache
def _validator() -> Any:
    """The schema's validator, built once (``validator_for`` checks the schema against its
    meta-schema); None without ``jsonschema_rs`` (an optional dependency, so imported here)."""
    try:
        import jsonschema_rs  # lazy: jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(schema())


def validate(data: Mapping[str, Any]) -> None:
    """``ValueError`` naming the shallowest place where ``data`` fails the schema (where a
    schema checker is installed)."""
    validator = _validator()
    if validator is None:
        return
    errors = validator.iter_errors(dict(data))
    exc = min(errors, key=lambda e: len(e.instance_path), default=None)
    if exc is not None:
        where = "/".join(str(p) for p in exc.instance_path) or "<root>"
        raise ValueError(f"document fails the {SCHEMA_ID} schema at {where}: {exc.message}")

"""The JSON Schema that ships with the package, and the check of a document against it (where
``jsonschema`` is installed)."""

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
    return cls(body)


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

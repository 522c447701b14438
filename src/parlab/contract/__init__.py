"""The ``distributed-benchmark/v1`` contract: one JSON document per run.

Every command that measures, predicts or decides writes one ``Document``
through ``write_result``: it is checked (dataclass invariants always, the
shipped JSON Schema too where ``jsonschema_rs`` is installed), then written
atomically -- temp file in the same folder, fsync, rename -- under
``<results>/<project>/<run_id>.json``, so no half-written document can ever
exist. ``read_results`` reads a folder back, reporting foreign or corrupt
files by name and skipping them.

A metric's value may be ``None``: unknown, never guessed (an MFU on a GPU the
catalog does not know, say).

The document's dataclasses are in ``document``, the schema check in ``validation``,
writing in ``write``, reading a file or a folder back in ``read``; every name is
re-exported here.
"""

from __future__ import annotations

from parlab.contract.document import (
    EVIDENCE_LEVELS,
    FAILURE_KINDS,
    PROJECTS,
    ROLES,
    TASKS,
    Decision,
    Document,
    Failure,
    Metric,
    Prediction,
)
from parlab.contract.read import (
    HEADLINE_METRICS,
    MAX_DOCUMENT_BYTES,
    MAX_NESTING,
    NESTED_DEPTH,
    STALE_TEMP_S,
    Entry,
    NotADocument,
    Skipped,
    filter_entries,
    headline,
    read_document,
    read_results,
)
from parlab.contract.validation import (
    SCHEMA_ID,
    schema,
    validate,
)
from parlab.contract.write import (
    atomic_write_text,
    json_default,
    new_run_id,
    now_iso,
    write_document,
    write_result,
)

__all__ = [
    "EVIDENCE_LEVELS",
    "FAILURE_KINDS",
    "HEADLINE_METRICS",
    "MAX_DOCUMENT_BYTES",
    "MAX_NESTING",
    "NESTED_DEPTH",
    "PROJECTS",
    "ROLES",
    "SCHEMA_ID",
    "STALE_TEMP_S",
    "TASKS",
    "Decision",
    "Document",
    "Entry",
    "Failure",
    "Metric",
    "NotADocument",
    "Prediction",
    "Skipped",
    "atomic_write_text",
    "filter_entries",
    "headline",
    "json_default",
    "new_run_id",
    "now_iso",
    "read_document",
    "read_results",
    "schema",
    "validate",
    "write_document",
    "write_result",
]

"""Shared fixtures. The pytest process itself never joins a process group."""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import tempfile  # noqa: E402

# The schema cache of the readers (contract.validation) lives in a folder of this run, never
# in the user's home.
os.environ.setdefault("PARLAB_CACHE_DIR", tempfile.mkdtemp(prefix="parlab-test-cache-"))

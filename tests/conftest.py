"""Shared fixtures. The pytest process itself never joins a process group."""

from __future__ import annotations

import os
import tempfile

os.environ.setdefault("OMP_NUM_THREADS", "1")

# The schema cache of the readers (contract.validation) lives in a folder of this run, never
# in the user's home.
os.environ.setdefault("PARLAB_CACHE_DIR", tempfile.mkdtemp(prefix="parlab-test-cache-"))

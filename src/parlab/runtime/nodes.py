"""The nodes of one job: torchrun's multi-node flags, set once per command.

A command builds its ``Nodes`` from ``--nnodes``, ``--node-rank``, ``--rdzv-endpoint``,
``--rdzv-backend`` and ``--rdzv-id`` and runs inside ``on_nodes(nodes)``; every
``parlab.runtime.launch.launch`` inside it starts torchrun with them, so project code
never threads them by hand. Outside ``on_nodes`` a job is one node (``--standalone``).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from parlab.errors import UsageError

RDZV_BACKENDS = ("c10d", "static")
_ENDPOINT_RE = re.compile(r"^\[?([A-Za-z0-9._:-]+?)\]?:([0-9]{1,5})$")


@dataclass(frozen=True, kw_only=True)
class Nodes:
    """The nodes of one job (torchrun's multi-node flags)."""

    nnodes: int = 1
    """Nodes in the job (torchrun ``--nnodes``)."""
    node_rank: int | None = None
    """This node's rank (torchrun ``--node-rank``); required with more than one node."""
    rdzv_endpoint: str | None = None
    """``host:port`` every node joins (torchrun ``--rdzv-endpoint``)."""
    rdzv_backend: str = "c10d"
    """Rendezvous backend (torchrun ``--rdzv-backend``: ``c10d`` or ``static``)."""
    rdzv_id: str = "parlab"
    """Job id shared by all nodes (torchrun ``--rdzv-id``)."""

    def __post_init__(self) -> None:
        if self.nnodes < 1:
            raise UsageError(f"--nnodes {self.nnodes} is below 1: a job has at least one node")
        if self.rdzv_backend not in RDZV_BACKENDS:
            raise UsageError(
                f"--rdzv-backend {self.rdzv_backend!r} is not one of {', '.join(RDZV_BACKENDS)}"
            )
        if not re.fullmatch(r"[A-Za-z0-9._-]{1,64}", self.rdzv_id):
            raise UsageError(f"--rdzv-id {self.rdzv_id!r}: use letters, digits, '.', '_', '-'")
        if self.rdzv_endpoint is not None:
            m = _ENDPOINT_RE.match(self.rdzv_endpoint)
            if not m or not 1 <= int(m.group(2)) <= 65535:
                raise UsageError(
                    f"--rdzv-endpoint {self.rdzv_endpoint!r}: write HOST:PORT, port 1 to 65535"
                )
        if self.nnodes > 1:
            if not self.rdzv_endpoint:
                raise UsageError(
                    f"--nnodes {self.nnodes} needs --rdzv-endpoint HOST:PORT shared by all nodes"
                )
            if self.node_rank is None:
                raise UsageError(
                    f"--nnodes {self.nnodes} needs --node-rank R (0 to {self.nnodes - 1}) on "
                    "each node"
                )
        if self.node_rank is not None and not 0 <= self.node_rank < self.nnodes:
            raise UsageError(
                f"--node-rank {self.node_rank} is outside 0 to {self.nnodes - 1} (--nnodes "
                f"{self.nnodes})"
            )

    @property
    def multi(self) -> bool:
        return self.nnodes > 1 or self.rdzv_endpoint is not None

    def torchrun_args(self) -> list[str]:
        if not self.multi:
            return ["--standalone"]
        args = ["--nnodes", str(self.nnodes), "--rdzv-backend", self.rdzv_backend]
        args += ["--rdzv-endpoint", str(self.rdzv_endpoint), "--rdzv-id", self.rdzv_id]
        if self.node_rank is not None:
            args += ["--node-rank", str(self.node_rank)]
        return args

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


ONE_NODE = Nodes()
_NODES: contextvars.ContextVar[Nodes | None] = contextvars.ContextVar("parlab_nodes", default=None)


@contextlib.contextmanager
def on_nodes(nodes: Nodes) -> Iterator[Nodes]:
    """Every ``launch`` inside runs on ``nodes`` (unless its config names its own)."""
    token = _NODES.set(nodes)
    try:
        yield nodes
    finally:
        _NODES.reset(token)


def current_nodes() -> Nodes:
    """The nodes the running command launches on (one node unless ``on_nodes`` set them)."""
    return _NODES.get() or ONE_NODE

"""One (op, size) of the collectives sweep on one rank: its buffers, the op closure, its check.

``Case`` allocates the buffers an op needs, fills the inputs with exact patterns
(``parlab.comm.patterns``) and binds the op to a zero-argument closure, issued either through
torch's c10d API or through ``DirectComm`` (NCCL called directly). What crosses the wire is
only that op, on ``group``; the check compares the outputs with the exact expected values.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist

from parlab.comm import ops as O
from parlab.comm import patterns as P

if TYPE_CHECKING:
    from parlab.comm.nccl_direct import DirectComm


class Case:
    """Buffers, the op closure and its exact check, for one (op, size) on one rank."""

    def __init__(
        self,
        op: str,
        nbytes: int,
        dtype: torch.dtype,
        inplace: bool,
        group: Any,
        dev: Any,
        comm: DirectComm | None = None,
    ) -> None:
        """``comm``: issue the op through NCCL directly (``via="nccl"``) instead of c10d."""
        self.op = op
        n = dist.get_world_size(group)
        r = dist.get_rank(group)
        self.elem = torch.empty((), dtype=dtype).element_size()
        """Bytes per element."""
        self.nbytes = nbytes
        """The size S of the op (``parlab.comm.ops``' meaning), already rounded."""
        self.pattern = P.pattern_for(op, dtype, n)
        self.n, self.r, self.group = n, r, group
        self._empty = lambda k: torch.zeros(k, dtype=dtype, device=dev)
        self.checks: list[tuple[torch.Tensor, int, int]] = []
        """(tensor, pattern start, scale) triples that must hold after one op."""
        self.prepare: Callable[[], None]
        """Fills the inputs with the exact pattern."""
        self.fn: Callable[[], None]
        """Issues the collective once (what the timed loop repeats)."""
        self.input: torch.Tensor
        """This rank's input buffer (in-place ops: the same tensor as ``output``)."""
        self.output: torch.Tensor
        """This rank's result buffer."""
        builders: dict[str, Callable[[int, bool, DirectComm | None], None]] = {
            "all_reduce": self._all_reduce,
            "all_gather": self._all_gather,
            "reduce_scatter": self._reduce_scatter,
            "all_to_all": self._all_to_all,
            "all_to_all_uneven": self._all_to_all_uneven,
            "broadcast": self._broadcast,
            "reduce": self._reduce,
            "send_recv": self._send_recv,
        }
        if op not in builders:
            raise AssertionError(f"no case for {op}")
        builders[op](nbytes // self.elem, inplace, comm)

    def check(self) -> int | None:
        """Run the op once on fresh inputs; the number of wrong elements (None: not checkable)."""
        self.prepare()
        self.fn()
        if not self.pattern.exact:
            return None
        return sum(P.count_wrong(t, start, self.pattern, scale) for t, start, scale in self.checks)

    # --- one builder per op: buffers, fill, closure, checks (``total`` elements) -------------

    def _all_reduce(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        # torch's all_reduce is in place only (an out-of-place form would add a copy)
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        buf = self._empty(total)
        self.prepare = lambda: P.fill(buf, 0, pat, pat.rank_scale(r))
        self.fn = (
            comm.prepare("all_reduce", buf)
            if comm is not None
            else lambda: dist.all_reduce(buf, group=group)
        )
        self.input, self.output = buf, buf
        self.checks = [(buf, 0, pat.total_scale(n))]

    def _all_gather(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        c = total // n
        out = self._empty(total)
        inp = out.narrow(0, r * c, c) if inplace else self._empty(c)
        self.prepare = lambda: P.fill(inp, r * c, pat)
        self.fn = (
            comm.prepare("all_gather", out, inp)
            if comm is not None
            else lambda: dist.all_gather_into_tensor(out, inp, group=group)
        )
        self.input, self.output = inp, out
        self.checks = [(out, 0, 1)]

    def _reduce_scatter(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        c = total // n
        inp = self._empty(total)
        out = inp.narrow(0, r * c, c) if inplace else self._empty(c)
        self.prepare = lambda: P.fill(inp, 0, pat, pat.rank_scale(r))
        self.fn = (
            comm.prepare("reduce_scatter", out, inp)
            if comm is not None
            else lambda: dist.reduce_scatter_tensor(out, inp, group=group)
        )
        self.input, self.output = inp, out
        self.checks = [(out, r * c, pat.total_scale(n))]

    def _all_to_all(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        c = total // n
        inp, out = self._empty(total), self._empty(total)
        self.prepare = lambda: [
            P.fill(inp.narrow(0, j * c, c), (r * n + j) * c, pat) for j in range(n)
        ]
        self.fn = (
            comm.prepare("all_to_all", out, inp)
            if comm is not None
            else lambda: dist.all_to_all_single(out, inp, group=group)
        )
        self.input, self.output = inp, out
        self.checks = [(out.narrow(0, s * c, c), (s * n + r) * c, 1) for s in range(n)]

    def _all_to_all_uneven(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        base = O.uneven_base(self.nbytes, n, self.elem)
        send = O.uneven_splits(r, n, base)
        recv = [O.uneven_splits(s, n, base)[r] for s in range(n)]
        inp, out = self._empty(sum(send)), self._empty(sum(recv))
        cmax = base * n

        def prep() -> None:
            off = 0
            for j in range(n):
                P.fill(inp.narrow(0, off, send[j]), (r * n + j) * cmax, pat)
                off += send[j]

        self.prepare = prep
        self.fn = (
            comm.prepare("all_to_all", out, inp, recv, send)
            if comm is not None
            else lambda: dist.all_to_all_single(
                out, inp, output_split_sizes=recv, input_split_sizes=send, group=group
            )
        )
        self.input, self.output = inp, out
        offs = [sum(recv[:s]) for s in range(n)]
        self.checks = [(out.narrow(0, offs[s], recv[s]), (s * n + r) * cmax, 1) for s in range(n)]

    def _broadcast(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, r, group = self.pattern, self.r, self.group
        buf = self._empty(total)
        root = dist.get_global_rank(group, 0)
        self.prepare = lambda: P.fill(buf, 0, pat) if r == 0 else buf.zero_()
        self.fn = (
            comm.prepare("broadcast", buf, root=0)
            if comm is not None
            else lambda: dist.broadcast(buf, src=root, group=group)
        )
        self.input, self.output = buf, buf
        self.checks = [(buf, 0, 1)]

    def _reduce(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        buf = self._empty(total)
        root = dist.get_global_rank(group, 0)
        self.prepare = lambda: P.fill(buf, 0, pat, pat.rank_scale(r))
        self.fn = (
            comm.prepare("reduce", buf, root=0)
            if comm is not None
            else lambda: dist.reduce(buf, dst=root, group=group)
        )
        self.input, self.output = buf, buf
        self.checks = [(buf, 0, pat.total_scale(n))] if r == 0 else []

    def _send_recv(self, total: int, inplace: bool, comm: DirectComm | None) -> None:
        pat, n, r, group = self.pattern, self.n, self.r, self.group
        send, recv = self._empty(total), self._empty(total)
        nxt = dist.get_global_rank(group, (r + 1) % n)
        prv = dist.get_global_rank(group, (r - 1) % n)
        self.prepare = lambda: P.fill(send, r * total, pat)

        def sr() -> None:
            p2p = [
                dist.P2POp(dist.isend, send, nxt, group=group),
                dist.P2POp(dist.irecv, recv, prv, group=group),
            ]
            for w in dist.batch_isend_irecv(p2p):
                w.wait()

        self.fn = (
            comm.prepare("send_recv", send, (r + 1) % n, recv, (r - 1) % n)
            if comm is not None
            else sr
        )
        self.input, self.output = send, recv
        self.checks = [(recv, ((r - 1) % n) * total, 1)]

"""How the router streams one replica's answer back to its client: the replica's status and
headers (less the hop-by-hop ones, plus ``x-parlab-replica``), then its bytes as they come;
a failure after the stream began is an ``error`` chunk and the end of the stream."""

from __future__ import annotations

from aiohttp import web

from parlab.serve import httpc, protocol

_HOP_HEADERS = {
    "content-length",
    "transfer-encoding",
    "connection",
    "keep-alive",
    "content-encoding",
}


class ClientGone(Exception):
    """The downstream client disconnected (not the replica's fault)."""


class Relay:
    """The ``use`` callback of ``httpc.Client.post`` for one forwarded request: ``resp`` is
    the client's response once begun, ``status`` the replica's status."""

    def __init__(self, request: web.Request, replica_url: str) -> None:
        self.request = request
        self.replica_url = replica_url
        self.resp: web.StreamResponse | None = None
        self.status = 0

    async def __call__(self, up: httpc.Response) -> None:
        headers = {k: v for k, v in up.headers.items() if k not in _HOP_HEADERS}
        headers["x-parlab-replica"] = self.replica_url
        resp = web.StreamResponse(status=up.status, headers=headers)
        self.status = up.status
        try:
            await resp.prepare(self.request)
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone from exc
        self.resp = resp
        async for data in up.pieces():
            try:
                await resp.write(data)
            except (ConnectionError, RuntimeError) as exc:
                raise ClientGone from exc
        try:
            await resp.write_eof()
        except (ConnectionError, RuntimeError) as exc:
            raise ClientGone from exc

    async def fail(self, message: str) -> web.StreamResponse:
        """The client's answer when the replica failed: a 502, or, where the stream began,
        an ``error`` chunk that ends it (without ``[DONE]``)."""
        if self.resp is None:
            return protocol.error_response(message, status=502, kind="bad_gateway")
        try:
            await self.resp.write(protocol.error_chunk(message, kind="bad_gateway", code=502))
            await self.resp.write_eof()
        except (ConnectionError, RuntimeError):
            pass  # the client is gone too
        return self.resp

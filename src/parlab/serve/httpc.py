"""A lean HTTP/1.1 client over asyncio streams, for the load generator and the router.

``POST`` of a JSON body to ``http://host:port/path`` on keep-alive connections (at most
``max_connections``, idle ones reused LIFO); responses with ``Content-Length``,
``Transfer-Encoding: chunked`` or read-to-close, the body handed over as it arrives. A
connection the server closed while idle is found on first use and the request retried once
on a fresh one (nothing was processed); anything unexpected closes the connection instead of
returning it. It costs less CPU per streamed request than aiohttp, so the load generator's
timestamps stay close to the wire; ``https`` targets use aiohttp.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

_TIMEOUT = getattr(asyncio, "timeout", None)  # Python 3.11+


class HttpError(Exception):
    """The server's response could not be read as HTTP/1.1."""


class Response:
    """Status, headers (lower-case names) and the body, read incrementally."""

    __slots__ = ("_chunked", "_conn", "_left", "headers", "reusable", "status")

    def __init__(self, conn: Connection, status: int, headers: dict[str, str]) -> None:
        self._conn = conn
        self.status = status
        self.headers = headers
        te = headers.get("transfer-encoding", "").lower()
        self._chunked = "chunked" in te
        cl = headers.get("content-length")
        self._left = int(cl) if cl is not None and not self._chunked else None
        self.reusable = headers.get("connection", "").lower() != "close" and (
            self._chunked or self._left is not None
        )

    async def pieces(self):
        """The body as it arrives (``bytes`` pieces); complete when the iterator ends."""
        r = self._conn.reader
        if self._chunked:
            while True:
                size_line = await r.readuntil(b"\r\n")
                n = int(size_line.split(b";", 1)[0], 16)
                if n == 0:
                    while (await r.readuntil(b"\r\n")) != b"\r\n":
                        pass  # trailers
                    return
                data = await r.readexactly(n + 2)
                yield data[:-2]
        elif self._left is not None:
            while self._left > 0:
                data = await r.read(min(self._left, 1 << 16))
                if not data:
                    raise asyncio.IncompleteReadError(b"", self._left)
                self._left -= len(data)
                yield data
        else:
            while data := await r.read(1 << 16):
                yield data

    async def body(self) -> bytes:
        return b"".join([p async for p in self.pieces()])


class Connection:
    __slots__ = ("reader", "used", "writer")

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer, self.used = reader, writer, False

    def close(self) -> None:
        with contextlib.suppress(OSError, RuntimeError):
            self.writer.close()


class Client:
    """Keep-alive connections to one ``host:port``."""

    def __init__(self, host: str, port: int, *, max_connections: int = 256) -> None:
        self.host, self.port = host, port
        self._idle: list[Connection] = []
        self._sem = asyncio.Semaphore(max_connections)
        self._host_header = f"{host}:{port}".encode()

    async def _connect(self) -> Connection:
        reader, writer = await asyncio.open_connection(self.host, self.port, limit=1 << 20)
        return Connection(reader, writer)

    async def _exchange(self, conn: Connection, head: bytes, body: bytes) -> Response:
        conn.writer.write(head + body)
        raw = await conn.reader.readuntil(b"\r\n\r\n")
        lines = raw.decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
            raise HttpError(f"not an HTTP/1.1 status line: {lines[0][:60]!r}")
        headers: dict[str, str] = {}
        for ln in lines[1:]:
            if ln:
                k, _, v = ln.partition(":")
                headers[k.strip().lower()] = v.strip()
        return Response(conn, int(parts[1]), headers)

    async def post(
        self, path: str, body: bytes, use: Callable[[Response], object], timeout_s: float
    ) -> object:
        """POST ``body``; ``await use(response)`` reads it; returns what ``use`` returns."""
        head = (
            b"POST " + path.encode() + b" HTTP/1.1\r\nHost: " + self._host_header
            + b"\r\nContent-Type: application/json\r\nAccept: */*\r\nContent-Length: "
            + str(len(body)).encode() + b"\r\n\r\n"
        )  # fmt: skip
        async with self._sem:
            for attempt in (0, 1):
                conn = self._idle.pop() if self._idle else await self._connect()
                reused = conn.used
                got_head = ok = False
                try:
                    if _TIMEOUT is not None:
                        async with _TIMEOUT(timeout_s):
                            resp = await self._exchange(conn, head, body)
                            got_head = True
                            result = await use(resp)  # type: ignore[misc]
                    else:  # Python 3.10
                        resp = await asyncio.wait_for(self._exchange(conn, head, body), timeout_s)
                        got_head = True
                        result = await asyncio.wait_for(use(resp), timeout_s)  # type: ignore[arg-type]
                    ok = resp.reusable
                    return result
                except (asyncio.IncompleteReadError, ConnectionResetError, BrokenPipeError):
                    if reused and attempt == 0 and not got_head:
                        continue  # the server closed an idle connection: retry on a fresh one
                    raise
                finally:
                    if ok:
                        conn.used = True
                        self._idle.append(conn)
                    else:
                        conn.close()
        raise AssertionError("unreachable")

    async def close(self) -> None:
        for c in self._idle:
            c.close()
        self._idle.clear()

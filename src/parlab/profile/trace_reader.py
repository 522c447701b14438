"""Streaming reader for Chrome trace files (torch.profiler / Kineto output).

A rank's trace can be hundreds of megabytes; ``json.load`` would hold all of
it (several times its size) in memory. ``TraceScanner`` reads the file in
chunks (gzip or plain, told apart by the magic bytes) and decodes one value
at a time with ``json.JSONDecoder.raw_decode``: the top-level keys other than
``traceEvents`` (``distributedInfo``, ``baseTimeNanoseconds``, parlab's own
``parlab`` metadata, ...) land in ``meta``; the ``traceEvents`` array is
yielded one event object at a time, so memory stays at one chunk plus
whatever the caller keeps. A bare top-level array (the other Chrome trace
form) is read as the event list.

Bad files raise ``TraceFormatError`` (a ``ValueError``) naming the file and
what is wrong with it: not JSON, not a trace, truncated (the file ends inside
the event list), or corrupt at a byte offset.
"""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

CHUNK_CHARS = 4 * 1024 * 1024
_WS = re.compile(r"[ \t\n\r]*")


_EVENT_END = "\n  }"
_EVENT_START = "\n  {"
KINETO_CPU_OP_NOT_COMM = re.compile(
    r'\{\n    "ph": "X",(?: |\n    )"cat": "cpu_op",(?: |\n    )'
    r'"name": "(?!record_param_comms|c10d::|nccl:|gloo:)'
)
"""A Kineto-formatted CPU op that is not communication (GPU runs do not need them)."""


class TraceFormatError(ValueError):
    """A file that is not a readable Chrome trace; the message names the file."""


def _open_text(path: Path) -> TextIO:
    with open(path, "rb") as f:
        magic = f.read(2)
    raw: Any = gzip.open(path, "rb") if magic == b"\x1f\x8b" else open(path, "rb")  # noqa: SIM115
    return io.TextIOWrapper(raw, encoding="utf-8", errors="replace")


class TraceScanner:
    """One pass over a trace file: ``for event in scanner.events(): ...``; then ``scanner.meta``.

    ``meta`` holds the top-level keys seen so far: Kineto writes its metadata
    before ``traceEvents``, so it is complete once the first event is
    yielded; keys written after the events are added when the pass ends.
    """

    def __init__(self, path: str | Path, *, chunk_chars: int = CHUNK_CHARS) -> None:
        self.path = Path(path)
        self.meta: dict[str, Any] = {}
        self.chunk_chars = chunk_chars
        self.events_seen = 0
        self.saw_events = False
        self.skip: re.Pattern[str] | None = None
        """Events whose text starts with a match of this pattern are stepped over without
        decoding (set it while iterating; see ``KINETO_CPU_OP_NOT_COMM``)."""
        self.events_skipped = 0

    # -- buffer handling -------------------------------------------------
    def _fail(self, what: str) -> TraceFormatError:
        return TraceFormatError(f"{self.path}: {what}")

    def _more(self) -> bool:
        """Append one chunk; drop what was consumed. False at end of file."""
        try:
            chunk = self._f.read(self.chunk_chars)
        except (EOFError, OSError, gzip.BadGzipFile) as exc:
            raise self._fail(f"truncated or damaged compressed file ({exc})") from None
        if not chunk:
            self._eof = True
            return False
        self._consumed += self._pos
        self._buf = self._buf[self._pos :] + chunk
        self._pos = 0
        return True

    def _skip_ws(self) -> str:
        """Skip whitespace; return the next character ('' at end of file)."""
        while True:
            self._pos = _WS.match(self._buf, self._pos).end()  # type: ignore[union-attr]
            if self._pos < len(self._buf):
                return self._buf[self._pos]
            if not self._more():
                return ""

    def _value(self, where: str) -> Any:
        """Decode the JSON value at the cursor, reading more input as needed."""
        decode = self._decoder.raw_decode
        while True:
            try:
                value, end = decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._eof or not self._more():
                    if exc.pos >= len(self._buf) - 1 or "Unterminated" in exc.msg:
                        raise self._fail(
                            f"truncated: the file ends inside {where} "
                            f"(after {self.events_seen} events); the trace was not fully written"
                        ) from None
                    raise self._fail(
                        f"corrupt JSON in {where} at byte {self._consumed + exc.pos} ({exc.msg})"
                    ) from None
                continue
            if end >= len(self._buf) and not self._eof and self._more():
                continue  # a number may go on in the next chunk: decode again
            self._pos = end
            return value

    # -- the pass ----------------------------------------------------------
    def events(self) -> Iterator[dict[str, Any]]:
        """Yield every event of ``traceEvents``; fill ``meta`` with the other top-level keys."""
        try:
            self._f = _open_text(self.path)
        except OSError as exc:
            raise self._fail(f"cannot read ({exc.strerror or exc})") from None
        self._buf = ""
        self._pos = 0
        self._consumed = 0
        self._eof = False
        self._decoder = json.JSONDecoder(strict=False)
        try:
            first = self._skip_ws()
            if first == "[":
                self._pos += 1
                self.saw_events = True
                yield from self._array()
                return
            if first != "{":
                raise self._fail(
                    "not a Chrome trace (it does not start with '{' or '['): "
                    "expected torch.profiler output such as rank0.trace.json.gz"
                )
            self._pos += 1
            c = self._skip_ws()
            if c == "}":
                return
            while True:
                if c != '"':
                    raise self._fail(f"corrupt JSON at byte {self._consumed + self._pos}")
                key = self._value("a top-level key")
                if self._skip_ws() != ":":
                    raise self._fail(f"corrupt JSON after key {key!r}")
                self._pos += 1
                c = self._skip_ws()
                if key == "traceEvents" and c == "[":
                    self._pos += 1
                    self.saw_events = True
                    yield from self._array()
                else:
                    if c == "":
                        raise self._fail(f"truncated: the file ends at top-level key {key!r}")
                    self.meta[key] = self._value(f"top-level key {key!r}")
                c = self._skip_ws()
                if c == ",":
                    self._pos += 1
                    c = self._skip_ws()
                    continue
                if c == "}":
                    break
                if c == "":
                    raise self._fail("truncated: the file ends before the closing '}' of the trace")
                raise self._fail(f"corrupt JSON at byte {self._consumed + self._pos}")
        finally:
            self._f.close()
        if not self.saw_events:
            raise self._fail(
                "not a Chrome trace (no traceEvents list): expected torch.profiler output"
            )

    def _array(self) -> Iterator[dict[str, Any]]:
        c = self._skip_ws()
        if c == "]":
            self._pos += 1
            return
        ws = _WS.match
        scan = self._decoder.scan_once  # raw_decode without its costly error objects
        while True:
            # fast path: the whole event is in the buffer and followed by a delimiter
            buf = self._buf
            pos = ws(buf, self._pos).end()
            skip = self.skip
            if skip is not None and skip.match(buf, pos):
                # Kineto's layout: an event ends at the first newline + 2 spaces + '}'
                # (its args close at 4 spaces; strings hold no raw newlines)
                close = buf.find(_EVENT_END, pos)
                if close != -1 and buf.find(_EVENT_START, pos + 1, close) == -1:
                    end = ws(buf, close + len(_EVENT_END)).end()
                    if end < len(buf):
                        self.events_seen += 1
                        self.events_skipped += 1
                        d = buf[end]
                        self._pos = end + 1
                        if d == ",":
                            continue
                        if d == "]":
                            return
                        raise self._fail(
                            f"corrupt JSON in the traceEvents list at byte {self._consumed + end}"
                        )
            try:
                ev, end = scan(buf, pos)
                end = ws(buf, end).end()
                if end >= len(buf):
                    raise ValueError
            except (StopIteration, ValueError):
                if not self._skip_ws():
                    raise self._fail(
                        f"truncated: the file ends inside the traceEvents list "
                        f"(after {self.events_seen} events); the trace was not fully written"
                    ) from None
                ev = self._value("the traceEvents list")
                end = ws(self._buf, self._pos).end()
                if end >= len(self._buf):
                    self._pos = end
                    if not self._skip_ws():
                        raise self._fail(
                            f"truncated: the file ends inside the traceEvents list "
                            f"(after {self.events_seen + 1} events)"
                        ) from None
                    end = self._pos
                buf = self._buf
            self.events_seen += 1
            if isinstance(ev, dict):
                yield ev
            d = buf[end]
            self._pos = end + 1
            if d == ",":
                continue
            if d == "]":
                return
            raise self._fail(
                f"corrupt JSON in the traceEvents list at byte {self._consumed + end} "
                f"(expected ',' or ']', found {d!r})"
            )


def read_header(path: str | Path) -> dict[str, Any]:
    """The top-level metadata written before ``traceEvents`` (stops at the first event)."""
    scanner = TraceScanner(path, chunk_chars=256 * 1024)
    events = scanner.events()
    try:
        next(events)
    except StopIteration:
        pass
    finally:
        events.close()
    return scanner.meta

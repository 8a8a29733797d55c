"""A simulated worker's news line (GET /v1/news) read by a bare asyncio protocol: the same
request and the same bytes as the real worker's aiohttp client, but each chunk handled in one
callback, with no task woken per line. Thousands of simulated workers share one client
process's core, and reading their lines through aiohttp's streams cost most of it, which would
measure the client instead of the coordinator.

It speaks only what the coordinator sends on this route: one HTTP/1.1 response, chunked, each
chunk whole lines of JSON (a blank line is a keepalive)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 << 10
MAX_LINE_BYTES = 64 << 20


class NewsRefused(Exception):
    def __init__(self, status: int, body: str) -> None:
        super().__init__(f"HTTP {status}: {body[:300]}")
        self.status, self.body = status, body


class NewsLine(asyncio.Protocol):
    """One open line: `on_line(bytes)` for every line of JSON, `heard_at` at every chunk,
    `ended` resolved (with the error, or None) when the line closes."""

    def __init__(self, request: bytes, on_line: Callable[[bytes], None]) -> None:
        self.request, self.on_line = request, on_line
        self.buffer, self.line = bytearray(), bytearray()
        self.head_done, self.status = False, 0
        self.heard_at = time.monotonic()
        self.transport: asyncio.Transport | None = None
        self.opened: asyncio.Future = asyncio.get_running_loop().create_future()
        self.ended: asyncio.Future = asyncio.get_running_loop().create_future()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport
        transport.write(self.request)

    def data_received(self, data: bytes) -> None:
        self.heard_at = time.monotonic()
        self.buffer += data
        try:
            if not self.head_done:
                self._head()
            if self.head_done:
                self._chunks()
        except Exception as exc:  # noqa: BLE001  a malformed line ends it (the worker opens another)
            self._end(exc)

    def connection_lost(self, exc: Exception | None) -> None:
        self._end(exc or ConnectionResetError("news line closed"))

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()

    def _head(self) -> None:
        end = self.buffer.find(b"\r\n\r\n")
        if end < 0:
            if len(self.buffer) > MAX_HEAD_BYTES:
                raise ValueError("response head too long")
            return
        head, self.buffer = bytes(self.buffer[:end]), self.buffer[end + 4:]
        self.status = int(head.split(b" ", 2)[1])
        if self.status != 200:
            raise NewsRefused(self.status, self.buffer.decode(errors="replace"))
        if b"chunked" not in head.lower():
            raise ValueError("the news line is not chunked")
        self.head_done = True
        if not self.opened.done():
            self.opened.set_result(None)

    def _chunks(self) -> None:
        while True:
            size_end = self.buffer.find(b"\r\n")
            if size_end < 0:
                return
            size = int(self.buffer[:size_end].split(b";")[0], 16)
            if size == 0:
                raise ConnectionResetError("news line ended")
            if len(self.buffer) < size_end + 2 + size + 2:
                if size > MAX_LINE_BYTES:
                    raise ValueError("a news chunk over its cap")
                return
            self.line += self.buffer[size_end + 2:size_end + 2 + size]
            del self.buffer[:size_end + 2 + size + 2]
            *lines, rest = self.line.split(b"\n")
            self.line = bytearray(rest)
            for line in lines:
                if line.strip():
                    self.on_line(line)

    def _end(self, exc: BaseException | None) -> None:
        for future in (self.opened, self.ended):
            if not future.done():
                future.set_exception(exc) if exc is not None and future is self.opened else future.set_result(exc)
        self.close()


async def open_line(url: str, credential: str, source_ip: str, on_line: Callable[[bytes], None], *,
                    connect_timeout_s: float) -> NewsLine:
    """Connect and send the request; returns once the response head said 200 (NewsRefused for
    another status)."""
    parts = urlsplit(url)
    request = (f"GET /v1/news HTTP/1.1\r\nHost: {parts.netloc}\r\nAuthorization: Bearer {credential}\r\n"
               "Accept: application/x-ndjson\r\n\r\n").encode()
    loop = asyncio.get_running_loop()
    _, line = await asyncio.wait_for(loop.create_connection(lambda: NewsLine(request, on_line), parts.hostname,
                                                            parts.port, local_addr=(source_ip, 0)),
                                     timeout=connect_timeout_s)
    try:
        await asyncio.wait_for(asyncio.shield(line.opened), timeout=connect_timeout_s)
    except BaseException:
        line.close()
        raise
    return line

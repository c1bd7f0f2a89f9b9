"""Writing what an ``h2`` connection queued, the same way on both HTTP/2 sides of the gateway
(``http2.Http2Connection`` towards clients, ``upstream_h2`` towards backends)."""

from __future__ import annotations

from typing import Protocol

import h2.connection


class _Out(Protocol):
    def write(self, data: bytes) -> None: ...
    async def drain(self) -> None: ...
    def is_closing(self) -> bool: ...


class H2Output:
    """``flush`` (write and wait for room) and ``flush_soon`` (write, no wait) of ``h2``'s
    pending bytes to ``writer``; the subclass sets both."""

    h2: h2.connection.H2Connection
    writer: _Out

    async def flush(self) -> None:
        data = self.h2.data_to_send()
        if data:
            self.writer.write(data)
            await self.writer.drain()

    def flush_soon(self) -> None:
        data = self.h2.data_to_send()
        if data and not self.writer.is_closing():
            self.writer.write(data)

"""The HTTP/1.1 protocol `sidecar serve` runs: uvicorn's httptools protocol, keeping the request
target as sent, on a transport that sends an answer's head with its body. Imports nothing of
ours; exports `TargetKeepingHttpToolsProtocol`.

uvicorn's httptools protocol reduces an absolute-form target (`GET http://evil/v1/health`) to
its path, so the app cannot tell it from `GET /v1/health`; its h11 protocol passes the target
on in `raw_path`. This subclass does what h11 does: `raw_path` is the whole target when it is
not a path, and `SecurityMiddleware` refuses it (400) before anything else runs.

uvicorn writes an answer's status line and headers, then its body, as two writes: two system
calls and two TCP segments (the socket has `TCP_NODELAY`), for a client to read apart. Here
the head waits for the body's first part when that comes in the same turn of the event loop
(a JSON answer, an SSE stream's first event), so both go in one write; a head whose body comes
later (an SSE stream with nothing to send yet) goes out at the end of that turn
(`_HeadWithBody`).
"""

from __future__ import annotations

import asyncio
from typing import Any, cast

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_HEAD_START = b"HTTP/1.1 "
_HEAD_END = b"\r\n\r\n"


class TargetKeepingHttpToolsProtocol(HttpToolsProtocol):
    """`HttpToolsProtocol` whose `scope["raw_path"]` is the request target when that target is
    not origin-form (`/path`), on a `_HeadWithBody` transport."""

    def connection_made(  # type: ignore[override]
        self, transport: asyncio.Transport
    ) -> None:
        super().connection_made(cast(asyncio.Transport, _HeadWithBody(transport)))

    def on_headers_complete(self) -> None:
        target = self.url
        super().on_headers_complete()
        # The request's task is created above but runs later, on the loop: it sees this.
        if not target.startswith(b"/") and "raw_path" in self.scope:
            self.scope["raw_path"] = target


class _HeadWithBody:
    """A connection's transport whose writes of an answer's head (a status line through the
    blank line, as uvicorn writes it: one write) are held until the next write or the end of
    the event loop's turn, whichever comes first; every other write, and `close`, sends what is
    held first, so bytes never change order. A body part that merely looks like a head is held
    the same way and sent as surely, a turn later at the most."""

    __slots__ = ("_flush", "_held", "_transport")

    def __init__(self, transport: asyncio.Transport) -> None:
        self._transport = transport
        self._held: bytes | None = None
        self._flush: asyncio.Handle | None = None

    def write(self, data: bytes | bytearray | memoryview) -> None:
        held = self._held
        if held is not None:
            self._held = None
            self._unschedule()
            self._transport.write(held + data)
            return
        if data[:9] == _HEAD_START and data[-4:] == _HEAD_END:
            self._held = bytes(data)
            if self._flush is None:
                self._flush = asyncio.get_running_loop().call_soon(self._send_held)
            return
        self._transport.write(data)

    def _send_held(self) -> None:
        self._unschedule()
        held, self._held = self._held, None
        if held is not None and not self._transport.is_closing():
            self._transport.write(held)

    def _unschedule(self) -> None:
        """Nothing is held any more: the end of the turn has nothing to send."""
        if self._flush is not None:
            self._flush.cancel()  # (a no-op from within the callback itself)
            self._flush = None

    def is_closing(self) -> bool:
        return self._transport.is_closing()

    def close(self) -> None:
        self._send_held()
        self._transport.close()

    def write_eof(self) -> None:
        self._send_held()
        self._transport.write_eof()

    def abort(self) -> None:
        self._held = None
        self._transport.abort()

    def __getattr__(self, name: str) -> Any:  # everything else is the transport's own
        return getattr(self._transport, name)

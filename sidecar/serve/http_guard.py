"""Connection limits of `sidecar serve`, applied before a request reaches the app (and so
before authentication).

uvicorn times out only idle keep-alive connections between requests: a client that connects
and sends nothing, or sends half a request line, half the headers or half a body, holds its
connection (a descriptor) forever. About 1,000 of them exhausted the daemon's descriptors,
after which command tools could not start and new connections were reset. Here:

- at most `max_connections` open HTTP connections; one more is answered 503 and closed at
  once, before a byte of it is read;
- the request line and headers must arrive within `header_timeout` seconds of the
  connection (or of the first byte of a later request on it): else 408 and closed;
- the body must arrive within `body_timeout` seconds of the headers: else 408 (or a plain
  close when the app has begun its answer) and closed.

Defaults are below; `SIDECAR_HTTP_MAX_CONNECTIONS`, `SIDECAR_HTTP_HEADER_TIMEOUT` and
`SIDECAR_HTTP_BODY_TIMEOUT` override them (read when the daemon starts). Streams the daemon
sends (SSE, /mcp GET) are not limited: the timers end once the request is read.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Any

from sidecar.serve.http_protocol import TargetKeepingHttpToolsProtocol

DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    header_timeout: float = DEFAULT_HEADER_TIMEOUT
    body_timeout: float = DEFAULT_BODY_TIMEOUT

    @classmethod
    def from_env(cls) -> ConnectionLimits:
        """The defaults, overridden by `SIDECAR_HTTP_*`; a value that is not a positive
        number is a `ValueError` naming the variable."""
        return cls(
            max_connections=int(_positive("SIDECAR_HTTP_MAX_CONNECTIONS",
                                          DEFAULT_MAX_CONNECTIONS)),
            header_timeout=_positive("SIDECAR_HTTP_HEADER_TIMEOUT", DEFAULT_HEADER_TIMEOUT),
            body_timeout=_positive("SIDECAR_HTTP_BODY_TIMEOUT", DEFAULT_BODY_TIMEOUT),
        )


def _positive(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not value > 0:
        raise ValueError(f"{name} must be a positive number, got {raw!r}")
    return value


def guarded_protocol(limits: ConnectionLimits) -> type[TargetKeepingHttpToolsProtocol]:
    """The protocol class for `uvicorn.Config(http=...)` with `limits` applied."""

    class Guarded(GuardedHttpToolsProtocol):
        pass

    Guarded.limits = limits
    return Guarded


class GuardedHttpToolsProtocol(TargetKeepingHttpToolsProtocol):
    limits = ConnectionLimits()
    _deadline: asyncio.TimerHandle | None = None
    _refused = False

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self._refused = True
            self._reply(503, "too_many_connections",
                        f"the daemon serves at most {self.limits.max_connections} connections "
                        "at a time; retry later")
            return
        self._arm(self.limits.header_timeout, self._headers_late)

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        if self._deadline is None:  # a later request on a kept-alive connection
            self._arm(self.limits.header_timeout, self._headers_late)

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._arm(self.limits.body_timeout, self._body_late)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._disarm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)

    # --- timers -------------------------------------------------------------------------

    def _arm(self, seconds: float, callback: Any) -> None:
        self._disarm()
        self._deadline = self.loop.call_later(seconds, callback)

    def _disarm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None

    def _headers_late(self) -> None:
        self._deadline = None
        self._reply(408, "request_timeout", "the request line and headers did not arrive within "
                    f"{self.limits.header_timeout:g} s")

    def _body_late(self) -> None:
        self._deadline = None
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.transport.close()  # the app answers already: only the connection can end
            return
        if cycle is not None:  # the app reads a disconnect; what it sends is dropped
            cycle.disconnected = True
            cycle.message_event.set()
        self._reply(408, "request_timeout",
                    f"the request body did not arrive within {self.limits.body_timeout:g} s")

    def _reply(self, status: int, code: str, message: str) -> None:
        if self.transport.is_closing():
            return
        body = json.dumps({"error": {"code": code, "message": message}}).encode()
        reason = {408: b"Request Timeout", 503: b"Service Unavailable"}[status]
        self.transport.write(
            b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, reason, len(body)) + body
        )
        self.transport.close()

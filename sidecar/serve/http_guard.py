"""Connection limits of `sidecar serve`, applied before a request reaches the app (and so
before authentication): `ConnectionLimits` (what is limited, and the environment variables
that set it) and the uvicorn protocol that applies them (`guarded_protocol`,
`GuardedHttpToolsProtocol`). Why: README.md.

Imports `sidecar.serve.http_protocol` and `sidecar.serve.security`. Exports
`ConnectionLimits`, `guarded_protocol`, `GuardedHttpToolsProtocol` and the defaults
(`DEFAULT_MAX_CONNECTIONS`, `DEFAULT_HEADER_TIMEOUT`, `DEFAULT_BODY_TIMEOUT`,
`BUSY_FRACTION`, `BUSY_DIVISOR`).
"""

from __future__ import annotations

import asyncio
import enum
import itertools
import json
import os
from dataclasses import dataclass

from sidecar.serve.http_protocol import TargetKeepingHttpToolsProtocol
from sidecar.serve.security import ADMIT_KEY

DEFAULT_MAX_CONNECTIONS = 512
DEFAULT_HEADER_TIMEOUT = 10.0
DEFAULT_BODY_TIMEOUT = 60.0
BUSY_FRACTION = 0.75
BUSY_DIVISOR = 5


@dataclass(frozen=True, slots=True)
class ConnectionLimits:
    """What `sidecar serve` allows an HTTP connection:

    - at most `max_connections` open HTTP connections. One more makes room by evicting the
      connection that has waited longest without presenting a token: one that has sent no
      request yet, half a request line or headers, or the body of a request without an
      `Authorization` header. It is answered 503 `too_many_connections` (a kept-alive
      connection between requests is closed without an answer) and the newcomer is served.
      Only connections that hold a request being answered or presented a valid token remain:
      idle ones of clients whose token was valid go next, and when none is left the newcomer
      is answered 503 and closed at once, before a byte of it is read. A local process
      holding every slot without a token thus cannot keep out a client with one;
    - the request line and headers must arrive within `header_timeout` seconds of the
      connection (or of the first byte of a later request on it): else 408 and closed. Under
      pressure (at least `BUSY_FRACTION` of the slots open) the allowance of a connection
      armed then is `header_timeout / BUSY_DIVISOR`;
    - the body must arrive within `body_timeout` seconds of the headers: else 408 (or a plain
      close when the app has begun its answer) and closed.

    `SecurityMiddleware` tells the connection that its request presented a valid token
    (`sidecar.serve.security.ADMIT_KEY`). `SIDECAR_HTTP_MAX_CONNECTIONS`,
    `SIDECAR_HTTP_HEADER_TIMEOUT` and `SIDECAR_HTTP_BODY_TIMEOUT` override the defaults (read
    when the daemon starts). Streams the daemon sends (SSE, /mcp GET) are not limited: the
    timers end once the request is read."""

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

    @property
    def busy_at(self) -> int:
        """From this many open connections on, header allowances shrink."""
        return max(1, int(self.max_connections * BUSY_FRACTION))


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


class _Phase(enum.Enum):
    IDLE = "idle"  # no byte of a request yet (new, or kept alive between requests)
    HEADERS = "headers"  # the request line and headers are arriving
    BODY = "body"  # the body is arriving
    ANSWERING = "answering"  # the whole request is read; the app answers it


_EARLY = 0.001
"""A timer may fire this much before its time (uvloop counts milliseconds)."""

_ORDER = itertools.count()
"""Ticks ordering connections by age (loop times of connections made at once may be equal)."""


class GuardedHttpToolsProtocol(TargetKeepingHttpToolsProtocol):
    """The deadlines are lazy: arming one sets a time (the request line and headers, or the
    body, are due by then), and a connection's one timer, set for the earliest time a deadline
    may fall, looks when it fires and sets itself again for a deadline that moved later. A
    request on a kept-alive connection thus moves two numbers instead of creating and
    cancelling two timers (~7 µs a request on a 2-core VM, 2026-12-07)."""

    limits = ConnectionLimits()
    _due: float | None = None  # loop time by which the phase armed must have ended
    _due_body = False  # what is due then: the body (else the request line and headers)
    _due_seconds = 0.0  # the allowance armed (the 408's message names it)
    _timer: asyncio.TimerHandle | None = None
    _timer_at = 0.0
    _refused = False
    _phase = _Phase.IDLE
    _since = 0  # when it entered its phase (IDLE or HEADERS), in `_ORDER` ticks
    _served = False  # a request on it was answered
    _credentials = False  # the request being read carries an Authorization header
    _admitted = False  # a request on it presented a valid token

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._since = next(_ORDER)
        if len(self.connections) > self.limits.max_connections and not self._make_room():
            self._refused = True
            self._reply(503, "too_many_connections",
                        f"the daemon serves at most {self.limits.max_connections} connections "
                        "at a time and each holds a request or a client with a valid token; "
                        "retry later")
            return
        self._arm_headers()

    def data_received(self, data: bytes) -> None:
        if self._refused:
            return
        super().data_received(data)

    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._phase, self._since, self._credentials = _Phase.HEADERS, next(_ORDER), False
        if self._due is None:  # a later request on a kept-alive connection
            self._arm_headers()

    def on_headers_complete(self) -> None:
        super().on_headers_complete()
        self._phase = _Phase.BODY
        self._credentials = any(name == b"authorization" for name, _ in self.headers)
        self.scope[ADMIT_KEY] = self._admit  # type: ignore[literal-required]
        self._arm(self.limits.body_timeout, body=True)

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._phase = _Phase.ANSWERING
        self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._served, self._credentials = True, False
        if self._phase is _Phase.ANSWERING:
            self._phase, self._since = _Phase.IDLE, next(_ORDER)

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        super().connection_lost(exc)

    def _admit(self) -> None:
        self._admitted = True

    # --- making room --------------------------------------------------------------------

    def _make_room(self) -> bool:
        """Evict the connection longest without a token (see the module docstring); False
        when every other connection holds a request being answered or a valid token."""
        victim: GuardedHttpToolsProtocol | None = None
        for other in self.connections:
            if other is self or not isinstance(other, GuardedHttpToolsProtocol):
                continue
            if other._evictable() and (victim is None or other._rank() < victim._rank()):
                victim = other
        if victim is None:
            return False
        victim._evict()
        return True

    def _evictable(self) -> bool:
        if self._refused or self.transport.is_closing():
            return False
        if self._phase is _Phase.IDLE:
            return True
        return not self._admitted and (self._phase is _Phase.HEADERS or (
            self._phase is _Phase.BODY and not self._credentials))

    def _rank(self) -> tuple[bool, int]:
        return self._admitted, self._since

    def _evict(self) -> None:
        self._disarm()
        message = (f"the daemon serves at most {self.limits.max_connections} connections at a "
                   "time; this one had presented no token and made room for another")
        if self._phase is _Phase.BODY:
            self._end_request(503, "too_many_connections", message)
        elif self._phase is _Phase.IDLE and self._served:
            self.transport.close()  # between requests: an answer would answer the next one
        else:
            self._reply(503, "too_many_connections", message)

    # --- timers -------------------------------------------------------------------------

    def _arm_headers(self) -> None:
        seconds = self.limits.header_timeout
        if len(self.connections) >= self.limits.busy_at:
            seconds /= BUSY_DIVISOR
        self._arm(seconds, body=False)

    def _arm(self, seconds: float, *, body: bool) -> None:
        due = self.loop.time() + seconds
        self._due, self._due_body, self._due_seconds = due, body, seconds
        if self._timer is None or self._timer_at > due:
            if self._timer is not None:
                self._timer.cancel()
            self._timer, self._timer_at = self.loop.call_at(due, self._look), due

    def _disarm(self) -> None:
        self._due = None  # the timer, when it fires, finds nothing due

    def _look(self) -> None:
        """The timer fired: act on a deadline that has passed, wait for one that moved."""
        self._timer = None
        due = self._due
        if due is None:
            return
        if self.loop.time() + _EARLY < due:
            self._timer, self._timer_at = self.loop.call_at(due, self._look), due
            return
        self._due = None
        if self._due_body:
            self._body_late()
        else:
            self._headers_late(self._due_seconds)

    def _headers_late(self, seconds: float) -> None:
        busy = "" if seconds == self.limits.header_timeout else (
            f" (shortened from {self.limits.header_timeout:g} s: the daemon was near its "
            f"limit of {self.limits.max_connections} connections)")
        self._reply(408, "request_timeout", "the request line and headers did not arrive within "
                    f"{seconds:g} s{busy}")

    def _body_late(self) -> None:
        self._end_request(408, "request_timeout",
                          f"the request body did not arrive within {self.limits.body_timeout:g} s")

    def _end_request(self, status: int, code: str, message: str) -> None:
        """Answer the request being read `status` and close; when the app has begun its
        answer only the connection can end, and the app reads a disconnect (what it sends
        then is dropped)."""
        cycle = self.cycle
        if cycle is not None and cycle.response_started:
            self.transport.close()
            return
        if cycle is not None:
            cycle.disconnected = True
            cycle.message_event.set()
        self._reply(status, code, message)

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

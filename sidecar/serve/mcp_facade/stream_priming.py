"""SSE priming on /mcp (SEP-1699, MCP 2025-11-25 and later): every POST stream opens with an
event that has an id, empty data and `retry: RETRY_MS` (on the SDK's route every event has an
id), with no event kept in memory.

`PrimingIds` is the SDK session manager's event store in name only: it mints ids and stores
nothing. A `Last-Event-ID` reconnection of the standalone GET stream opens it again (a live
tail: what was sent while disconnected is lost); one of a request's stream gets an empty
stream that ends (nothing of a request's stream is kept). `install(manager)` sets it and
`RETRY_MS` on a session manager; `priming_event(scope)` is the fast path's (`http_fastpath`)
same first event (its own line ends), for a client of 2025-11-25 or later.

Imports the MCP SDK only. Exports `RETRY_MS`, `PrimingIds`, `install` and `priming_event`.
"""

from __future__ import annotations

import itertools
from typing import Any

from mcp.server.streamable_http import GET_STREAM_KEY, EventCallback, EventStore
from mcp_types import DEFAULT_NEGOTIATED_VERSION
from mcp_types.version import is_version_at_least

RETRY_MS = 1000
"""How long a client waits before reconnecting a dropped stream (the `retry:` field)."""
PRIMING_SINCE = "2025-11-25"
_GET_MARK = "g"
_COUNT = itertools.count(1)


def _next_id(mark: str = "") -> str:
    return f"{next(_COUNT)}{mark}"


class PrimingIds(EventStore):
    """Event ids without events (`install`)."""

    async def store_event(self, stream_id: str, message: Any) -> str:
        return _next_id(_GET_MARK if stream_id == GET_STREAM_KEY else "")

    async def replay_events_after(self, last_event_id: str,
                                  send_callback: EventCallback) -> str | None:
        return GET_STREAM_KEY if last_event_id.endswith(_GET_MARK) else None


def install(manager: Any) -> None:
    """`manager` (a `StreamableHTTPSessionManager`, before it runs) primes its SSE streams."""
    manager.event_store = PrimingIds()
    manager.retry_interval = RETRY_MS


def priming_event(headers: list[tuple[bytes, bytes]]) -> bytes:
    """The first event of a fast-path SSE stream for a request with `headers` (ASGI), as the
    SDK's path writes it; b"" for a client older than 2025-11-25."""
    version = next((value.decode("latin-1") for name, value in headers
                    if name == b"mcp-protocol-version"), DEFAULT_NEGOTIATED_VERSION)
    if not is_version_at_least(version, PRIMING_SINCE):
        return b""
    return f"id: {_next_id()}\ndata: \nretry: {RETRY_MS}\n\n".encode()

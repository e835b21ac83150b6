"""`max_result_bytes` and `max_listing_bytes` for responses over streamable HTTP.

The SDK bounds server-sent events (`max_sse_event_size`, set from `max_result_bytes`) but reads
a plain JSON response body whole, whatever its size, and parses every message it receives on
the event loop (pydantic's `validate_json`: about 0.08 s per MB). This transport wrapper counts
the bytes of every `application/json` response body and stops past `max_result_bytes` with a
`httpx2.StreamError`, which the SDK turns into an error for that one request: the call fails
`upstream` with a clear message and the connection stays usable.

The answer to a `tools/list` request (its JSON body, or every byte of its event stream) is
held to `max_listing_bytes` as well, as over stdio: past it the stream fails (an SSE stream
with an `httpx2.SSEError`, which the SDK reports for that request), so the SDK never parses a
listing larger than that, and the server's start-up fails with the same reason in health. A
listing request asks for an unencoded answer (`Accept-Encoding: identity`), so the bytes
counted are the bytes parsed.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import httpx2

_SNIFF_BYTES = 64 * 1024
"""A request body longer than this is not taken for a `tools/list` request."""


LISTING_REFUSAL = "the server's answer is "


def too_large(limit: int, key: str, size: int | None = None) -> str:
    """The reason a response is refused, as over stdio (`DirectRequests`)."""
    what = f"{size:,} bytes" if size is not None else f"more than {limit:,} bytes"
    return (f"{LISTING_REFUSAL}{what}, over this server's {key} ({limit:,} bytes); raise "
            f"{key} for this server to accept it")


class ResultTooLarge(httpx2.StreamError):
    def __init__(self, limit: int, key: str = "max_result_bytes", size: int | None = None) -> None:
        if key == "max_result_bytes":
            super().__init__(
                f"the response is larger than max_result_bytes ({limit:,} bytes); raise "
                "max_result_bytes for this server to accept it"
            )
        else:
            super().__init__(too_large(limit, key, size))


class ListingStreamTooLarge(httpx2.SSEError):
    """A `tools/list` event stream over `max_listing_bytes` (an `SSEError`, so that the SDK
    fails the request with this message rather than waiting for a reconnection)."""

    def __init__(self, limit: int) -> None:
        super().__init__(too_large(limit, "max_listing_bytes"))


class LimitedTransport(httpx2.AsyncBaseTransport):
    """Delegates to `inner`; JSON response bodies over `limit` bytes raise `ResultTooLarge`,
    and the answer to a `tools/list` request over `listing_limit` bytes fails its stream."""

    def __init__(
        self, inner: httpx2.AsyncBaseTransport, limit: int, listing_limit: int | None = None
    ) -> None:
        self._inner = inner
        self._limit = limit
        self._listing_limit = listing_limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        listing = self._listing_limit is not None and asks_for_listing(request)
        if listing:
            request.headers["Accept-Encoding"] = "identity"
        response = await self._inner.handle_async_request(request)
        content_type = response.headers.get("content-type", "").lower()
        json_body = content_type.startswith("application/json")
        if listing and self._listing_limit is not None and self._listing_limit < self._limit:
            declared = _declared_length(response)
            if json_body:
                response.stream = _LimitedStream(
                    response.stream, self._listing_limit, "max_listing_bytes", declared)
            elif content_type.startswith("text/event-stream"):
                response.stream = _LimitedStream(
                    response.stream, self._listing_limit, "max_listing_bytes", None, sse=True)
        elif json_body:
            response.stream = _LimitedStream(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


def asks_for_listing(request: httpx2.Request) -> bool:
    """Whether `request` is a JSON-RPC `tools/list` POST (a 2026-era request names its method
    in `Mcp-Method`; else its small JSON body does)."""
    if request.method != "POST":
        return False
    if request.headers.get("mcp-method") == "tools/list":
        return True
    try:
        body = request.content
    except httpx2.RequestNotRead:
        return False
    if len(body) > _SNIFF_BYTES or b"tools/list" not in body:
        return False
    try:
        value = json.loads(body)
    except ValueError:
        return False
    return isinstance(value, dict) and value.get("method") == "tools/list"


def _declared_length(response: httpx2.Response) -> int | None:
    raw = response.headers.get("content-length", "")
    return int(raw) if raw.isdigit() else None


class _LimitedStream(httpx2.AsyncByteStream):
    def __init__(
        self, inner: object, limit: int, key: str = "max_result_bytes",
        declared: int | None = None, *, sse: bool = False,
    ) -> None:
        assert isinstance(inner, httpx2.AsyncByteStream)
        self._inner = inner
        self._limit = limit
        self._key = key
        self._declared = declared
        self._sse = sse

    async def __aiter__(self) -> AsyncIterator[bytes]:
        if self._declared is not None and self._declared > self._limit:
            raise ResultTooLarge(self._limit, self._key, self._declared)  # refused unread
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                if self._sse:
                    raise ListingStreamTooLarge(self._limit)
                raise ResultTooLarge(self._limit, self._key)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()

"""`max_result_bytes` for JSON responses over streamable HTTP.

The SDK bounds server-sent events (`max_sse_event_size`, set from `max_result_bytes`) but reads
a plain JSON response body whole, whatever its size. This transport wrapper counts the bytes of
every `application/json` response body and stops past the limit with a `httpx2.StreamError`,
which the SDK turns into an error for that one request: the call fails `upstream` with a clear
message and the connection stays usable.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx2


class ResultTooLarge(httpx2.StreamError):
    def __init__(self, limit: int) -> None:
        super().__init__(
            f"the response is larger than max_result_bytes ({limit:,} bytes); raise "
            "max_result_bytes for this server to accept it"
        )


class LimitedTransport(httpx2.AsyncBaseTransport):
    """Delegates to `inner`; JSON response bodies over `limit` bytes raise `ResultTooLarge`."""

    def __init__(self, inner: httpx2.AsyncBaseTransport, limit: int) -> None:
        self._inner = inner
        self._limit = limit

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        response = await self._inner.handle_async_request(request)
        if response.headers.get("content-type", "").lower().startswith("application/json"):
            response.stream = _LimitedStream(response.stream, self._limit)
        return response

    async def aclose(self) -> None:
        await self._inner.aclose()


class _LimitedStream(httpx2.AsyncByteStream):
    def __init__(self, inner: object, limit: int) -> None:
        assert isinstance(inner, httpx2.AsyncByteStream)
        self._inner = inner
        self._limit = limit

    async def __aiter__(self) -> AsyncIterator[bytes]:
        seen = 0
        async for chunk in self._inner:
            seen += len(chunk)
            if seen > self._limit:
                raise ResultTooLarge(self._limit)
            yield chunk

    async def aclose(self) -> None:
        await self._inner.aclose()

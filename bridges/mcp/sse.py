"""The legacy HTTP+SSE transport (`type = "sse"`), with a configurable event size.

The SDK's `sse_client` caps one server-sent event at 1 MiB with no way to change it, so any
result over 1 MiB kills the session. This is the same protocol (GET an event stream, wait for
the `endpoint` event, POST each message there) with the cap taken from the server's
`max_result_bytes`. An event over the cap still has to end the connection (the stream cannot
be resynchronised), but the reason is recorded so the failed call can say so. An answer to a
`tools/list` request over `max_listing_bytes` is refused unparsed (`_Listings`): the request
fails with the reason stdio gives, and the connection carries on.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from urllib.parse import urljoin, urlsplit

import anyio
import anyio.abc
import httpx2
import mcp_types as types
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
from mcp.client._transport import TransportStreams
from mcp.shared.message import SessionMessage
from pydantic import ValidationError

from bridges.mcp.direct_requests import RESULT_TOO_LARGE
from bridges.mcp.framing import PARSE_OFF_LOOP_AT, OversizedLine
from bridges.mcp.http_limit import too_large
from bridges.mcp.http_parse import parse_off_loop
from bridges.mcp.transport_state import TransportState

log = logging.getLogger("bridges.mcp")

_SSE_HEADERS = {"Accept": "text/event-stream", "Cache-Control": "no-store"}


@asynccontextmanager
async def sse_transport(
    url: str,
    *,
    headers: Mapping[str, str],
    connect_timeout: float,
    read_timeout: float,
    max_event_size: int,
    state: TransportState,
    auth: httpx2.Auth | None = None,
    max_listing_size: int | None = None,
) -> AsyncIterator[TransportStreams]:
    timeout = httpx2.Timeout(connect_timeout, read=read_timeout)
    async with (
        httpx2.AsyncClient(headers=dict(headers), timeout=timeout, auth=auth) as client,
        client.stream("GET", url, headers=_SSE_HEADERS) as response,
    ):
        response.raise_for_status()
        events = httpx2.EventSource(response, max_event_size=max_event_size)
        read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
        write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
        async with read_writer, read_stream, write_stream, write_reader:
            async with anyio.create_task_group() as tg:
                listings = _Listings(max_listing_size)
                endpoint = await tg.start(_read_events, url, events, read_writer, state, listings)
                tg.start_soon(_post_messages, client, endpoint, write_reader, read_writer,
                              listings)
                try:
                    yield read_stream, write_stream
                finally:
                    tg.cancel_scope.cancel()


async def _read_events(
    url: str,
    events: httpx2.EventSource,
    out: MemoryObjectSendStream[SessionMessage | Exception],
    state: TransportState,
    listings: _Listings,
    *,
    task_status: anyio.abc.TaskStatus[str],
) -> None:
    started = False
    try:
        async for sse in events:
            if sse.event == "endpoint" and not started:
                endpoint = urljoin(url, sse.data)
                if urlsplit(endpoint)[:2] != urlsplit(url)[:2]:
                    raise ValueError(f"the server named an endpoint on another origin: {endpoint}")
                started = True
                task_status.started(endpoint)
            elif sse.event == "message" and sse.data:
                message: SessionMessage | Exception | None = listings.refusal(sse.data)
                if message is None:
                    message = listings.seen(
                        await _parse_large(sse.data) if len(sse.data) >= PARSE_OFF_LOOP_AT
                        else _parse(sse.data))
                await out.send(message)
    except httpx2.SSEError as exc:
        state.closing_reason = f"{exc} (max_result_bytes); raise max_result_bytes to accept it"
        log.warning("SSE stream from %s ended: %s", urlsplit(url).netloc, state.closing_reason)
    except (httpx2.HTTPError, anyio.BrokenResourceError, anyio.ClosedResourceError) as exc:
        state.closing_reason = f"the event stream failed: {type(exc).__name__}"
    finally:
        out.close()
    if not started:
        raise ConnectionError(
            state.closing_reason or "the event stream ended before an endpoint event"
        )


async def _parse_large(data: str) -> SessionMessage | Exception:
    """A message of `PARSE_OFF_LOOP_AT` or more, parsed in a worker thread in bounded steps
    (`bridges.mcp.http_parse`), so the loop keeps serving meanwhile."""
    try:
        return SessionMessage(await parse_off_loop(data))
    except ValueError as exc:
        return exc


def _parse(data: str) -> SessionMessage | Exception:
    try:
        if len(data) < 64 * 1024:
            message = types.jsonrpc_message_adapter.validate_json(data, by_name=False)
        else:  # see framing: json.loads keeps one copy of long strings fewer than pydantic's
            message = types.jsonrpc_message_adapter.validate_python(json.loads(data), by_name=False)
    except (ValidationError, ValueError) as exc:
        return exc
    except RecursionError:
        return ValueError(f"not a JSON-RPC message ({len(data):,} chars): nested too deeply")
    return SessionMessage(message)


async def _post_messages(
    client: httpx2.AsyncClient,
    endpoint: str,
    messages: MemoryObjectReceiveStream[SessionMessage],
    read_writer: MemoryObjectSendStream[SessionMessage | Exception],
    listings: _Listings,
) -> None:
    try:
        async for message in messages:
            listings.asked(message.message)
            body = message.message.model_dump(by_alias=True, mode="json", exclude_unset=True)
            response = await client.post(endpoint, json=body)
            response.raise_for_status()
    except (httpx2.HTTPError, OSError) as exc:
        log.warning("posting to %s failed: %s", urlsplit(endpoint).netloc, type(exc).__name__)
        read_writer.close()  # the session sees the connection end


class _Listings:
    """The `tools/list` requests in flight, so that an answer to one over `max_listing_bytes`
    is refused unparsed (the SDK's session would parse it on the event loop), as over stdio."""

    __slots__ = ("_ids", "_limit")

    def __init__(self, limit: int | None) -> None:
        self._limit = limit
        self._ids: set[types.RequestId] = set()

    def asked(self, message: types.JSONRPCMessage) -> None:
        if self._limit is not None and isinstance(message, types.JSONRPCRequest) and (
                message.method == "tools/list"):
            self._ids.add(message.id)

    def refusal(self, data: str) -> SessionMessage | None:
        """The error answering a listing `data` is over the limit for, if it is one."""
        if self._limit is None or not self._ids or len(data) <= self._limit:
            return None
        edges = OversizedLine(len(data), data[:4096].encode(), data[-4096:].encode())
        request_id = edges.request_id()
        if request_id not in self._ids:
            return None
        self._ids.discard(request_id)
        size = len(data.encode()) if data.isascii() else None
        error = types.ErrorData(code=RESULT_TOO_LARGE,
                                message=too_large(self._limit, "max_listing_bytes", size))
        log.warning("%s", error.message)
        return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error))

    def seen(self, message: SessionMessage | Exception) -> SessionMessage | Exception:
        if self._ids and isinstance(message, SessionMessage) and isinstance(
                message.message, types.JSONRPCResponse | types.JSONRPCError):
            self._ids.discard(message.message.id)
        return message

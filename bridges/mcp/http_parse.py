"""Large messages from streamable-HTTP upstreams, parsed off the event loop.

The SDK's `StreamableHTTPTransport` parses every message it receives (a JSON response body,
or one server-sent event) with pydantic's `validate_json` on the event loop: one C call that
holds the loop for about 0.08 s per MB, so an allowed 50 MB `tools/list` answer stopped every
other request for 4 s. `OffLoopTransport` keeps the SDK's handling for small messages and,
from `PARSE_OFF_LOOP_AT` (256 KiB, as over stdio) up, parses the text in a worker thread with
`bridges.mcp.piecewise_json` (no C call parses more than 64 KiB, so the loop keeps the
interpreter between steps), then validates the parsed value (`validate_python`: the message's
`result` is a plain mapping, so this does not walk the listing; the tools are checked one by
one in a thread later, `bridges.mcp.connection`). What it does with the message afterwards
is the SDK's own (mcp 2.x, `StreamableHTTPTransport._handle_sse_event` and
`_handle_json_response`), repeated here for the large ones only.

`streamable_http_client` is the SDK's function of that name with this transport.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncGenerator, Awaitable, Callable
from contextlib import asynccontextmanager

import anyio
import httpx2
from httpx2 import ServerSentEvent
from mcp.client._transport import TransportStreams
from mcp.client.streamable_http import (
    DEFAULT_MAX_SSE_EVENT_SIZE,
    StreamableHTTPTransport,
    StreamWriter,
)
from mcp.shared._compat import resync_tracer
from mcp.shared._context_streams import create_context_streams
from mcp.shared.message import SessionMessage
from mcp_types import (
    PARSE_ERROR,
    ErrorData,
    JSONRPCError,
    JSONRPCMessage,
    JSONRPCResponse,
    RequestId,
)
from mcp_types.jsonrpc import jsonrpc_message_adapter

from bridges.mcp.framing import PARSE_OFF_LOOP_AT
from bridges.mcp.piecewise_json import loads_in_pieces

log = logging.getLogger("bridges.mcp.http_parse")


def _parse(data: bytes | str) -> JSONRPCMessage:
    text = data.decode("utf-8") if isinstance(data, bytes) else data
    message: JSONRPCMessage = jsonrpc_message_adapter.validate_python(
        loads_in_pieces(text), by_name=False)
    return message


async def parse_off_loop(data: bytes | str) -> JSONRPCMessage:
    """One JSON-RPC message, parsed and validated in a worker thread (`ValueError` when it is
    not one: bad UTF-8, bad JSON, nested too deep, or not a JSON-RPC message)."""
    return await anyio.to_thread.run_sync(_parse, data)


class OffLoopTransport(StreamableHTTPTransport):
    """The SDK's transport, with large messages parsed off the event loop (module docstring)."""

    async def _handle_json_response(
        self, response: httpx2.Response, read_stream_writer: StreamWriter, *,
        request_id: RequestId,
    ) -> None:
        if "content-length" not in response.headers:
            await self._handle_json_lines(response, read_stream_writer, request_id=request_id)
            return
        try:
            content = await response.aread()
        except httpx2.StreamError as exc:  # e.g. over max_result_bytes: as the SDK says it
            await self._parse_error(read_stream_writer, request_id,
                                    f"Failed to parse JSON response: {exc}")
            return
        if len(content) < PARSE_OFF_LOOP_AT:  # the body is read: the SDK reads it again free
            await super()._handle_json_response(response, read_stream_writer,
                                                request_id=request_id)
            return
        try:
            message = await parse_off_loop(content)
        except ValueError as exc:
            await self._parse_error(read_stream_writer, request_id,
                                    f"Failed to parse JSON response: {exc}")
            return
        await read_stream_writer.send(SessionMessage(message))

    async def _handle_json_lines(
        self, response: httpx2.Response, read_stream_writer: StreamWriter, *,
        request_id: RequestId,
    ) -> None:
        """A chunked `application/json` body without a length: one JSON-RPC message per line
        (newline-delimited, as a 2026-07-28 `subscriptions/listen` stream or a call's
        notifications may come), each handed on as it arrives; a body whose first line is not
        a whole message is one message, parsed at its end."""
        pending: list[str] = []
        try:
            async for line in response.aiter_lines():
                if pending or not line.strip():
                    if pending:
                        pending.append(line)
                    continue
                try:
                    message = (await parse_off_loop(line) if len(line) >= PARSE_OFF_LOOP_AT
                               else _parse(line))
                except ValueError:
                    pending.append(line)
                    continue
                await read_stream_writer.send(SessionMessage(message))
            if pending:
                await read_stream_writer.send(
                    SessionMessage(await parse_off_loop("\n".join(pending))))
        except (httpx2.StreamError, ValueError) as exc:
            await self._parse_error(read_stream_writer, request_id,
                                    f"Failed to parse JSON response: {exc}")

    async def _handle_sse_event(
        self, sse: ServerSentEvent, read_stream_writer: StreamWriter,
        original_request_id: RequestId | None = None,
        resumption_callback: Callable[[str], Awaitable[None]] | None = None,
    ) -> bool:
        if sse.event != "message" or len(sse.data) < PARSE_OFF_LOOP_AT:
            return await super()._handle_sse_event(sse, read_stream_writer, original_request_id,
                                                   resumption_callback)
        try:
            message = await parse_off_loop(sse.data)
            if original_request_id is not None and isinstance(message,
                                                              JSONRPCResponse | JSONRPCError):
                message.id = original_request_id
            await read_stream_writer.send(SessionMessage(message))
            if sse.id and resumption_callback:
                await resumption_callback(sse.id)
            return isinstance(message, JSONRPCResponse | JSONRPCError)
        except Exception as exc:  # the SDK's handling of a message it cannot take
            log.warning("a server-sent event of %d characters failed: %s", len(sse.data), exc)
            if original_request_id is not None:
                await self._parse_error(read_stream_writer, original_request_id,
                                        f"Failed to parse SSE message: {exc}")
                return True
            await read_stream_writer.send(exc)
            return False

    @staticmethod
    async def _parse_error(writer: StreamWriter, request_id: RequestId, text: str) -> None:
        error = ErrorData(code=PARSE_ERROR, message=text)
        await writer.send(SessionMessage(JSONRPCError(jsonrpc="2.0", id=request_id,
                                                      error=error)))


@asynccontextmanager
async def streamable_http_client(
    url: str, *, http_client: httpx2.AsyncClient, terminate_on_close: bool = True,
    max_sse_event_size: int | None = DEFAULT_MAX_SSE_EVENT_SIZE,
) -> AsyncGenerator[TransportStreams, None]:
    """`mcp.client.streamable_http.streamable_http_client` (mcp 2.x) with `OffLoopTransport`;
    the caller owns `http_client`."""
    transport = OffLoopTransport(url, max_sse_event_size=max_sse_event_size)
    read_stream_writer, read_stream = create_context_streams[SessionMessage | Exception](0)
    write_stream, write_stream_reader = create_context_streams[SessionMessage](0)
    async with (
        read_stream_writer,
        read_stream,
        write_stream,
        write_stream_reader,
        anyio.create_task_group() as tg,
    ):

        def start_get_stream() -> None:
            tg.start_soon(transport.handle_get_stream, http_client, read_stream_writer)

        tg.start_soon(transport.post_writer, http_client, write_stream_reader,
                      read_stream_writer, write_stream, start_get_stream, tg)
        try:
            yield read_stream, write_stream
        finally:
            if transport.session_id and terminate_on_close:
                await transport.terminate_session(http_client)
            tg.cancel_scope.cancel()
    await resync_tracer()

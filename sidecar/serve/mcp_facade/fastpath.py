"""`tools/call` over stdio without the SDK's request runner (the bridge's hot path).

The SDK server spends more CPU on one `tools/call` than our whole seam does: it validates the
request against the protocol schema, builds typed params, runs middleware, then dumps the result
and validates it against the schema again. Over stdio, once a handshake-era client has listed
tools, `FastCalls` takes plain `tools/call` requests off the transport's read stream, runs them
through the same facade code (`McpFacade.fast_call`: call context, seam, `result_for`) and
writes the JSON-RPC response itself. Later `tools/list` requests are answered the same way from
a listing cached per registry state (`McpFacade.fast_list`: the SDK's own dump and
protocol-version sieve, run once). Everything else goes to the SDK server unchanged:
initialize, the first `tools/list`, other listings, 2026-07-28 requests, a call whose `_meta`
asks for progress, one whose params are malformed, and `notifications/cancelled` for requests
that are not ours.

A `notifications/cancelled` naming one of our requests cancels it; as the spec asks, no
response is sent for a cancelled request.

On pipes (`stdio_pipes`) the same decisions are taken on the plain JSON of each line
(`take_raw`), before any pydantic model is built, and the answers, the server-to-client
requests and the notifications it sends are written as JSON lines (`send_line`).

The helpers at the end (which requests qualify, calls in flight and their cancellation,
server-to-client requests, the encoded listing) are shared with the /mcp fast path
(`http_fastpath`), so both transports take the same decisions.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.abc
import mcp_types as types
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage

from sidecar.serve.mcp_facade.tools import error_wire

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.server import McpFacade

log = logging.getLogger("sidecar.mcp")


class FastCalls:
    """Wraps the SDK transport's read stream; hand it to `Server.run` in place of that stream."""

    def __init__(
        self, facade: McpFacade, read: Any, write: Any,
        send_line: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        self._facade = facade
        self._read = read
        self._write = write
        self._send_line = send_line
        # Plain asyncio tasks: anyio's start_soon cost more than a tenth of the facade's CPU
        # per call. `close` cancels and awaits what is still running.
        self._tasks: set[asyncio.Task[None]] = set()
        self._listing_json = ListingJson()
        self._inflight = InFlight()
        self._asks = Asks()
        self.handled = 0  # calls taken off the SDK's path

    @property
    def last_context(self) -> Any:
        # The SDK dispatcher runs handlers in the sender's context when the stream has one.
        return getattr(self._read, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        while True:
            item: SessionMessage | Exception = await self._read.receive()
            if isinstance(item, SessionMessage) and self._took(item.message):
                continue
            return item

    def _took(self, message: Any) -> bool:
        if isinstance(message, types.JSONRPCResponse | types.JSONRPCError):
            return self._asks.settle(message)
        if isinstance(message, types.JSONRPCRequest):
            return self._request(message.id, message.method, message.params)
        if isinstance(message, types.JSONRPCNotification):
            return (message.method == "notifications/cancelled"
                    and self._inflight.cancel(message.params))
        return False

    def take_raw(self, value: Any) -> bool:
        """`_took` on the plain JSON of a line (requests and notifications; a response to one
        of our requests takes the model path)."""
        if not isinstance(value, dict):
            return False
        if "id" not in value:
            return cancels(value, self._inflight)
        request = plain_request(value)
        return request is not None and self._request(*request)

    def _request(
        self, request_id: types.RequestId, method: str, params: dict[str, Any] | None
    ) -> bool:
        if method == "tools/list":
            state = self._facade.fast_session(listed=False)
            if state is None or (params and set(params) - {"cursor"}):
                return False
            self.handled += 1
            self._spawn(self._respond_listing(request_id, self._facade.fast_list(state)))
            return True
        if method != "tools/call" or self._facade.fast_session() is None:
            return False
        call = call_params(params)
        if call is None or request_id in self._inflight.tasks:
            return False  # an id still in flight, reused: the SDK's path answers it
        self.handled += 1
        self._inflight.tasks[request_id] = self._spawn(self._run(request_id, *call))
        return True

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and (exc := task.exception()) is not None:
            log.error("a fast-path request failed", exc_info=exc)

    @property
    def busy(self) -> bool:
        """Whether requests it took are still running."""
        return bool(self._tasks)

    async def close(self) -> None:
        """Cancel the calls still running (the client is gone) and wait for them to settle."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        with anyio.CancelScope(shield=True):
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _run(
        self, request_id: types.RequestId, name: str, arguments: dict[str, Any],
        meta: dict[str, Any],
    ) -> None:
        state = self._facade.fast_session()
        if state is None:  # the session changed era in between: answer as an error
            work: Awaitable[dict[str, Any]] = _ready(
                error_wire("the session is no longer available"))
        else:
            work = self._facade.fast_call(state, request_id, name, arguments, meta)
        result = await self._inflight.run(request_id, work, self._fail)
        if result is not None:
            await self._respond(request_id, result)

    async def _fail(self, request_id: types.RequestId, error: types.ErrorData) -> None:
        if error.code == types.INTERNAL_ERROR:  # over stdio a cancelled call gets no answer
            await self._send_message(
                types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error), request_id)

    async def _respond_listing(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        """A cached listing is the same object until the registry changes: on pipes, its JSON
        is encoded once too (5,000 tools are a few MB; encoding them took longer than the rest
        of answering)."""
        if self._send_line is None:
            await self._respond(request_id, result)
            return
        line = self._listing_json.response(request_id, result)
        if line is None:
            await self._respond(request_id, result)
            return
        await self._send(line + b"\n", request_id)

    async def _respond(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        if self._send_line is not None:
            line = json_bytes({"jsonrpc": "2.0", "id": request_id, "result": result})
            if line is not None:
                await self._send(line + b"\n", request_id)
                return
        response = types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
        await self._send_message(response, request_id)

    async def _send_message(
        self, message: types.JSONRPCMessage, request_id: types.RequestId | None = None,
        *, quiet: bool = True,
    ) -> None:
        """Write one message; `quiet`: a client that is gone is only logged, else it raises."""
        if self._send_line is not None:
            data = message.model_dump_json(by_alias=True, exclude_unset=True)
            await self._send(data.encode() + b"\n", request_id, quiet=quiet)
            return
        try:
            await self._write.send(SessionMessage(message))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            if not quiet:
                raise
            log.debug("stdio closed before the message for %r could be written", request_id)

    async def _send(
        self, line: bytes, request_id: types.RequestId | None, *, quiet: bool = True
    ) -> None:
        assert self._send_line is not None
        try:
            await self._send_line(line)
        except (ConnectionError, OSError):
            if not quiet:
                raise anyio.BrokenResourceError("the client closed stdout") from None
            log.debug("stdout closed before the message for %r could be written", request_id)

    async def request(self, request: Any, result_type: Any) -> Any:
        """Send a server-to-client request (sampling, elicitation, roots) and wait for the
        client's answer. The SDK's per-request sessions lose their back-channel once their
        request is answered, so requests on behalf of any call go out here."""

        async def send(message: types.JSONRPCRequest) -> None:
            await self._send_message(message, message.id, quiet=False)

        return await self._asks.ask(request, result_type, send)

    async def notify(self, notification: Any) -> None:
        """Send a notification to the client (for the same reason as `request`)."""
        await self._send_message(notification_message(notification), quiet=False)

    # --- the rest of the stream interface ----------------------------------------------

    async def aclose(self) -> None:
        await self._read.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()


async def _ready(value: dict[str, Any]) -> dict[str, Any]:
    return value


# --- shared with the /mcp fast path (`http_fastpath`) --------------------------------------


def plain_request(
    value: dict[str, Any],
) -> tuple[types.RequestId, str, dict[str, Any] | None] | None:
    """`(id, method, params)` of a JSON-RPC request as plain JSON, or None when it is not one
    (the SDK's path validates and answers anything else)."""
    method = value.get("method")
    request_id = value.get("id")
    params = value.get("params")
    if (
        value.get("jsonrpc") != "2.0" or not isinstance(method, str)
        or isinstance(request_id, bool) or not isinstance(request_id, int | str)
        or (params is not None and not isinstance(params, dict))
    ):
        return None
    return request_id, method, params


def call_params(
    params: Mapping[str, Any] | None,
) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
    """`(name, arguments, _meta)` of a plain handshake-era `tools/call`, or None when the call
    needs the SDK's path (progress, malformed params, inputResponses, requestState, tasks)."""
    if not isinstance(params, Mapping):
        return None
    name = params.get("name")
    arguments = params.get("arguments")
    meta = params.get("_meta")
    if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
        return None
    if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
        return None
    if set(params) - {"name", "arguments", "_meta"}:
        return None
    return name, arguments or {}, meta or {}


def notification_message(notification: Any) -> types.JSONRPCNotification:
    """A typed server notification as the JSON-RPC message that carries it."""
    data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
    return types.JSONRPCNotification(
        jsonrpc="2.0", method=data["method"], params=data.get("params"))


def cancels(value: dict[str, Any], inflight: InFlight) -> bool:
    """Whether a notification, as plain JSON, cancels one of `inflight`'s calls (and cancel
    it)."""
    return (value.get("jsonrpc") == "2.0" and value.get("method") == "notifications/cancelled"
            and inflight.cancel(value.get("params")))


class InFlight:
    """Fast-path calls in flight by request id, and those the client cancelled. A call's task
    is cancelled directly: an anyio cancel scope per call cost ~5 % of the facade's CPU."""

    __slots__ = ("cancelled", "tasks")

    def __init__(self) -> None:
        self.tasks: dict[types.RequestId, asyncio.Task[Any]] = {}
        self.cancelled: set[asyncio.Task[Any]] = set()

    def cancel(self, params: Any) -> bool:
        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        task = self.tasks.get(request_id) if isinstance(request_id, int | str) else None
        if task is None:
            return False
        if task not in self.cancelled:
            self.cancelled.add(task)
            task.cancel("the client cancelled the request")
        return True

    async def run(
        self, request_id: types.RequestId, work: Awaitable[dict[str, Any]],
        fail: Callable[[types.RequestId, types.ErrorData], Awaitable[None]],
    ) -> dict[str, Any] | None:
        """Await a call registered in `tasks` under `request_id` (by the task running this).
        A call the client alone cancelled returns None after `fail(REQUEST_CANCELLED)`; any
        other cancellation propagates. A bug below the facade (the seam turns every tool
        failure into an outcome) gets `fail(INTERNAL_ERROR)`, the SDK runner's generic answer,
        so the client does not wait forever; then it is raised to be logged."""
        task = asyncio.current_task()
        try:
            return await work
        except asyncio.CancelledError:
            if task in self.cancelled and task is not None and task.uncancel() == 0:
                await fail(request_id, types.ErrorData(code=REQUEST_CANCELLED,
                                                       message="Request cancelled"))
                return None
            raise
        except Exception:
            await fail(request_id, types.ErrorData(code=types.INTERNAL_ERROR,
                                                   message="Internal error"))
            raise
        finally:
            del self.tasks[request_id]
            self.cancelled.discard(task)


class Asks:
    """Server-to-client requests sent on behalf of calls, by id, until the client answers."""

    __slots__ = ("_count", "_open")

    def __init__(self) -> None:
        self._open: dict[str, _Answer] = {}
        self._count = 0

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> bool:
        """Hand the client's answer to the request waiting for it; False when none is."""
        answer = self._open.get(str(message.id)) if message.id is not None else None
        if answer is None:
            return False
        answer.settle(message)
        return True

    def waits_for(self, request_id: Any) -> bool:
        return isinstance(request_id, int | str) and str(request_id) in self._open

    async def ask(
        self, request: Any, result_type: Any,
        send: Callable[[types.JSONRPCRequest], Awaitable[None]],
    ) -> Any:
        """Send `request` (a typed server request) with a fresh id and return the client's
        typed result; a JSON-RPC error answer raises `MCPError`."""
        self._count += 1
        request_id = f"sidecar-{self._count}"
        answer = _Answer()
        self._open[request_id] = answer
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method=data["method"], params=data.get("params"))
        try:
            await send(message)
            await answer.done.wait()
        finally:
            del self._open[request_id]
        reply = answer.message
        if isinstance(reply, types.JSONRPCError):
            raise MCPError.from_error_data(reply.error)
        assert isinstance(reply, types.JSONRPCResponse)
        return result_type.model_validate(reply.result, by_name=False)


class ListingJson:
    """A cached listing is the same object until the registry changes: its JSON is encoded
    once too (5,000 tools are a few MB; encoding them took longer than the rest of
    answering)."""

    __slots__ = ("_cached",)

    def __init__(self) -> None:
        self._cached: tuple[dict[str, Any], bytes] | None = None

    def response(self, request_id: types.RequestId, result: dict[str, Any]) -> bytes | None:
        """The JSON-RPC response with `result`, or None when it is not plain JSON."""
        cached = self._cached
        if cached is None or cached[0] is not result:
            encoded = json_bytes(result)
            if encoded is None:
                return None
            cached = self._cached = (result, encoded)
        head = json_bytes({"jsonrpc": "2.0", "id": request_id})
        assert head is not None  # an id is a str or an int
        return head[:-1] + b',"result":' + cached[1] + b"}"


def json_bytes(message: dict[str, Any]) -> bytes | None:
    """Compact JSON (no newline in it), or None when the value is not plain JSON (the model
    path serializes it)."""
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode()
    except (TypeError, ValueError):  # includes UnicodeEncodeError (a lone surrogate)
        return None


REQUEST_CANCELLED = -32800  # what the SDK's streamable HTTP transport answers a cancelled call


class _Answer:
    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.message: types.JSONRPCResponse | types.JSONRPCError | None = None

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        self.message = message
        self.done.set()

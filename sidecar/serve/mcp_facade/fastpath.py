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
        self._listing_json: tuple[dict[str, Any], bytes] | None = None
        # Calls in flight by request id, and those the client cancelled (a task is cancelled
        # directly: an anyio cancel scope per call cost ~5 % of the facade's CPU).
        self._inflight: dict[types.RequestId, asyncio.Task[None]] = {}
        self._client_cancelled: set[asyncio.Task[None]] = set()
        self.handled = 0  # calls taken off the SDK's path
        self._asked: dict[str, _Answer] = {}
        self._asked_count = 0

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
            answer = self._asked.get(str(message.id)) if message.id is not None else None
            if answer is None:
                return False
            answer.settle(message)
            return True
        if isinstance(message, types.JSONRPCRequest):
            return self._request(message.id, message.method, message.params)
        if isinstance(message, types.JSONRPCNotification):
            return message.method == "notifications/cancelled" and self._cancel(message.params)
        return False

    def take_raw(self, value: Any) -> bool:
        """`_took` on the plain JSON of a line (requests and notifications; a response to one
        of our requests takes the model path)."""
        if not isinstance(value, dict) or value.get("jsonrpc") != "2.0":
            return False
        method = value.get("method")
        if not isinstance(method, str):
            return False
        if "id" not in value:
            return method == "notifications/cancelled" and self._cancel(value.get("params"))
        request_id = value["id"]
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            return False
        params = value.get("params")
        if params is not None and not isinstance(params, dict):
            return False
        return self._request(request_id, method, params)

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
        if method != "tools/call":
            return False
        call = self._eligible(params)
        if call is None:
            return False
        if request_id in self._inflight:
            return False  # an id still in flight, reused: the SDK's path answers it
        self.handled += 1
        self._inflight[request_id] = self._spawn(self._run(request_id, *call))
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

    def _cancel(self, params: Mapping[str, Any] | None) -> bool:
        request_id = params.get("requestId") if params else None
        task = self._inflight.get(request_id) if isinstance(request_id, int | str) else None
        if task is None:
            return False
        if task not in self._client_cancelled:
            self._client_cancelled.add(task)
            task.cancel("the client cancelled the request")
        return True

    def _eligible(
        self, params: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        if not isinstance(params, Mapping) or self._facade.fast_session() is None:
            return None
        name = params.get("name")
        arguments = params.get("arguments")
        meta = params.get("_meta")
        if not isinstance(name, str) or not (arguments is None or isinstance(arguments, dict)):
            return None
        if meta is not None and (not isinstance(meta, dict) or "progressToken" in meta):
            return None
        if set(params) - {"name", "arguments", "_meta"}:
            return None  # inputResponses, requestState, task fields: the full path
        return name, arguments or {}, meta or {}

    async def _run(
        self, request_id: types.RequestId, name: str, arguments: dict[str, Any],
        meta: dict[str, Any],
    ) -> None:
        try:
            state = self._facade.fast_session()
            if state is None:  # the session changed era in between: answer as an error
                result: dict[str, Any] = error_wire("the session is no longer available")
            else:
                result = await self._facade.fast_call(state, request_id, name, arguments, meta)
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task in self._client_cancelled and task is not None and task.uncancel() == 0:
                return  # cancelled by the client alone: no response, as the spec asks
            raise
        except Exception:
            # A bug below the facade (the seam turns every tool failure into an outcome). The
            # client still gets an answer, the SDK runner's generic one, instead of waiting
            # forever; the task then fails and `_finished` logs the traceback.
            error = types.ErrorData(code=types.INTERNAL_ERROR, message="Internal error")
            await self._send_message(
                types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error), request_id)
            raise
        finally:
            del self._inflight[request_id]
            self._client_cancelled.discard(asyncio.current_task())
        await self._respond(request_id, result)

    async def _respond_listing(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        """A cached listing is the same object until the registry changes: on pipes, its JSON
        is encoded once too (5,000 tools are a few MB; encoding them took longer than the rest
        of answering)."""
        if self._send_line is None:
            await self._respond(request_id, result)
            return
        cached = self._listing_json
        if cached is None or cached[0] is not result:
            encoded = _json_line(result)
            if encoded is None:
                await self._respond(request_id, result)
                return
            cached = self._listing_json = (result, encoded[:-1])
        head = _json_line({"jsonrpc": "2.0", "id": request_id})
        assert head is not None  # an id is a str or an int
        await self._send(head[:-2] + b',"result":' + cached[1] + b"}\n", request_id)

    async def _respond(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        if self._send_line is not None:
            line = _json_line({"jsonrpc": "2.0", "id": request_id, "result": result})
            if line is not None:
                await self._send(line, request_id)
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
        self._asked_count += 1
        request_id = f"sidecar-{self._asked_count}"
        answer = _Answer()
        self._asked[request_id] = answer
        data = request.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = types.JSONRPCRequest(
            jsonrpc="2.0", id=request_id, method=data["method"], params=data.get("params"))
        try:
            await self._send_message(message, request_id, quiet=False)
            await answer.done.wait()
        finally:
            del self._asked[request_id]
        reply = answer.message
        if isinstance(reply, types.JSONRPCError):
            raise MCPError.from_error_data(reply.error)
        assert isinstance(reply, types.JSONRPCResponse)
        return result_type.model_validate(reply.result, by_name=False)

    async def notify(self, notification: Any) -> None:
        """Send a notification to the client (for the same reason as `request`)."""
        data = notification.model_dump(by_alias=True, mode="json", exclude_none=True)
        message = types.JSONRPCNotification(
            jsonrpc="2.0", method=data["method"], params=data.get("params"))
        await self._send_message(message, quiet=False)

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


def _json_line(message: dict[str, Any]) -> bytes | None:
    """One JSON line, or None when the value is not plain JSON (the model path serializes it)."""
    try:
        return json.dumps(message, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False).encode() + b"\n"
    except (TypeError, ValueError):  # includes UnicodeEncodeError (a lone surrogate)
        return None


class _Answer:
    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.message: types.JSONRPCResponse | types.JSONRPCError | None = None

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        self.message = message
        self.done.set()

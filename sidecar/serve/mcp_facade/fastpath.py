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
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
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
        self, facade: McpFacade, read: Any, write: Any, tg: anyio.abc.TaskGroup
    ) -> None:
        self._facade = facade
        self._read = read
        self._write = write
        self._tg = tg
        self._inflight: dict[types.RequestId, anyio.CancelScope] = {}
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
            if message.method == "tools/list":
                state = self._facade.fast_session(listed=False)
                if state is None or (message.params and set(message.params) - {"cursor"}):
                    return False
                self.handled += 1
                self._tg.start_soon(self._respond, message.id, self._facade.fast_list(state))
                return True
            if message.method != "tools/call":
                return False
            call = self._eligible(message.params)
            if call is None:
                return False
            self.handled += 1
            self._tg.start_soon(self._run, message.id, *call)
            return True
        if isinstance(message, types.JSONRPCNotification):
            if message.method != "notifications/cancelled" or not message.params:
                return False
            scope = self._inflight.get(message.params.get("requestId"))  # type: ignore[arg-type]
            if scope is None:
                return False
            scope.cancel()
            return True
        return False

    def _eligible(
        self, params: Mapping[str, Any] | None
    ) -> tuple[str, dict[str, Any], dict[str, Any]] | None:
        if self._facade.fast_session() is None or not isinstance(params, Mapping):
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
        state = self._facade.fast_session()
        if state is None:  # the session changed era in between: answer as an error
            result: dict[str, Any] = error_wire("the session is no longer available")
        else:
            with anyio.CancelScope() as scope:
                self._inflight[request_id] = scope
                try:
                    result = await self._facade.fast_call(state, request_id, name, arguments, meta)
                finally:
                    del self._inflight[request_id]
            if scope.cancelled_caught:
                return
        await self._respond(request_id, result)

    async def _respond(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        response = types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result)
        try:
            await self._write.send(SessionMessage(response))
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            log.debug("stdio closed before the response to %r could be written", request_id)

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
            await self._write.send(SessionMessage(message))
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
        await self._write.send(SessionMessage(message))

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


class _Answer:
    __slots__ = ("done", "message")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.message: types.JSONRPCResponse | types.JSONRPCError | None = None

    def settle(self, message: types.JSONRPCResponse | types.JSONRPCError) -> None:
        self.message = message
        self.done.set()

"""Over stdio, the fast route: plain `tools/list` and `tools/call` without the SDK
(`FastCalls`; which requests is `fast_answers.fast_request`'s table). On the SDK's streams it
wraps the read stream; on pipes (`stdio_pipes`) it decides on the plain JSON of each line
before any pydantic model is built.

Imports `sidecar.execution` and the rest of `sidecar.serve.mcp_facade`. Exports `FastCalls`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

import anyio
import anyio.abc
import mcp_types as types
from mcp.shared.message import SessionMessage

from sidecar.execution.behind import answer_first
from sidecar.serve.mcp_facade.fast_answers import (
    Asks,
    FastCall,
    FastList,
    InFlight,
    ListingJson,
    cancels,
    fast_request,
    json_bytes,
    notification_message,
    plain_request,
)
from sidecar.serve.mcp_facade.tools import error_wire

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.server import McpFacade

log = logging.getLogger("sidecar.mcp")


class FastCalls:
    """Wraps the SDK transport's read stream; hand it to `Server.run` in place of that stream.

    - `tools/list` after the handshake, a plain `tools/call` once tools are listed, and
      `notifications/cancelled` for one of those calls: taken here (`fast_request` decides),
      run through `McpFacade.fast` (`FastAnswers.call` / `listing`), answered as JSON-RPC
      written by us;
    - everything else (initialize, the first listing, other methods, 2026-07-28 requests, calls
      with progress, malformed params, `notifications/cancelled` for other requests): passed on
      to the SDK server unchanged.

    On pipes (`stdio_pipes`) the same decisions are taken on the plain JSON of each line
    (`take_raw`), and the answers, the server-to-client requests and the notifications it sends
    are written as JSON lines (`send_line`). A `notifications/cancelled` naming one of our
    requests cancels it; as the spec asks, no response is sent for a cancelled request."""

    def __init__(
        self, facade: McpFacade, read: Any, write: Any,
        send_line: Callable[[bytes], Awaitable[None]] | None = None,
    ) -> None:
        self._fast = facade.fast
        self._read = read
        self._write = write
        self._send_line = send_line
        # Plain asyncio tasks: anyio's start_soon cost more than a tenth of the facade's CPU
        # per call. `close` cancels and awaits what is still running.
        self._tasks: set[asyncio.Task[None]] = set()
        self._listing_json = ListingJson()
        self._inflight = InFlight(facade.location.stores.database)
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
        fast = self._fast
        taken = fast_request(lambda listed: fast.session(listed=listed),
                             request_id, method, params, self._inflight)
        if isinstance(taken, FastList):
            self.handled += 1
            self._spawn(self._respond_listing(request_id, fast.listing(taken.state)))
            return True
        if isinstance(taken, FastCall):
            self.handled += 1
            self._inflight.tasks[request_id] = self._spawn(
                self._run(request_id, taken.name, taken.arguments, taken.meta))
            return True
        return False

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
        fast = self._fast
        state = fast.session()
        if state is None:  # the session changed era in between: answer as an error
            work: Awaitable[dict[str, Any]] = _ready(
                error_wire("the session is no longer available"))
        else:
            work = fast.call(state, request_id, name, arguments, meta)
        with answer_first():  # the call's history row and metrics once its answer is out
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

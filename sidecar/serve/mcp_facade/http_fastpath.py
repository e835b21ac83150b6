"""On /mcp, the fast route: plain `tools/call` and later `tools/list` answered with one JSON
body, without the SDK's streamable HTTP machinery (`HttpFastPath`: which requests, and how it
hooks in, is its docstring; the decisions are `fast_answers.fast_request`'s, as over stdio).
Why: README.md. `guard_depth` puts the nesting limit of `sidecar.model.json_depth` in front of
a session manager, the same on `/mcp` and every `/mcp/NAME`.

Imports `sidecar.model`, `sidecar.execution` and the rest of `sidecar.serve`. Exports
`HttpFastPath` and `guard_depth`.
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.server.streamable_http import check_accept_headers
from mcp.server.transport_security import RequestBodyLimitMiddleware
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from pydantic import ValidationError
from starlette.requests import Request
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from sidecar.execution.behind import answer_first
from sidecar.model import json_depth
from sidecar.model.json_depth import JsonTooDeep
from sidecar.serve.mcp_facade import stream_priming
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
from sidecar.serve.mcp_facade.stream_priming import priming_event

if TYPE_CHECKING:
    from sidecar.serve.mcp_facade.server import McpFacade

log = logging.getLogger("sidecar.mcp")

ASGIHandler = Callable[[Scope, Receive, Send], Awaitable[None]]


class HttpFastPath:
    """Install on the session manager before it serves: `HttpFastPath(facade).install(m)`.
    Everything not listed here goes to the SDK's session manager unchanged, with the body handed
    on as it came.

    Taken, on a session of the handshake era that has listed tools, from a POST whose
    Content-Type is `application/json`, whose Accept names JSON and SSE (as the SDK requires)
    and whose body is one JSON-RPC message:

    - `tools/call` without a `progressToken` (or task or round fields): answered with a JSON
      body. If the call has to reach its client before it ends (an upstream server's sampling,
      elicitation or roots request, or a log line), the answer becomes the SSE stream the SDK
      would have sent: those messages first, the result last.
    - `tools/list` (a `cursor` at most): the listing cached per registry state, encoded once.
    - the client's answer to one of those server-to-client requests, and
      `notifications/cancelled` naming one of these calls: 202 Accepted. A cancelled call is
      answered `-32800 Request cancelled`, as the SDK's transport answers.

    The same facade code answers as over stdio (`McpFacade.fast`: `call`, `listing`), with the
    same cancellation. How it hooks in: each new session's transport is wrapped as the session
    manager admits it, around the transport's own request handling. By then the manager has
    found the session and checked its owner and protocol era, and the transport has counted the
    request against its idle timeout, so none of that is redone here. `_admit_session` and
    `_handle_request` are private names of mcp 2.x; when they are missing, `installed` is False
    and every request takes the SDK's path (a test asserts that the fast path is on).
    `shortcut` lets a request for a live session skip the layers between the app's security
    checks and the session's transport."""

    def __init__(self, facade: McpFacade) -> None:
        self.facade = facade
        self.installed = False
        self.handled = 0  # requests answered here
        self.shortcuts = 0  # requests `shortcut` took to their session directly
        self.enabled = True
        """False: every request takes the SDK's route (to compare the two routes)."""
        self._manager: Any = None
        self._sessions: weakref.WeakValueDictionary[str, _Session] = (
            weakref.WeakValueDictionary())
        """Each session's fast path, by session id, while its transport lives."""

    def install(self, manager: Any) -> None:
        admit = getattr(manager, "_admit_session", None)
        if not callable(admit):
            log.warning("the MCP SDK's session manager has no _admit_session: the /mcp fast "
                        "path is off")
            return

        def admit_with_fast_path(requestor: Any) -> Any:
            transport = admit(requestor)
            if transport is not None:
                self._attach(transport)
            return transport

        setattr(manager, "_admit_session", admit_with_fast_path)  # noqa: B010
        self.installed = True
        stream_priming.install(manager)
        if isinstance(getattr(manager, "_server_instances", None), dict) and isinstance(
                getattr(manager, "_session_owners", None), dict):
            self._manager = manager

    def _attach(self, transport: Any) -> None:
        sdk = getattr(transport, "_handle_request", None)
        session_id = getattr(transport, "mcp_session_id", None)
        if not callable(sdk) or not isinstance(session_id, str):
            return
        session = _Session(self, transport, session_id, sdk)
        setattr(transport, "_handle_request", session.handle)  # noqa: B010
        self._sessions[session_id] = session

    def shortcut(self, app: ASGIApp, path: str) -> ASGIApp:
        """An ASGI middleware for the app's stack right inside its `SecurityMiddleware`: a POST
        to `path` (the session manager's) for a session the manager would hand to its
        transport goes to that transport at once, past the exception middleware, the router,
        the body-size limit, the depth guard and the manager (`_Shortcut` checks what those
        would: the size, the depth, the protocol-version header, the session and its owner);
        everything else goes on to `app`. Without the manager's session map (another SDK) it
        is `app`."""
        return app if self._manager is None else _Shortcut(self, app, path)

    def session_of(self, scope: Scope) -> _Session | None:
        """The fast path of the session the manager would hand this request to, or None: as
        `StreamableHTTPSessionManager._handle_request` decides (the first `mcp-session-id`
        names a session it serves, made without an owner, the request has none either, and the
        first `mcp-protocol-version`, if any, is of the handshake era)."""
        session_id, version = _first_of(scope, b"mcp-session-id", b"mcp-protocol-version")
        if session_id is None:
            return None
        key = session_id.decode("latin-1")
        session = self._sessions.get(key)
        manager = self._manager
        if (session is None or manager._server_instances.get(key) is not session.transport
                or manager._session_owners.get(key) is not None
                or scope.get("user") is not None):
            return None
        if version is not None and version.decode("latin-1") not in HANDSHAKE_PROTOCOL_VERSIONS:
            return None
        return session


class _Shortcut:
    """`HttpFastPath.shortcut`."""

    __slots__ = ("app", "fast_path", "limit", "path")

    def __init__(self, fast_path: HttpFastPath, app: ASGIApp, path: str) -> None:
        self.fast_path = fast_path
        self.app = app
        self.path = path
        self.limit: int = fast_path._manager.max_request_body_size

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (scope["type"] != "http" or scope["path"] != self.path or scope["method"] != "POST"
                or not self.fast_path.enabled):
            await self.app(scope, receive, send)
            return
        session = self.fast_path.session_of(scope)
        if session is None:
            await self.app(scope, receive, send)
            return
        transport = session.transport
        if (transport.is_terminated  # the SDK answers 404
                or (transport.idle_scope is not None and transport.idle_scope.cancel_called)
                or _declared_length(scope) > self.limit or not _plain_post(scope)):
            await self.app(scope, receive, send)
            return
        message = await receive()
        # the body whole and within the limit, one JSON object nested within the depth limit;
        # else the limit, the depth guard or the SDK's route answers
        value = _json_body(message) if len(message.get("body", b"")) <= self.limit else None
        if value is None:
            await self.app(scope, _replay(message, receive), send)
            return
        self.fast_path.shortcuts += 1
        scope[_CHECKED] = (value, message)
        # the transport's own entry: it holds the session's idle clock while it runs
        await transport.handle_request(scope, receive, send)


_CHECKED = "sidecar.mcp_checked"
"""Scope key: the body `_Shortcut` read and checked, as (JSON object, ASGI message)."""


def _declared_length(scope: Scope) -> int:
    for name, value in scope["headers"]:
        if name == b"content-length":
            return int(value) if value.isdigit() else 0  # malformed: the limit reads the body
    return 0


class _Session:
    """The fast path of one session (one transport)."""

    __slots__ = ("__weakref__", "_asks", "_fast", "_id", "_inflight", "_listing", "_path",
                 "_sdk", "transport")

    def __init__(self, path: HttpFastPath, transport: Any, session_id: str,
                 sdk: ASGIHandler) -> None:
        self._path = path
        self._fast = path.facade.fast
        self.transport = transport
        self._id = session_id
        self._sdk = sdk
        self._inflight = InFlight(path.facade.location.stores.database)
        self._asks = Asks()
        self._listing = ListingJson()

    async def handle(self, scope: Scope, receive: Receive, send: Send) -> None:
        checked = scope.pop(_CHECKED, None)
        if checked is not None:  # `_Shortcut` read and checked the body
            value, message = checked
            if self.transport.is_terminated:
                value = None
        elif (not self._path.enabled or scope["method"] != "POST"
                or self.transport.is_terminated or not _plain_post(scope)):
            await self._sdk(scope, receive, send)
            return
        else:
            message = await receive()
            value = _json_body(message)
        if value is None or not await self._take(scope, value, send):
            await self._sdk(scope, _replay(message, receive), send)

    async def _take(self, scope: Scope, value: dict[str, Any], send: Send) -> bool:
        """Answer the message and return True, or return False (the SDK's path answers)."""
        if "method" not in value:
            answer = _answer(value) if self._asks.waits_for(value.get("id")) else None
            if answer is None:
                return False
            self._asks.settle(answer)
            await _accepted(send, self._id)
            return True
        if "id" not in value:
            if not cancels(value, self._inflight):
                return False
            await _accepted(send, self._id)
            return True
        request = plain_request(value)
        if request is None:
            return False
        request_id, method, params = request
        fast = self._fast
        taken = fast_request(
            lambda listed: fast.http_session(self._id, listed=listed),
            request_id, method, params, self._inflight)
        if isinstance(taken, FastList):
            return await self._list(request_id, taken, send)
        if not isinstance(taken, FastCall):
            return False
        self._path.handled += 1
        reply = _Reply(send, self._id, self._asks, scope["headers"])
        task = asyncio.current_task()
        assert task is not None
        self._inflight.tasks[request_id] = task
        work = fast.call(taken.state, request_id, taken.name, taken.arguments, taken.meta,
                         channel=reply)
        with answer_first():  # the call's history row and metrics once its answer is out
            result = await self._inflight.run(request_id, work, reply.fail)
            if result is not None:
                await reply.answer(request_id, result)
        return True

    async def _list(self, request_id: types.RequestId, taken: FastList, send: Send) -> bool:
        body = self._listing.response(request_id, self._fast.listing(taken.state))
        if body is None:
            return False
        self._path.handled += 1
        await _Reply(send, self._id, self._asks).finish(body)
        return True


class _Reply:
    """The response to one POST: a JSON body, or an SSE stream once something has to reach
    the client before the result (`CallChannel` of the call)."""

    __slots__ = ("_asks", "_done", "_headers", "_lock", "_send", "_session_id", "_streaming")

    def __init__(self, send: Send, session_id: str, asks: Asks,
                 headers: list[tuple[bytes, bytes]] | None = None) -> None:
        self._send = send
        self._headers = headers
        """The request's: a stream opens with a priming event for its client's version."""
        self._session_id = session_id
        self._asks = asks
        self._streaming = False
        self._done = False
        self._lock: asyncio.Lock | None = None  # only once events may interleave

    async def request(self, request: Any, result_type: Any) -> Any:
        return await self._asks.ask(request, result_type, self._message)

    async def notify(self, notification: Any) -> None:
        await self._message(notification_message(notification))

    async def answer(self, request_id: types.RequestId, result: dict[str, Any]) -> None:
        body = json_bytes({"jsonrpc": "2.0", "id": request_id, "result": result})
        if body is None:  # not plain JSON: the model serializes it
            body = _dump(types.JSONRPCResponse(jsonrpc="2.0", id=request_id, result=result))
        await self.finish(body)

    async def fail(self, request_id: types.RequestId, error: types.ErrorData) -> None:
        await self.finish(_dump(types.JSONRPCError(jsonrpc="2.0", id=request_id, error=error)))

    async def finish(self, body: bytes) -> None:
        if self._lock is None:
            self._done = True
            await self._send({"type": "http.response.start", "status": 200,
                              "headers": _headers(self._session_id, len(body))})
            await self._send({"type": "http.response.body", "body": body})
            return
        await self._event(body, last=True)

    async def _message(self, message: types.JSONRPCMessage) -> None:
        if self._lock is None:
            self._lock = asyncio.Lock()
        await self._event(_dump(message), last=False)

    async def _event(self, data: bytes, *, last: bool) -> None:
        assert self._lock is not None
        async with self._lock:
            if self._done:
                log.debug("a message for an answered /mcp call was dropped")
                return
            if not self._streaming:
                self._streaming = True
                await self._send({"type": "http.response.start", "status": 200,
                                  "headers": _SSE_HEADERS + _session_header(self._session_id)})
                priming = priming_event(self._headers) if self._headers is not None else b""
                if priming:
                    await self._send({"type": "http.response.body", "more_body": True,
                                      "body": priming})
            self._done = last
            await self._send({"type": "http.response.body", "more_body": not last,
                              "body": b"event: message\ndata: " + data + b"\n\n"})


_SSE_HEADERS = [
    (b"content-type", b"text/event-stream"),
    (b"cache-control", b"no-cache, no-transform"),
    (b"x-accel-buffering", b"no"),
]


def _session_header(session_id: str) -> list[tuple[bytes, bytes]]:
    return [(b"mcp-session-id", session_id.encode())]


def _headers(session_id: str, length: int) -> list[tuple[bytes, bytes]]:
    return [(b"content-type", b"application/json"), (b"content-length", str(length).encode()),
            *_session_header(session_id)]


async def _accepted(send: Send, session_id: str) -> None:
    await send({"type": "http.response.start", "status": 202,
                "headers": _headers(session_id, 0)})
    await send({"type": "http.response.body", "body": b""})


def _dump(message: types.JSONRPCMessage) -> bytes:
    return message.model_dump_json(by_alias=True, exclude_unset=True).encode()


def _plain_post(scope: Scope) -> bool:
    """A JSON body the client accepts a JSON or an SSE answer to (else the SDK's path
    answers, with its 406 or 415): decided by `_decide_plain` once per pair of the first
    Content-Type and Accept headers (a client sends the same pair every time)."""
    key = _first_of(scope, b"content-type", b"accept")
    plain = _PLAIN.get(key)
    if plain is None:
        if len(_PLAIN) >= _PLAIN_KEPT:
            _PLAIN.clear()
        plain = _PLAIN[key] = _decide_plain(scope)
    return plain


def _first_of(scope: Scope, one: bytes, other: bytes) -> tuple[bytes | None, bytes | None]:
    """The first value of each of two headers (what Starlette's `Headers.get` reads)."""
    first = second = None
    for name, value in scope["headers"]:
        if name == one:
            first = value if first is None else first
        elif name == other:
            second = value if second is None else second
    return first, second


_PLAIN: dict[tuple[bytes | None, bytes | None], bool] = {}
_PLAIN_KEPT = 64


def _decide_plain(scope: Scope) -> bool:
    request = Request(scope)
    content_type = request.headers.get("content-type", "")
    if content_type.split(";", 1)[0].strip().lower() != "application/json":
        return False
    return all(check_accept_headers(request))


def _json_body(message: Message) -> dict[str, Any] | None:
    """The body as a JSON object, when it came whole in one message (the session manager's
    size limit has read and joined it)."""
    if message["type"] != "http.request" or message.get("more_body", False):
        return None
    try:
        value = json_depth.loads(message.get("body", b""))
    except ValueError:  # the SDK's path answers with its parse error
        return None
    return value if isinstance(value, dict) else None


def _answer(value: dict[str, Any]) -> types.JSONRPCResponse | types.JSONRPCError | None:
    try:
        if "error" in value:
            return types.JSONRPCError.model_validate(value, by_name=False)
        return types.JSONRPCResponse.model_validate(value, by_name=False)
    except ValidationError:
        return None


def _replay(first: Message, receive: Receive) -> Receive:
    pending = [first]

    async def replayed() -> Message:
        return pending.pop() if pending else await receive()

    return replayed


def guard_depth(manager: Any) -> None:
    """Put the nesting limit of every JSON input in front of `manager`'s request handling
    (`/mcp` and each `/mcp/NAME`), behind its body-size limit, which joins the body into one
    message."""
    limit = manager.asgi_app
    if isinstance(limit, RequestBodyLimitMiddleware):
        limit.app = _DepthGuard(limit.app)
    else:  # an SDK without the middleware: guard the whole app (bodies unjoined)
        manager.asgi_app = _DepthGuard(limit)


class _DepthGuard:
    """400 with a JSON-RPC parse error for a POST body nested deeper than `MAX_JSON_DEPTH`:
    the SDK's `json.loads` would accept it (or raise `RecursionError`, a plain-text 500)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        first = await receive()
        body = first.get("body", b"") if first["type"] == "http.request" else b""
        if not first.get("more_body", False) and _too_deep(body):
            error = types.JSONRPCError(jsonrpc="2.0", id=None, error=types.ErrorData(
                code=types.PARSE_ERROR, message=f"Parse error: {JsonTooDeep()}"))
            response = Response(error.model_dump_json(by_alias=True, exclude_unset=True),
                                status_code=400, media_type="application/json")
            await response(scope, receive, send)
            return
        await self.app(scope, _replay(first, receive), send)


def _too_deep(body: bytes) -> bool:
    if not json_depth.may_be_too_deep(body):  # most bodies: counted, not parsed twice
        return False
    try:
        json_depth.loads(body)
    except JsonTooDeep:
        return True
    except ValueError:
        return False  # malformed otherwise: the SDK answers it
    return False

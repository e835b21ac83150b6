"""The HTTP application of `sidecar serve` (`build_app`): the native API under `/v1`,
`/metrics`, the web console under `/ui`, and (when the MCP facade is mounted) `/mcp`, all
behind one `SecurityMiddleware` (the console authenticates with its own login cookie).

Imports the core, the rest of `sidecar.serve` and `bridges.mcp` (`CALLER_HEADERS`, which
`CallerHeaders` sets for each request: servers with `forward_headers` read it). Exports
`build_app`, `ReplicaHeader` and `CallerHeaders`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from bridges.mcp import CALLER_HEADERS
from sidecar.model.replica import REPLICA_HEADER, replica_id
from sidecar.serve.api import DEFAULT_MAX_BODY_BYTES, Api
from sidecar.serve.console import MinuteRing, console_routes
from sidecar.serve.identities import Identities, Identity, route_refusal
from sidecar.serve.metrics import Metrics
from sidecar.serve.security import SecurityMiddleware, TokenUnverifiable
from sidecar.serve.upstream_api import UpstreamApi
from sidecar.stores.database_down import database_label, unavailable_message
from sidecar.stores.tokens import verify_token

if TYPE_CHECKING:
    from sidecar.location.location import Location


def build_app(
    location: Location,
    *,
    token: str | None,
    allowed_hosts: Iterable[str] = (),
    extra_routes: Iterable[BaseRoute] = (),
    extra_lifespan: AbstractAsyncContextManager[Any] | None = None,
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
) -> Starlette:
    """`token=None` disables authentication (`--no-auth`); Host/Origin checks always apply.
    Besides `token` (every profile), the scoped tokens of `location.stores.tokens` are accepted.
    An endpoint of `extra_routes` with an `inner_middleware(app)` method has it put right inside
    `SecurityMiddleware` (`McpEndpoint`'s shortcut to its sessions)."""
    metrics = Metrics()
    callbacks = location.stores.login_callbacks
    if callbacks is not None:  # the browser comes back by the public name
        allowed_hosts = [*allowed_hosts, callbacks.host]
    events = location.new_event_log()
    api = Api(location, metrics=metrics, events=events, max_body_bytes=max_body_bytes)
    ring = MinuteRing()  # the console's plots of the last hour
    identities = Identities(location)
    quotas = identities.book
    api.quotas = quotas
    metrics.registry.register(quotas)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        location.seam.observers.append(metrics.observe)
        location.seam.observers.append(ring.observe)
        location.seam.limit_refusals.append(quotas.store_refused)
        sampler = asyncio.create_task(ring.sample_forever(location.seam.store.stats))
        location.call_listeners.append(metrics.observe_record)
        location.profiles.wrappers.append(quotas.reshape_profile)
        location.profiles.changed()  # served entries recomputed with the quota wrapper
        location.cancellers.append(api.cancel_here)  # cancel requests of other replicas
        await events.start()
        try:
            if extra_lifespan is not None:
                async with extra_lifespan:
                    yield
            else:
                yield
        finally:
            await api.calls.aclose()
            await api.auth.aclose()
            await identities.aclose()
            await events.aclose()
            location.seam.observers.remove(metrics.observe)
            location.seam.observers.remove(ring.observe)
            location.seam.limit_refusals.remove(quotas.store_refused)
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            location.call_listeners.remove(metrics.observe_record)
            location.profiles.wrappers.remove(quotas.reshape_profile)
            location.profiles.changed()
            location.cancellers.remove(api.cancel_here)

    async def scoped(secret: str) -> tuple[str, frozenset[str], str | None] | None:
        try:
            record = await verify_token(location.stores.tokens, secret)
        except Exception as exc:  # the fleet database down: 503, not a 500
            message = unavailable_message(exc, "the bearer token could not be checked",
                                          database_label(location.stores.database))
            if message is None:
                raise
            raise TokenUnverifiable(message) from exc
        if record is None:
            return None
        return record.id, frozenset(record.profiles), record.user

    def default_profile() -> str:
        return location.profiles.default_name

    def refusal(identity: Identity, path: str, method: str) -> str | None:
        return route_refusal(identity, path, method, default_profile)

    extra = list(extra_routes)
    # an extra route's endpoint may put a middleware right inside the security checks (the
    # MCP facade's shortcut from there to its sessions: `McpEndpoint.inner_middleware`)
    inner = [Middleware(wrap) for route in extra
             if callable(wrap := getattr(getattr(route, "endpoint", None), "inner_middleware",
                                         None))]
    app = Starlette(
        # `extra_routes` (the MCP facade's /mcp) first: Starlette tries routes in order, and
        # an MCP call should not be matched against every /v1 and /ui route before its own
        routes=[*extra, *api.routes(), *UpstreamApi(location).routes(),
                *console_routes(location, events, token, api.auth.begin, ring, identities)],
        middleware=[Middleware(ReplicaHeader), Middleware(CallerHeaders), Middleware(
            SecurityMiddleware, token=token, allowed_hosts=allowed_hosts, scoped=scoped,
            identify=identities.identify, route_refusal=refusal,
            default_profile=default_profile, own_auth_prefix="/ui",
        ), *inner],
        lifespan=lifespan,
        exception_handlers={HTTPException: _http_error, Exception: _server_error},
    )
    app.state.api = api
    app.state.identities = identities
    app.state.auth_required = token is not None  # what the MCP Server Cards say
    return app


class CallerHeaders:
    """Holds the request's headers in `CALLER_HEADERS` while it is served (no copy)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = CALLER_HEADERS.set(scope["headers"])
        try:
            await self.app(scope, receive, send)
        finally:
            CALLER_HEADERS.reset(given)


class ReplicaHeader:
    """Every HTTP answer says which replica gave it (`Sidecar-Replica`), refusals included:
    behind a load balancer that is how a client or an operator sees where a request went."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.header = (REPLICA_HEADER.lower().encode(), replica_id().encode())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def stamped(message: Message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", ()), self.header]}
            await send(message)

        await self.app(scope, receive, stamped)


_CODES = {404: "not_found", 405: "method_not_allowed"}


async def _http_error(request: Request, exc: Exception) -> Response:
    """Starlette's own errors (an unknown path: 404, a wrong method: 405) in the JSON error
    body every route uses, instead of plain text."""
    assert isinstance(exc, HTTPException)
    code = _CODES.get(exc.status_code, "http_error")
    message = (f"no route {request.method} {request.url.path}" if exc.status_code == 404
               else str(exc.detail))
    return JSONResponse({"error": {"code": code, "message": message}},
                        status_code=exc.status_code, headers=exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    """A defect: uvicorn logs the traceback; the client gets the JSON error body, not text."""
    return JSONResponse({"error": {"code": "internal_error",
                                   "message": "internal error; see the daemon log"}},
                        status_code=500)

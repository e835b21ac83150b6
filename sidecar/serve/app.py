"""The HTTP application of `sidecar serve`: the native API under `/v1`, `/metrics`, the web
console under `/ui`, and (when the MCP facade is mounted) `/mcp`, all behind one
`SecurityMiddleware` (the console authenticates with its own login cookie)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import BaseRoute

from sidecar.serve.api import DEFAULT_MAX_BODY_BYTES, Api
from sidecar.serve.console import console_routes
from sidecar.serve.event_log import EventLog
from sidecar.serve.metrics import Metrics
from sidecar.serve.security import SecurityMiddleware
from sidecar.tokens import verify_token

if TYPE_CHECKING:
    from sidecar.daemon import Location


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
    Besides `token` (every profile), the scoped tokens of `location.tokens` are accepted."""
    metrics = Metrics()
    events = EventLog(location.events)
    api = Api(location, metrics=metrics, events=events, max_body_bytes=max_body_bytes)

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        location.seam.observers.append(metrics.observe)
        location.call_listeners.append(metrics.observe_record)
        await events.start()
        try:
            if extra_lifespan is not None:
                async with extra_lifespan:
                    yield
            else:
                yield
        finally:
            await api.calls.aclose()
            await events.aclose()
            location.seam.observers.remove(metrics.observe)
            location.call_listeners.remove(metrics.observe_record)

    async def scoped(secret: str) -> frozenset[str] | None:
        if location.tokens is None:
            return None
        record = await verify_token(location.tokens, secret)
        return frozenset(record.profiles) if record is not None else None

    app = Starlette(
        routes=[*api.routes(), *console_routes(location, events, token), *extra_routes],
        middleware=[Middleware(
            SecurityMiddleware, token=token, allowed_hosts=allowed_hosts, scoped=scoped,
            default_profile=lambda: location.profiles.default_name, own_auth_prefix="/ui",
        )],
        lifespan=lifespan,
    )
    app.state.api = api
    return app

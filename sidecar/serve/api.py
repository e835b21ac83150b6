"""The native HTTP API (`/v1`) for agents that run their own model loop (`Api`).

Every error is JSON with a stable code: `{"error": {"code", "message", "field"?}}`. Bodies are
size-limited (413 `body_too_large`); malformed JSON is 400 `malformed_json`; wrong types,
missing and unknown fields are 422 `invalid_body` naming the field. No input reaches a 500.
`Api` serves tools, snapshots, calls, asks, events, health and metrics; the `/v1/calls` routes
are `calls_api`'s, `/v1/managed` is `managed_api`'s and requests are read by `api_requests`.

Imports the core, `sidecar.formats` and the rest of `sidecar.serve`. Exports `Api`,
`DefinitionsCache` and `DEFAULT_MAX_BODY_BYTES`, and again `ApiError`, `CallTracker`,
`JSONResponse`, `json_with`, `CANCEL_WAIT` and `SETTLE_WAIT`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import pydantic_core
from starlette.requests import Request
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from sidecar.codemode.tool_search import advertised
from sidecar.execution.snapshot import SnapshotExpired
from sidecar.formats import Format, definitions_for, input_from_strict
from sidecar.model import json_depth, tracing
from sidecar.model.replica import replica_id
from sidecar.model.tool import ToolContext
from sidecar.policy.permission_service import UnknownAsk
from sidecar.policy.pins import NotHeld
from sidecar.serve.api_bodies import CallBody, ReplyBody, SnapshotBody
from sidecar.serve.api_requests import (
    ApiError,
    JSONResponse,
    handled,
    json_with,
    query_format,
    read_body,
    request_owner,
)
from sidecar.serve.auth_api import AuthApi
from sidecar.serve.calls_api import (
    CANCEL_WAIT,
    SETTLE_WAIT,
    CallsApi,
    CallTracker,
    outcome_json,
)
from sidecar.serve.identities import user_of_scope
from sidecar.serve.identities.asks import CallUsers
from sidecar.serve.identities.quotas import UserQuotas
from sidecar.serve.listing_cache import ListingCache
from sidecar.serve.managed_api import ManagedApi
from sidecar.serve.metrics import CONTENT_TYPE, Metrics
from sidecar.serve.security import profile_allowed
from sidecar.serve.tool_tokens import profile_tokens, tool_tokens
from sidecar.serve.unavailable import UNAVAILABLE
from sidecar.stores.database_down import database_label, unavailable_message
from sidecar.stores.event_log import EventLog
from sidecar.stores.outcome_log import call_fingerprint, call_principal
from sidecar.stores.snapshot_records import SnapshotRecordsError

if TYPE_CHECKING:
    from sidecar.location.location import Location

__all__ = [
    "CANCEL_WAIT",
    "DEFAULT_MAX_BODY_BYTES",
    "SETTLE_WAIT",
    "Api",
    "ApiError",
    "CallTracker",
    "DefinitionsCache",
    "JSONResponse",
    "json_with",
]

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024


class DefinitionsCache:
    """Provider definitions of recent snapshots as JSON (see `listing_cache`): converting
    5,000 schemas, then encoding them (~9 ms here), happens once per registry state."""

    def __init__(self, size: int = 32) -> None:
        self._encoded = ListingCache[bytes](size)

    def encoded(
        self, fmt: Format, definitions: Any, *, strict: bool = False, deferred: Any = ()
    ) -> bytes:
        """`definitions` (and tool search's `deferred` ones) in `fmt` as compact JSON."""
        return self._encoded.get(
            (fmt, strict, len(definitions)), (*definitions, *deferred),
            lambda: pydantic_core.to_json(
                definitions_for(fmt, definitions, strict=strict, deferred=deferred)))


class Api:
    def __init__(
        self,
        location: Location,
        *,
        metrics: Metrics,
        events: EventLog,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        self.location = location
        self.metrics = metrics
        self.events = events
        self.calls = CallTracker()
        self.calls_api = CallsApi(location, self.calls)
        self.managed_api = ManagedApi(location)
        self.auth = AuthApi(location)
        self.call_users = CallUsers()
        """Which signed-in user started each call here: a user sees only their own asks."""
        self.quotas: UserQuotas | None = None
        """Per-user quotas (`[auth.quotas]`), set by the app: 429 `quota` before a call or a
        snapshot of a user over one."""
        self.definitions = DefinitionsCache()
        self.max_body_bytes = max_body_bytes
        self.health_extras: dict[str, Any] = {}
        """Added to `GET /v1/health` (the daemon sets `daemon`: who answers, for which state)."""

    def routes(self) -> list[Route]:
        h = handled
        return [
            Route("/v1/tools", h(self.list_tools), methods=["GET"]),
            Route("/v1/tools/{name}/approve", h(self.approve), methods=["POST"]),
            Route("/v1/snapshots", h(self.create_snapshot), methods=["POST"]),
            Route("/v1/snapshots/{snapshot_id}/calls", h(self.call), methods=["POST"]),
            *self.calls_api.routes(),
            *self.managed_api.routes(),
            Route("/v1/events", h(self.event_stream), methods=["GET"]),
            Route("/v1/permissions", h(self.permissions), methods=["GET"]),
            Route("/v1/permissions/{ask_id}/reply", h(self.reply), methods=["POST"]),
            Route("/v1/health", h(self.health), methods=["GET"]),
            *self.auth.routes(h),
            Route("/v1/openapi.json", h(self.openapi), methods=["GET"]),
            Route("/metrics", h(self.prometheus), methods=["GET"]),
        ]

    # --- endpoints -----------------------------------------------------------------------

    def _profile(self, request: Request, name: str | None) -> str | None:
        """`name` when this request may use that profile (None: the default one)."""
        profiles = self.location.profiles
        if name is not None and not profiles.exists(name):
            raise ApiError(404, "unknown_profile", f"no profile named {name!r}; known "
                           f"profiles: {', '.join(profiles.names())}", "profile")
        if not profile_allowed(request.scope, name or profiles.default_name):
            raise ApiError(403, "forbidden_profile", "this token does not reach profile "
                           f"{name or profiles.default_name!r}", "profile")
        return name

    async def list_tools(self, request: Request) -> Response:
        fmt = query_format(request)
        await self.location.definitions_checked()  # fingerprinted off the loop first
        wanted = request.query_params.get("profile")
        if wanted == "*":  # every tool, whichever profile serves it (`sidecar tools --all`)
            if not profile_allowed(request.scope, "*"):
                raise ApiError(403, "forbidden_profile", "only the all-access token lists "
                               "every tool (profile=*)", "profile")
            location = self.location
            served = location.profiles.entries(None, location.registry.effective())
            definitions = tuple(e.definition for e in served.values())
            listed, deferred = definitions, definitions[:0]
        else:
            snapshot = self.location.snapshot(
                hide_denied=False, keep=False, profile=self._profile(request, wanted))
            definitions = snapshot.definitions
            # a search profile: Anthropic gets every tool, the unlisted ones deferred
            listed, deferred = advertised(snapshot, native_search=fmt == "anthropic")
        tokens = await tool_tokens(self.location, definitions)
        return json_with({"format": fmt, **tokens.to_json()}, "tools",
                         self.definitions.encoded(fmt, listed, deferred=deferred))

    async def approve(self, request: Request) -> Response:
        """Accept a tool's changed upstream definition (`sidecar.policy.pins`)."""
        try:
            change = await self.location.pins.approve(request.path_params["name"])
        except NotHeld as exc:
            raise ApiError(404, "not_held", str(exc), "name") from None
        return JSONResponse({"approved": change.to_json()})

    def _quota(self, request: Request, what: str) -> str | None:
        """The signed-in user (None: none); 429 `quota` when they are over a quota."""
        user = user_of_scope(request.scope)
        refusal = self.quotas.refusal(user, what) if self.quotas is not None else None
        if refusal is not None:
            raise ApiError(429, "quota", refusal)
        return user

    async def create_snapshot(self, request: Request) -> Response:
        body = await read_body(request, SnapshotBody, self.max_body_bytes)
        user = self._quota(request, "snapshot")
        await self.location.definitions_checked()  # fingerprinted off the loop first
        snapshot = self.location.snapshot(
            session_id=body.session_id, allow=body.allow, deny=body.deny,
            final_step=body.final_step, codemode=body.codemode,
            profile=self._profile(request, body.profile), strict=body.strict,
            owner=request_owner(request), expose=body.expose,
        )
        listed, deferred = advertised(snapshot, native_search=body.format == "anthropic")
        try:
            await self.location.share_snapshot(snapshot)  # any replica of a fleet serves its id
        except SnapshotRecordsError as exc:
            raise self._unavailable(exc, f"snapshot {snapshot.id!r} could not be kept") from None
        if self.quotas is not None:
            self.quotas.snapshot_made(user)
        return json_with({
            "id": snapshot.id,
            "session_id": body.session_id,
            "profile": snapshot.profile,
            "tool_choice": snapshot.tool_choice,
            "format": body.format,
            "expires_in": self.location.snapshots.ttl_seconds,
        }, "definitions", self.definitions.encoded(body.format, listed, strict=body.strict,
                                                   deferred=deferred), status_code=201)

    async def call(self, request: Request) -> Response:
        body = await read_body(request, CallBody, self.max_body_bytes)
        try:
            snapshot = await self.location.find_snapshot(request.path_params["snapshot_id"])
        except SnapshotExpired as exc:
            raise ApiError(404, "snapshot_expired", str(exc), "snapshot_id") from None
        except SnapshotRecordsError as exc:
            raise self._unavailable(exc, "the snapshot could not be read") from None
        if not profile_allowed(request.scope, snapshot.profile or ""):
            raise ApiError(403, "forbidden_profile", "this token does not reach profile "
                           f"{snapshot.profile!r}", "snapshot_id")
        self.call_users.started(body.context.call_id, self._quota(request, "call"))
        c = body.context
        context = ToolContext(c.session_id, c.agent, c.message_id, c.call_id,
                              owner=request_owner(request))
        raw_input: Any = body.input
        entry = snapshot.entry(body.name)
        # Advertised with OpenAI strict schemas: models send null for optional properties
        # there, which the original schemas may not accept.
        if snapshot.recipe is not None and snapshot.recipe.strict and entry is not None:
            if isinstance(raw_input, str):
                try:
                    raw_input = json_depth.loads(raw_input)
                except ValueError:
                    pass  # the seam reports invalid JSON as invalid_input
            raw_input = input_from_strict(entry.definition.input_schema, raw_input)
        def fingerprint() -> str:
            return call_fingerprint(body.name, raw_input, c.session_id, c.agent,
                                    call_principal(context.owner, snapshot.profile))

        with tracing.continued(request.headers):  # the call's task starts in the client's trace
            task = self.calls.start(
                c.call_id, fingerprint, lambda: snapshot.execute(body.name, raw_input, context)
            )
        if "respond-async" in request.headers.get("prefer", ""):
            return JSONResponse(
                {"call_id": c.call_id, "status": "running"},
                status_code=202,
                headers={"location": f"/v1/calls/{c.call_id}"},
            )
        try:
            outcome = await asyncio.shield(task)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not task.cancelled() or (current is not None and current.cancelling()):
                raise
            raise ApiError(409, "cancelled", f"call {c.call_id} was cancelled") from None
        return JSONResponse(outcome_json(outcome, body.format, body.tool_call_id))

    async def cancel_here(self, call_id: str) -> str:
        """Another replica's cancel request (`Location.cancellers`): `CallsApi.cancel_here`."""
        return await self.calls_api.cancel_here(call_id)

    async def event_stream(self, request: Request) -> Response:
        raw = request.headers.get("last-event-id")
        if raw is None:
            raw = request.query_params.get("last_event_id")
        last_id: int | None = None
        if raw is not None:
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 18):
                raise ApiError(400, "invalid_parameter", "Last-Event-ID must be an integer",
                               "last_event_id")
            last_id = int(raw)

        async def stream() -> AsyncIterator[str]:
            yield ": mcp-sidecar events\n\n"
            async for event in self.events.follow(last_id):
                yield event.sse()

        return StreamingResponse(
            stream(), media_type="text/event-stream",
            headers={"cache-control": "no-cache", "x-accel-buffering": "no"},
        )

    async def permissions(self, request: Request) -> Response:
        session = request.query_params.get("session_id")
        pending = self.call_users.visible(request.scope,
                                          await self.location.permissions.listed(session))
        return JSONResponse({"pending": [p.to_json() for p in pending]})

    async def reply(self, request: Request) -> Response:
        body = await read_body(request, ReplyBody, self.max_body_bytes)
        ask_id = request.path_params["ask_id"]
        if user_of_scope(request.scope) is not None and not any(
                a.id == ask_id for a in self.call_users.visible(
                    request.scope, await self.location.permissions.listed())):
            raise ApiError(404, "unknown_ask", f"no pending ask {ask_id!r} of a call of "
                           f"{user_of_scope(request.scope)}", "ask_id")
        try:
            await self.location.permissions.reply(
                ask_id, body.reply, feedback=body.feedback, scope=body.scope
            )
        except UnknownAsk as exc:
            raise ApiError(404, "unknown_ask", str(exc), "ask_id") from None
        return JSONResponse({"id": ask_id, "reply": body.reply})

    async def health(self, request: Request) -> Response:
        """200 while this replica can serve; 503 when it cannot (`status` "unavailable": its
        fleet database does not answer), unless `?probe=liveness`: the process answers, so
        it need not be restarted (a liveness probe must not restart replicas for a database
        outage)."""
        probe = request.query_params.get("probe", "readiness")
        if probe not in ("readiness", "liveness"):
            raise ApiError(400, "invalid_parameter", "probe must be readiness or liveness",
                           "probe")
        report = {**await self.location.health(), "replica": replica_id(),
                  **self.health_extras}
        ready = report.get("status") != "unavailable"
        return JSONResponse(report, status_code=200 if ready or probe == "liveness" else 503)

    def _unavailable(self, exc: SnapshotRecordsError, what: str) -> ApiError:
        message = unavailable_message(exc, what, database_label(self.location.stores.database))
        return ApiError(503, UNAVAILABLE, message or f"the fleet database is unavailable: {exc}")

    async def openapi(self, request: Request) -> Response:
        from sidecar.serve.openapi import openapi_document

        return JSONResponse(openapi_document())

    async def prometheus(self, request: Request) -> Response:
        report = await self.location.health()
        if self.quotas is not None:
            await self.quotas.read_store()  # bytes per user in the managed store
        body = await self.metrics.render(self.location.seam.store.stats,
                                         report.get("servers", {}), report.get("state"),
                                         report.get("rate_limited"),
                                         await profile_tokens(self.location),
                                         self.location.guardrails.counts)
        return Response(body, media_type=CONTENT_TYPE)


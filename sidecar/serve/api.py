"""The native HTTP API (`/v1`) for agents that run their own model loop (`Api`).

Every error is JSON with a stable code: `{"error": {"code", "message", "field"?}}`. Bodies are
size-limited (413 `body_too_large`); malformed JSON is 400 `malformed_json`; wrong types,
missing and unknown fields are 422 `invalid_body` naming the field. No input reaches a 500.

Imports the core, `sidecar.formats`, `managed_store` and the rest of `sidecar.serve`. Exports
`Api`, `ApiError`, `CallTracker`, `DefinitionsCache`, `JSONResponse`, `json_with` and
`DEFAULT_MAX_BODY_BYTES`.
"""

from __future__ import annotations

import asyncio
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, TypeVar

import pydantic_core
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse as StarletteJSONResponse
from starlette.responses import Response, StreamingResponse
from starlette.routing import Route

from managed_store import (
    InvalidPattern,
    InvalidRef,
    ManagedNotFound,
    SearchTimeout,
    TooManySearches,
)
from sidecar.codemode.tool_search import advertised
from sidecar.execution.managed_read import search_owner
from sidecar.execution.snapshot import SnapshotExpired
from sidecar.formats import (
    FORMATS,
    Format,
    UnknownFormat,
    definitions_for,
    input_from_strict,
    parse_format,
    result_for,
)
from sidecar.model import json_depth, tracing
from sidecar.model.json_depth import JsonTooDeep
from sidecar.model.outcome import Outcome
from sidecar.model.replica import replica_id
from sidecar.model.tool import ToolContext
from sidecar.policy.permission_service import UnknownAsk
from sidecar.policy.pins import NotHeld
from sidecar.serve.api_bodies import CallBody, ReplyBody, SnapshotBody
from sidecar.serve.auth_api import AuthApi
from sidecar.serve.identities import user_of_scope
from sidecar.serve.identities.asks import CallUsers
from sidecar.serve.identities.history import own_history
from sidecar.serve.identities.quotas import UserQuotas
from sidecar.serve.listing_cache import ListingCache
from sidecar.serve.metrics import CONTENT_TYPE, Metrics
from sidecar.serve.security import profile_allowed, token_owner
from sidecar.serve.tool_tokens import profile_tokens, tool_tokens
from sidecar.serve.unavailable import UNAVAILABLE, route_unavailable
from sidecar.stores.call_history import CallQuery, InvalidQuery
from sidecar.stores.database_down import database_label, unavailable_message
from sidecar.stores.event_log import EventLog
from sidecar.stores.outcome_log import call_fingerprint, call_principal
from sidecar.stores.snapshot_records import SnapshotRecordsError

if TYPE_CHECKING:
    from sidecar.location.location import Location

DEFAULT_MAX_BODY_BYTES = 4 * 1024 * 1024
CANCEL_WAIT = 5.0
"""Seconds a DELETE of a call running on another replica waits for that replica's answer."""
SETTLE_WAIT = 2.0
"""Seconds a cancel requested by another replica waits for the call to end here."""
_FINISHED_KEEP = 1024
_FINISHED_TTL = 600.0

M = TypeVar("M", bound=BaseModel)


class JSONResponse(StarletteJSONResponse):
    """JSON rendered by pydantic-core (Rust): the same compact UTF-8 JSON as Starlette's,
    several times faster for large bodies such as 5,000 tool definitions."""

    def render(self, content: Any) -> bytes:
        return pydantic_core.to_json(content)


class ApiError(Exception):
    def __init__(self, status: int, code: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field

    def response(self) -> JSONResponse:
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.field is not None:
            error["field"] = self.field
        return JSONResponse({"error": error}, status_code=self.status)


@dataclass(slots=True)
class _Running:
    task: asyncio.Task[Outcome]
    started: float
    fingerprint: Callable[[], str]


class CallTracker:
    """Calls in flight (cancellable by id) and recently finished ones (with their output)."""

    def __init__(self) -> None:
        self.running: dict[str, _Running] = {}
        self._finished: OrderedDict[str, tuple[float, Outcome]] = OrderedDict()

    def start(self, call_id: str, fingerprint: Callable[[], str],
              run: Callable[[], Any]) -> asyncio.Task[Outcome]:
        """The task of the call running under `call_id` when it is this call (`fingerprint`,
        as `call_fingerprint`, computed only then), else a new one. Another call under a
        running id runs untracked: the seam refuses it (`conflict`); the running one keeps
        the id."""
        current = self.running.get(call_id)
        if current is not None and current.fingerprint() == fingerprint():
            return current.task
        task: asyncio.Task[Outcome] = asyncio.create_task(run(), name=f"call:{call_id}")
        if current is None:
            self.running[call_id] = _Running(task, time.time(), fingerprint)
            task.add_done_callback(lambda t: self._done(call_id, t))
        return task

    def _done(self, call_id: str, task: asyncio.Task[Outcome]) -> None:
        self.running.pop(call_id, None)
        # a refused call (not admitted, or another call's id) never stands for the id
        if not task.cancelled() and task.exception() is None and not task.result().refused:
            self._finished[call_id] = (time.monotonic(), task.result())
            while len(self._finished) > _FINISHED_KEEP:
                self._finished.popitem(last=False)

    def finished(self, call_id: str) -> Outcome | None:
        entry = self._finished.get(call_id)
        if entry is None or time.monotonic() - entry[0] > _FINISHED_TTL:
            return None
        return entry[1]

    async def aclose(self) -> None:
        tasks = [r.task for r in self.running.values()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)


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


def json_with(
    fields: dict[str, Any], name: str, encoded: bytes, status_code: int = 200
) -> Response:
    """A JSON object response: `fields`, then `name` whose value is JSON encoded already."""
    head = pydantic_core.to_json(fields)
    joined = head[:-1] + (b"," if fields else b"") + pydantic_core.to_json(name) + b":"
    return Response(joined + encoded + b"}", status_code=status_code,
                    media_type="application/json")


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
        h = _handled
        return [
            Route("/v1/tools", h(self.list_tools), methods=["GET"]),
            Route("/v1/tools/{name}/approve", h(self.approve), methods=["POST"]),
            Route("/v1/snapshots", h(self.create_snapshot), methods=["POST"]),
            Route("/v1/snapshots/{snapshot_id}/calls", h(self.call), methods=["POST"]),
            Route("/v1/calls", h(self.call_history), methods=["GET"]),
            Route("/v1/calls/{call_id}", h(self.call_state), methods=["GET", "DELETE"]),
            Route("/v1/managed/{ref}", h(self.managed), methods=["GET"]),
            Route("/v1/events", h(self.event_stream), methods=["GET"]),
            Route("/v1/permissions", h(self.permissions), methods=["GET"]),
            Route("/v1/permissions/{ask_id}/reply", h(self.reply), methods=["POST"]),
            Route("/v1/health", h(self.health), methods=["GET"]),
            *self.auth.routes(h),
            Route("/v1/openapi.json", h(self.openapi), methods=["GET"]),
            Route("/metrics", h(self.prometheus), methods=["GET"]),
        ]

    # --- request helpers -----------------------------------------------------------------

    async def _body(self, request: Request, model: type[M]) -> M:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_body_bytes:
            raise ApiError(413, "body_too_large", f"the body is over {self.max_body_bytes} bytes")
        chunks: list[bytes] = []
        size = 0
        async for chunk in request.stream():
            size += len(chunk)
            if size > self.max_body_bytes:
                raise ApiError(
                    413, "body_too_large", f"the body is over {self.max_body_bytes} bytes"
                )
            chunks.append(chunk)
        try:
            data = json_depth.loads(b"".join(chunks) or b"null")
        except JsonTooDeep as exc:
            raise ApiError(400, "malformed_json", f"the body is not accepted: {exc}") from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ApiError(400, "malformed_json", f"the body is not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ApiError(422, "invalid_body", "the body must be a JSON object", "$")
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            first = exc.errors(include_url=False)[0]
            field = ".".join(str(p) for p in first["loc"]) or "$"
            raise ApiError(422, "invalid_body", f"{field}: {first['msg']}", field) from None

    @staticmethod
    def _format(request: Request, default: str = "mcp") -> Format:
        try:
            return parse_format(request.query_params.get("format", default))
        except UnknownFormat:
            raise ApiError(
                400, "invalid_parameter", f"format must be one of {', '.join(FORMATS)}", "format"
            ) from None

    @staticmethod
    def _int(request: Request, name: str, default: int, minimum: int, maximum: int) -> int:
        raw = request.query_params.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)
        except ValueError:
            raise ApiError(400, "invalid_parameter", f"{name} must be an integer", name) from None
        if not minimum <= value <= maximum:
            raise ApiError(
                400, "invalid_parameter", f"{name} must be in {minimum}..{maximum}", name
            )
        return value

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
        fmt = self._format(request)
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
        body = await self._body(request, SnapshotBody)
        user = self._quota(request, "snapshot")
        await self.location.definitions_checked()  # fingerprinted off the loop first
        snapshot = self.location.snapshot(
            session_id=body.session_id, allow=body.allow, deny=body.deny,
            final_step=body.final_step, codemode=body.codemode,
            profile=self._profile(request, body.profile), strict=body.strict,
            owner=_owner(request), expose=body.expose,
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
        body = await self._body(request, CallBody)
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
                              owner=_owner(request))
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
        return JSONResponse(self._outcome_json(outcome, body.format, body.tool_call_id))

    @staticmethod
    def _outcome_json(outcome: Outcome, fmt: Format | None, tool_call_id: str | None) -> Any:
        """The outcome, plus its provider wire value when `fmt` is given. The wire value's
        call id is the model's (`tool_call_id`); without one, OpenAI and Anthropic get our
        call id (they require one) and Gemini none."""
        data = outcome.to_json()
        data["replayed"] = outcome.replayed
        if fmt is not None:
            if tool_call_id is None:
                tool_call_id = "" if fmt == "gemini" else outcome.call_id
            data["wire"] = result_for(fmt, outcome, tool_call_id=tool_call_id)
        return data

    async def call_history(self, request: Request) -> Response:
        history = self.location.stores.history
        if history is None:
            raise ApiError(404, "no_history", "this daemon keeps no call history")
        fmt = request.query_params.get("format", "json")
        if fmt not in ("json", "jsonl"):
            raise ApiError(400, "invalid_parameter", "format must be json or jsonl", "format")
        try:
            query = CallQuery.from_params(request.query_params)
        except InvalidQuery as exc:
            raise ApiError(400, "invalid_parameter", str(exc), exc.field) from None
        narrowed = own_history(request.scope, query)
        if isinstance(narrowed, str):
            raise ApiError(403, "forbidden_role", narrowed, "user")
        query = narrowed
        if fmt == "json":
            rows, cursor = await history.query(query)
            return JSONResponse({"calls": [r.to_json() for r in rows], "next_cursor": cursor})

        async def lines() -> AsyncIterator[bytes]:
            page: CallQuery | None = query
            while page is not None:
                rows, cursor = await history.query(page)
                for row in rows:
                    yield pydantic_core.to_json(row.to_json()) + b"\n"
                page = None if cursor is None else replace(page, cursor=cursor)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    async def call_state(self, request: Request) -> Response:
        """One route for both methods, so a 405 names both in `Allow`."""
        if request.method == "DELETE":
            return await self.cancel_call(request)
        return await self.get_call(request)

    async def get_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        running = self.calls.running.get(call_id)
        if running is not None:
            return JSONResponse({"call_id": call_id, "status": "running",
                                 "started_at": running.started})
        outcome = self.calls.finished(call_id) or await self.location.outcome(call_id)
        if outcome is None:
            elsewhere = await self.location.running_on(call_id)
            if elsewhere is not None:  # a fleet: another replica runs it
                return JSONResponse({"call_id": call_id, "status": "running",
                                     "replica": elsewhere})
            if (outcome := await self._settled_meanwhile(call_id)) is None:
                raise ApiError(404, "unknown_call", f"no call {call_id!r} is running or settled")
        fmt = self._format(request) if "format" in request.query_params else None
        return JSONResponse(self._outcome_json(outcome, fmt, None))

    async def cancel_call(self, request: Request) -> Response:
        call_id = request.path_params["call_id"]
        running = self.calls.running.get(call_id)
        if running is None:
            if self.calls.finished(call_id) or await self.location.outcome(call_id):
                raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
            elsewhere = await self.location.running_on(call_id)
            if elsewhere is not None:
                return await self._cancel_elsewhere(call_id, elsewhere)
            if await self._settled_meanwhile(call_id):
                raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
            raise ApiError(404, "unknown_call", f"no call {call_id!r} is running")
        running.task.cancel()
        return JSONResponse({"call_id": call_id, "status": "cancelling"}, status_code=202)

    async def _settled_meanwhile(self, call_id: str) -> Outcome | None:
        """A call with no outcome, then no claim: another replica may have settled it in
        between (outcome stored as its claim is deleted), so look again before a 404."""
        return await self.location.outcome(call_id)

    async def _cancel_elsewhere(self, call_id: str, replica: str) -> Response:
        """A fleet: `replica` holds the call's claim. It cancels the call as a local DELETE
        would (`cancel_here`) and answers; 409 `running_elsewhere` when it cannot."""
        answer = None
        cancels = self.location.stores.cancels
        if cancels is not None and replica != replica_id():  # here: not a /v1 call
            answer = await cancels.request(call_id, replica, wait=CANCEL_WAIT)
        if answer == "cancelling":
            return JSONResponse({"call_id": call_id, "status": "cancelling",
                                 "replica": replica}, status_code=202)
        if answer is None and replica != replica_id():
            raise ApiError(409, "running_elsewhere", f"call {call_id!r} runs on replica "
                           f"{replica!r}, which did not answer the cancel request within "
                           f"{CANCEL_WAIT:g} s (down, stalled, or cut off from the database); "
                           "if it is down, its claim expires and the call may be retried")
        # it ended meanwhile, or runs there outside /v1 (an /mcp or stdio call)
        if await self.location.outcome(call_id):
            raise ApiError(409, "already_settled", f"call {call_id!r} has already settled")
        if await self.location.running_on(call_id) is None:
            raise ApiError(404, "unknown_call", f"no call {call_id!r} is running")
        raise ApiError(409, "running_elsewhere", f"call {call_id!r} runs on replica "
                       f"{replica!r} outside /v1 (an /mcp or stdio call): /v1 cannot cancel it")

    async def cancel_here(self, call_id: str) -> str:
        """Another replica's cancel request (`Location.cancellers`): what a local DELETE
        does, then a moment (`SETTLE_WAIT`) for the call to end and release its claim."""
        running = self.calls.running.get(call_id)
        if running is None:
            return "not_running"
        running.task.cancel()
        await asyncio.wait([running.task], timeout=SETTLE_WAIT)
        return "cancelling"

    async def managed(self, request: Request) -> Response:
        ref = request.path_params["ref"]
        store = self.location.seam.store
        pattern = request.query_params.get("pattern")
        try:
            if pattern is not None:
                limit = self._int(request, "limit", 100, 1, 10_000)
                context = self._int(request, "context", 0, 0, 50)
                found = await store.grep(ref, pattern, max_matches=limit, context=context,
                                         owner=search_owner(_owner(request)))
                return JSONResponse({
                    "ref": ref,
                    "pattern": pattern,
                    "truncated": found.truncated,
                    "matches": [
                        {"line": m.line, "text": m.text, "before": list(m.before),
                         "after": list(m.after)}
                        for m in found.matches
                    ],
                })
            offset = self._int(request, "offset", 1, 1, 2**62)
            if request.query_params.get("start") is not None:
                start = self._int(request, "start", 0, 0, 2**62)
                length = self._int(request, "length", 20_000, 1, 1_000_000)
                chars = await store.read_chars(ref, line=offset, start=start, length=length)
                return JSONResponse({
                    "ref": ref,
                    "text": chars.text,
                    "line": chars.line,
                    "start": chars.start,
                    "next_start": chars.next_start,
                    "end_of_line": chars.end_of_line,
                    "total_lines": chars.ref.lines,
                    "total_bytes": chars.ref.size_bytes,
                })
            limit = self._int(request, "limit", 200, 1, 10_000)
            part = await store.read_lines(ref, offset=offset, limit=limit)
        except InvalidRef as exc:
            raise ApiError(400, "invalid_ref", str(exc), "ref") from None
        except ManagedNotFound as exc:
            raise ApiError(404, "unknown_ref", str(exc), "ref") from None
        except InvalidPattern as exc:
            raise ApiError(400, "invalid_parameter", str(exc), "pattern") from None
        except SearchTimeout as exc:
            raise ApiError(422, "search_timeout", str(exc), "pattern") from None
        except TooManySearches as exc:
            raise ApiError(429, "too_many_searches", str(exc), "pattern") from None
        except ValueError as exc:
            raise ApiError(400, "invalid_parameter", str(exc)) from None
        return JSONResponse({
            "ref": ref,
            "text": part.text,
            "first_line": part.first_line,
            "last_line": part.last_line,
            "total_lines": part.ref.lines,
            "total_bytes": part.ref.size_bytes,
            "eof": part.eof,
        })

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
        body = await self._body(request, ReplyBody)
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


def _handled(endpoint: Callable[[Request], Any]) -> Callable[[Request], Any]:
    async def run(request: Request) -> Response:
        try:
            response: Response = await endpoint(request)
        except ApiError as exc:
            return exc.response()
        except ClientDisconnect:  # gone (or timed out) mid-body: nobody reads an answer
            return Response(status_code=400)
        except Exception as exc:  # the fleet database down: 503 naming it; else a defect (500)
            message = route_unavailable(endpoint, exc)
            if message is None:
                raise
            return ApiError(503, UNAVAILABLE, message).response()
        return response

    return run


def _owner(request: Request) -> str | None:
    """The client per-client limits count against: the scoped token the request came with
    (None: the all-access token; the managed store then counts the call's session)."""
    return token_owner(request.scope)

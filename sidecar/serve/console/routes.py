"""The console's routes (`/ui/...`): each handler gathers data from the Location and renders it.
Imports the core, `managed_store` and the rest of the console. Exports `Console` and
`console_routes`.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
import urllib.parse
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response, StreamingResponse
from starlette.routing import BaseRoute, Route

from bridges.mcp.oauth import grant_status, user_grant_key
from managed_store import InvalidRef, ManagedNotFound
from sidecar.model.permissions import Reply
from sidecar.model.token_count import ENCODING
from sidecar.policy.permission_service import RuleScope, UnknownAsk
from sidecar.policy.pins import NotHeld
from sidecar.serve.console import pages
from sidecar.serve.console.auth import ConsoleSession, ConsoleSessions
from sidecar.serve.console.detail_pages import ALL_TOOLS
from sidecar.serve.console.detail_routes import BadInput, DetailPages
from sidecar.serve.console.minute_ring import MinuteRing
from sidecar.serve.console.oidc_login import BINDING_COOKIE, OidcLogins, SignInFailed
from sidecar.serve.identities import Identities
from sidecar.serve.tool_tokens import tool_tokens
from sidecar.stores.call_history import CallQuery, InvalidQuery
from sidecar.stores.database_down import database_label, unavailable_message
from sidecar.stores.event_log import EventLog

if TYPE_CHECKING:
    from sidecar.location.location import Location

Handler = Callable[[Request, ConsoleSession], Awaitable[Response]]
BeginLogin = Callable[[str], Awaitable[dict[str, Any] | None]]
DOWNLOAD_CHUNK = 1024 * 1024
_REPLIES: dict[str, Reply] = {"once": "once", "always": "always", "reject": "reject"}
_SCOPES: dict[str, RuleScope] = {"session": "session", "location": "location"}
EXPORT_ROWS = 100_000


_BadInput = BadInput


LOGIN_BODY_LIMIT = 16 * 1024
"""The largest `/ui/login` body read (a token is 43 characters): checked before the token,
and nothing of it is written to disk."""


def _digest(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


def _policy(script: str = "") -> str:
    """The Content-Security-Policy of a console page: nothing but the console's own style and
    `script` (a `<script>` element, allowed by its hash) runs; no framing, forms post only to
    the console."""
    body = script.removeprefix("<script>").removesuffix("</script>")
    scripts = _digest(body) if script else "'none'"
    return (f"default-src 'none'; style-src {_STYLE_HASH}; script-src {scripts}; "
            "connect-src 'self'; img-src 'self' data:; form-action 'self'; "
            "frame-ancestors 'none'; "
            "base-uri 'none'")


_STYLE_HASH = _digest(pages.STYLE)
SECURITY_HEADERS = {
    "content-security-policy": _policy(), "x-frame-options": "DENY",
    "x-content-type-options": "nosniff", "referrer-policy": "same-origin",
}
"""Sent with every console answer; a page with a script sends its own policy. The referrer
policy is `same-origin`, not `no-referrer`: with the latter a browser's form POST says
`Origin: null`, which the Origin check refuses."""


def _secured(endpoint: Callable[[Request], Awaitable[Response]],
             ) -> Callable[[Request], Awaitable[Response]]:
    async def run(request: Request) -> Response:
        response = await endpoint(request)
        for name, value in SECURITY_HEADERS.items():
            response.headers.setdefault(name, value)
        return response
    return run


def _page(title: str, body: str, session: ConsoleSession, active: str, script: str = "",
          status: int = 200) -> HTMLResponse:
    return HTMLResponse(pages.layout(title, body, csrf=session.csrf, active=active,
                                     script=script), status_code=status,
                        headers={"cache-control": "no-store",
                                 "content-security-policy": _policy(script)})


async def _login_token(request: Request) -> str | None:
    """The `token` field of a login form, read into memory up to `LOGIN_BODY_LIMIT` bytes;
    `_TooLarge` past it (or when Content-Length says so), None without one."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != (
            "application/x-www-form-urlencoded"):
        return None
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > LOGIN_BODY_LIMIT:
        raise _TooLarge()
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > LOGIN_BODY_LIMIT:
            raise _TooLarge()
    fields = urllib.parse.parse_qs(body.decode("latin-1"), max_num_fields=16)
    values = fields.get("token")
    return values[0] if values else None


class _TooLarge(Exception):
    pass


def _events_url(events: EventLog) -> str:
    return f"/ui/events?after={events.last_id}"


USER_PAGES = ("/ui", "/ui/tools", "/ui/calls", "/ui/calls.jsonl", "/ui/managed",
              "/ui/logout")
"""What a console session of the role `user` reaches (its own history only); operators and
admins reach every page."""


class Console:
    def __init__(self, location: Location, events: EventLog, token: str | None,
                 begin_login: BeginLogin | None = None, ring: MinuteRing | None = None,
                 identities: Identities | None = None) -> None:
        self.location = location
        self.events = events
        self.sessions = ConsoleSessions(token)
        self.begin_login = begin_login
        self.details = DetailPages(location, _page, ring)
        self.oidc = OidcLogins(identities) if identities is not None else None
        self.identities = identities

    def routes(self) -> list[BaseRoute]:
        def g(handler: Handler) -> Callable[[Request], Awaitable[Response]]:
            return _secured(self._guarded(handler))

        return [
            Route("/ui/login", _secured(self.login), methods=["GET", "POST"]),
            Route("/ui/login/oidc", _secured(self.oidc_begin), methods=["GET"]),
            Route("/ui/login/callback", _secured(self.oidc_callback), methods=["GET"]),
            Route("/ui/logout", g(self.logout), methods=["POST"]),
            Route("/ui", g(self.servers), methods=["GET"]),
            Route("/ui/servers/{name}/login", g(self.server_login), methods=["POST"]),
            Route("/ui/tools", g(self.tools), methods=["GET"]),
            Route("/ui/tools/{name}/approve", g(self.approve), methods=["POST"]),
            Route("/ui/calls", g(self.calls), methods=["GET"]),
            Route("/ui/calls.jsonl", g(self.export), methods=["GET"]),
            Route("/ui/events", g(self.live), methods=["GET"]),
            Route("/ui/asks", g(self.asks), methods=["GET"]),
            Route("/ui/asks/{ask_id}", g(self.reply), methods=["POST"]),
            Route("/ui/managed", g(self.managed), methods=["GET"]),
            Route("/ui/managed/{ref}/download", g(self.download), methods=["GET"]),
            *(Route(path, g(handler), methods=[method])
              for path, handler, method in self.details.routes()),
        ]

    def _guarded(self, handler: Handler) -> Callable[[Request], Awaitable[Response]]:
        async def run(request: Request) -> Response:
            session = self.sessions.session(request)
            if session is None:
                if request.method == "GET" and request.url.path != "/ui/events":
                    return RedirectResponse("/ui/login", status_code=303)
                return Response("log in first", status_code=401)
            if session.role == "user" and not (
                    request.url.path in USER_PAGES or request.url.path.startswith(
                        "/ui/managed/") or _own_login(request)):
                return _page("Not for your role", f'<p class="bad">{pages.e(session.user)} has '
                             f"the role user: this page is for operators.</p>", session, "",
                             status=403)
            if request.method == "POST":
                form = await request.form()
                given = form.get("csrf")
                if not self.sessions.csrf_ok(session, given if isinstance(given, str) else None):
                    return Response("the form is stale or forged: reload the page",
                                    status_code=403)
            try:
                return await handler(request, session)
            except _BadInput as exc:
                return _page("Bad request", f'<p class="bad">{pages.e(exc)}</p>', session, "",
                             status=400)
            except Exception as exc:  # the fleet database down: say so (503), not a 500
                message = unavailable_message(exc, "this page could not be shown",
                                              database_label(self.location.stores.database))
                if message is None:
                    raise
                return _page("Unavailable", f'<p class="bad">{pages.e(message)}</p>', session,
                             "", status=503)
        return run

    async def login(self, request: Request) -> Response:
        if request.method == "GET":
            if self.sessions.session(request) is not None:
                return RedirectResponse("/ui", status_code=303)
            return HTMLResponse(pages.login_page(None, self._provider()))
        try:
            token = await _login_token(request)
        except (_TooLarge, ValueError):
            return HTMLResponse(pages.login_page(
                f"The login form is larger than {LOGIN_BODY_LIMIT} bytes or has too many "
                "fields."), status_code=413)
        if token is None or not self.sessions.token_ok(token):
            return HTMLResponse(pages.login_page("That token is not this daemon's."),
                                status_code=401)
        response = RedirectResponse("/ui", status_code=303)
        self.sessions.start(response)
        return response

    def _provider(self) -> str | None:
        return self.oidc.provider if self.oidc is not None else None

    async def oidc_begin(self, request: Request) -> Response:
        if self.oidc is None:
            return HTMLResponse(pages.login_page("no identity provider is configured"), 404)
        try:
            url, binding = await self.oidc.begin(request)
        except SignInFailed as exc:
            return HTMLResponse(pages.login_page(str(exc), self._provider()), status_code=503)
        response = RedirectResponse(url, status_code=303)
        response.set_cookie(BINDING_COOKIE, binding, max_age=600, path="/ui/login",
                            httponly=True, samesite="lax")
        return response

    async def oidc_callback(self, request: Request) -> Response:
        if self.oidc is None:
            return HTMLResponse(pages.login_page("no identity provider is configured"), 404)
        try:
            identity = await self.oidc.finish(request)
        except SignInFailed as exc:
            return HTMLResponse(pages.login_page(str(exc), self._provider()), status_code=401)
        # A page, not a redirect: the session cookie is SameSite=Strict, and a browser does
        # not send it on a redirect chain that began at the provider's site.
        response = HTMLResponse(pages.layout("Signed in", (
            f'<meta http-equiv="refresh" content="0;url=/ui"><p>Signed in as '
            f"<strong id=signed-in>{pages.e(identity.user)}</strong> ({pages.e(identity.role)}). "
            f'<a href="/ui">Continue to the console</a></p>'), csrf=None))
        self.sessions.start(response, identity.user, identity.role)
        response.delete_cookie(BINDING_COOKIE, path="/ui/login", httponly=True, samesite="lax")
        return response

    async def logout(self, request: Request, session: ConsoleSession) -> Response:
        response = RedirectResponse("/ui/login", status_code=303)
        self.sessions.end(request, response)
        return response

    async def servers(self, request: Request, session: ConsoleSession) -> Response:
        health = await self.location.health()
        quotas = await self._quotas(session)
        if session.role == "user":  # a user: who they are, their own grants and quotas
            body = (f"<p>Signed in as <strong>{pages.e(session.user)}</strong> (user).</p>"
                    + await self._own_grants(session) + quotas)
            return _page("Servers", body, session, "servers")
        return _page("Servers", pages.servers_page(health, session.csrf) + quotas, session,
                     "servers")

    def _per_user_servers(self) -> list[str]:
        """The HTTP servers whose credentials are per user (`oauth.per_user = true`)."""
        names = []
        for name, sourced in self.location.manifests.servers.items():
            config = sourced.value
            if (config is not None and config.url is not None and config.oauth_mode != "none"
                    and config.oauth is not None and config.oauth.per_user):
                names.append(name)
        return sorted(names)

    async def _own_grants(self, session: ConsoleSession) -> str:
        """A user's own grant of each server with credentials per user, and a button that
        starts the login of that grant (`POST /ui/servers/{name}/login`)."""
        names = self._per_user_servers()
        if not names or session.user is None:
            return ""
        rows = []
        for name in names:
            key = user_grant_key(name, session.user)
            config = self.location.manifests.servers[name].value
            try:
                record = await self.location.grant_store().get(key)
            except Exception as exc:  # a grant store that cannot be read: say so
                state = f"the grant store cannot be read: {type(exc).__name__}"
            else:
                status = grant_status(key, config, record, time.time())
                state = "authorized" if status["authorized"] and not status[
                    "needs_login"] else (status.get("reason") or "needs a login")
            rows.append([
                f"<strong>{pages.e(name)}</strong>",
                f'<span class="own-grant">{pages.e(state)}</span>',
                f'<form class=inline method=post action="/ui/servers/'
                f'{pages.e(urllib.parse.quote(name, safe=""))}/login">'
                f'<input type=hidden name=csrf value="{pages.e(session.csrf)}">'
                f"<button>log in</button></form> <span class=muted>or run <code>sidecar auth "
                f"login {pages.e(name)} --user {pages.e(session.user)}</code></span>"])
        return "<h2>Your logins</h2>" + pages.table(
            ["server", "your grant", ""], rows, empty="")

    async def _quotas(self, session: ConsoleSession) -> str:
        """The per-user quota table (`[auth.quotas]`): a user sees their own row."""
        if self.identities is None:
            return ""
        await self.identities.book.read_store()
        usage = self.identities.book.usage()
        if session.role == "user":
            usage = {k: v for k, v in usage.items() if k == session.user}
        if not usage:
            return ""
        rows = [[pages.e(user)] + [f"{used:,} / {limit:,}" if limit is not None else
                                   f"{used:,} / -" for used, limit in row.values()]
                for user, row in usage.items()]
        return "<h2>Quotas</h2>" + pages.table(
            ["user", "calls in the last minute", "calls running", "snapshots",
             "bytes in the managed store"], rows,
            empty="no user has used a quota yet")

    async def server_login(self, request: Request, session: ConsoleSession) -> Response:
        """Start the server's OAuth login in the daemon and send the browser to the
        authorization page (the redirect comes back to the daemon's loopback callback, or
        with `SIDECAR_PUBLIC_URL` to `/v1/auth/{name}/callback` on any replica)."""
        name = request.path_params["name"]
        key = name
        if session.role == "user":  # a user logs in only their own grant (oauth.per_user)
            if name not in self._per_user_servers() or session.user is None:
                raise _BadInput(f"{name} has no credentials per user (oauth.per_user)")
            key = user_grant_key(name, session.user)
        started = await self.begin_login(key) if self.begin_login is not None else None
        if started is None:
            raise _BadInput(f"{name} is not an HTTP server that logs in with OAuth")
        url = started.get("authorization_url")
        if started.get("state") == "pending" and isinstance(url, str):
            return RedirectResponse(url, status_code=303)
        message = started.get("message") or started.get("state")
        body = (f"<p>Login of <strong>{pages.e(name)}</strong>: {pages.e(message)}</p>"
                f'<p><a href="/ui">back to the servers</a></p>')
        return _page("Server login", body, session, "servers")

    async def tools(self, request: Request, session: ConsoleSession) -> Response:
        profiles = self.location.profiles
        chosen = request.query_params.get("profile") or None
        if chosen is not None and chosen != ALL_TOOLS and not profiles.exists(chosen):
            raise _BadInput(f"no profile {chosen!r}; the profiles: {', '.join(profiles.names())}")
        if chosen == ALL_TOOLS:
            definitions = self.details.snapshot(ALL_TOOLS).definitions
        else:
            definitions = self.location.snapshot(keep=False, profile=chosen).definitions
        query = request.query_params.get("q", "")
        tokens = await tool_tokens(self.location, definitions)
        body = pages.tools_page(definitions, query, [*profiles.names(), ALL_TOOLS],
                                chosen or profiles.default_name, tokens.tools, ENCODING)
        held = pages.held_changes(list(self.location.pins.held.values()), session.csrf)
        return _page("Tools", held + body, session, "tools")

    async def approve(self, request: Request, session: ConsoleSession) -> Response:
        try:
            await self.location.pins.approve(request.path_params["name"])
        except NotHeld as exc:
            raise _BadInput(str(exc)) from None
        return RedirectResponse("/ui/tools", status_code=303)

    async def calls(self, request: Request, session: ConsoleSession) -> Response:
        history = self.location.stores.history
        filters = {k: request.query_params.get(k, "") for k in pages.HISTORY_FILTERS}
        if history is None:
            body = '<p class="muted">This daemon keeps no call history.</p>'
        else:
            try:
                query = _own(session, CallQuery.from_params(request.query_params))
                rows, cursor = await history.query(query)
            except InvalidQuery as exc:
                raise _BadInput(str(exc)) from None
            body = pages.calls_page(rows, filters, cursor)
        return _page("Calls", body, session, "calls",
                     script=pages.LIVE_SCRIPT.replace("/ui/events", _events_url(self.events)))

    async def export(self, request: Request, session: ConsoleSession) -> Response:
        history = self.location.stores.history
        if history is None:
            raise _BadInput("this daemon keeps no call history")
        try:
            query = _own(session, CallQuery.from_params(request.query_params, limit=1000))
        except InvalidQuery as exc:
            raise _BadInput(str(exc)) from None

        async def lines() -> AsyncIterator[str]:
            cursor, sent = query.cursor, 0
            while sent < EXPORT_ROWS:
                rows, cursor = await history.query(replace(query, cursor=cursor))
                for row in rows:
                    yield json.dumps(row.to_json(), ensure_ascii=False) + "\n"
                sent += len(rows)
                if cursor is None:
                    return

        return StreamingResponse(lines(), media_type="application/x-ndjson", headers={
            "content-disposition": f'attachment; filename="calls-{int(time.time())}.jsonl"'})

    async def live(self, request: Request, session: ConsoleSession) -> Response:
        # `after`: the event id the page was rendered at, so nothing between the render and
        # this stream's start is missed
        raw = request.query_params.get("after", "")
        after = int(raw) if raw.isascii() and raw.isdigit() and len(raw) <= 18 else None
        start = self.events.last_id if after is None else min(after, self.events.last_id)

        async def stream() -> AsyncIterator[str]:
            yield ": mcp-sidecar console\n\n"
            async for event in self.events.follow(start):
                yield event.sse()

        return StreamingResponse(stream(), media_type="text/event-stream",
                                 headers={"cache-control": "no-store"})

    async def asks(self, request: Request, session: ConsoleSession) -> Response:
        pending = await self.location.permissions.listed()
        return _page("Permission asks", pages.asks_page(pending, session.csrf), session, "asks",
                     script=pages.ASKS_SCRIPT.replace("/ui/events", _events_url(self.events)))

    async def reply(self, request: Request, session: ConsoleSession) -> Response:
        form = await request.form()
        reply = _REPLIES.get(str(form.get("reply")))
        scope = _SCOPES.get(str(form.get("scope", "session")))
        feedback = form.get("feedback")
        if reply is None or scope is None:
            raise _BadInput("reply must be once, always or reject; scope session or location")
        try:
            await self.location.permissions.reply(
                request.path_params["ask_id"], reply,
                feedback=feedback if isinstance(feedback, str) and feedback else None,
                scope=scope,
            )
        except UnknownAsk as exc:
            raise _BadInput(str(exc)) from None
        return RedirectResponse("/ui/asks", status_code=303)

    async def managed(self, request: Request, session: ConsoleSession) -> Response:
        params = {k: request.query_params.get(k, "") for k in ("ref", "offset", "limit",
                                                               "pattern", "start", "length")}
        ref = params["ref"].strip()
        if not ref:
            return _page("Managed text", pages.managed_page(params, "", ""), session, "managed")
        store = self.location.seam.store
        try:
            info = await store.stat(ref)
            ref_info = (f"<p><code>{pages.e(ref)}</code>: {info.size_bytes} bytes, "
                        f"{info.lines} lines</p>")
            if params["start"]:  # characters inside line `offset` (a long line)
                line = _number(params["offset"], "offset", 1, 2**62)
                start = _number(params["start"], "start", 0, 2**62, minimum=0)
                chars = await store.read_chars(
                    ref, line=line, start=start,
                    length=_number(params["length"], "length", 20_000, 1_000_000))
                text = chars.text
                more = ("end of the line" if chars.end_of_line
                        else f"read on from start={chars.next_start}")
                ref_info += (f"<p class=muted>line {line}, characters {start}-"
                             f"{start + len(text) - 1} ({more})</p>")
            elif params["pattern"]:
                found = await store.grep(ref, params["pattern"], max_matches=_number(
                    params["limit"], "limit", 100, 10_000))
                text = "\n".join(f"{m.line}: {m.text}" for m in found.matches)
                if not found.matches:
                    text = "(no line matches)"
            else:
                part = await store.read_lines(
                    ref, offset=_number(params["offset"], "offset", 1, 2**62),
                    limit=_number(params["limit"], "limit", 200, 10_000))
                text = part.text
                ref_info += (f"<p class=muted>lines {part.first_line}-{part.last_line} of "
                             f"{info.lines}</p>")
        except (InvalidRef, ManagedNotFound, ValueError) as exc:
            raise _BadInput(str(exc)) from None
        result = f"<pre id=text>{pages.e(text)}</pre>"
        return _page("Managed text", pages.managed_page(params, result, ref_info), session,
                     "managed")

    async def download(self, request: Request, session: ConsoleSession) -> Response:
        ref = request.path_params["ref"]
        store = self.location.seam.store
        try:
            info = await store.stat(ref)
        except (InvalidRef, ManagedNotFound) as exc:
            raise _BadInput(str(exc)) from None

        async def chunks() -> AsyncIterator[bytes]:
            offset = 0
            while offset < info.size_bytes:
                part = await store.read_bytes(ref, offset=offset, limit=DOWNLOAD_CHUNK)
                if part.end_bytes <= offset:
                    return
                yield part.text.encode()
                offset = part.end_bytes

        return StreamingResponse(chunks(), media_type="text/plain; charset=utf-8", headers={
            "content-disposition": f'attachment; filename="{ref}.txt"'})


def _own(session: ConsoleSession, query: CallQuery) -> CallQuery:
    """A `user` session reads only its own history."""
    if session.role != "user":
        return query
    if query.user is not None and query.user != session.user:
        raise InvalidQuery("user", f"{session.user} reads only their own history")
    return replace(query, user=session.user)


def _own_login(request: Request) -> bool:
    """`POST /ui/servers/{name}/login`: a user's login of their own grant."""
    path = request.url.path
    return (request.method == "POST" and path.startswith("/ui/servers/")
            and path.endswith("/login") and path.count("/") == 4)


def _number(raw: str, name: str, default: int, maximum: int, minimum: int = 1) -> int:
    if not raw:
        return default
    if not (raw.isascii() and raw.isdigit()) or not minimum <= int(raw) <= maximum:
        raise _BadInput(f"{name}: a whole number from {minimum} to {maximum}")
    return int(raw)


def console_routes(location: Location, events: EventLog, token: str | None,
                   begin_login: BeginLogin | None = None,
                   ring: MinuteRing | None = None,
                   identities: Identities | None = None) -> list[BaseRoute]:
    """`ring`: the per-minute numbers the metrics page plots (a seam observer the app
    attaches); without one the page plots nothing. `identities`: sign-in through the
    manifest's OpenID provider (`[auth.oidc]`) beside the token form."""
    return Console(location, events, token, begin_login, ring, identities).routes()

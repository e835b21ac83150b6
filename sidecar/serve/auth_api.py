"""`/v1/auth/{server}`: OAuth logins of the Location's HTTP servers, started in the daemon
(`AuthApi`; its routes and answers are its docstring). The tokens go to the Location's grant
store, where the waiting server finds them (`bridges.mcp.oauth`).

Imports the core and the face `bridges.mcp.oauth`. Exports `AuthApi`.
"""

from __future__ import annotations

import contextlib
import html
import logging
import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, Response
from starlette.routing import Route

from bridges.mcp.oauth import (
    CallbackFailed,
    Logins,
    finish_login,
    grant_status,
    split_grant_key,
    user_grant_key,
)
from sidecar.model.replica import replica_id
from sidecar.serve.security import ROLE_KEY, USER_KEY
from sidecar.stores.grants import GrantStoreUnavailable
from sidecar.stores.pending_logins import PUBLIC_URL_ENV, LoginStateRejected

if TYPE_CHECKING:
    from sidecar.location.location import Location

log = logging.getLogger("sidecar.serve.auth")


class AuthApi:
    """The `/v1/auth/{server}` routes of one Location:

        GET  /v1/auth/{server}        the server's authorization (as `sidecar auth status
                                      --json`) and the state of its newest login (`login`)
        POST /v1/auth/{server}/login  start a login: answers once the authorization URL is
                                      known (202, `authorization_url`), or with the result
                                      when the grant needs no browser (client credentials: 200)
        GET  /v1/auth/{server}/callback   the browser's redirect, with the daemon's public URL
                                      (`SIDECAR_PUBLIC_URL`): no bearer token, the OAuth
                                      `state` authorizes it; answers a small HTML page

    Without a public URL the daemon listens for the redirect on its own loopback callback
    (127.0.0.1), so the browser that opens the URL must run on the daemon's machine. With
    one, the redirect comes to `/v1/auth/{server}/callback` on whichever replica the load
    balancer picks, which finishes the login another replica may have started
    (`sidecar.stores.pending_logins`): an unknown, expired, already used or missing state is
    400 naming which, and an `error=` of the authorization server is 400 naming it. The
    exchange at the token endpoint is bounded (`SIDECAR_LOGIN_EXCHANGE_TIMEOUT`, 30 s: 502
    past it); a replica that stops mid-exchange fails the login on the starting replica after
    twice that, naming it. `login` in `GET` is the newest login of the server in the fleet:
    the one started here (with its authorization URL), or, with a public URL, a newer one
    another replica started or finished (state, message, `replica`). The tokens go to the
    Location's grant store (the state directory; in a fleet the database, where every replica
    finds them). One login per server at a time. A grant store that cannot be used (fleet:
    `SIDECAR_GRANT_KEY` missing or another replica's) answers 503 `grant_store_unavailable`
    with the reason.

    For a server with credentials per user (`oauth.per_user`) `?user=NAME` names one user's
    own grant; a signed-in user of the role `user` always gets their own (another name is 403
    `forbidden_role`), and a server without `oauth.per_user` is 403 `forbidden_role` for them
    (400 `not_per_user` for others who name a user)."""

    def __init__(self, location: Location) -> None:
        self.location = location
        self.store = location.grant_store()
        self._own = Logins(self.store, location.stores.login_callbacks)

    @property
    def logins(self) -> Logins:
        """The daemon's logins: the server pool's (shared with the MCP facade, which starts a
        login for a client that can open a URL), else this API's own."""
        pool = self.location.upstreams
        return pool.logins if pool is not None and pool.logins is not None else self._own

    def routes(self, handled: Any) -> list[Route]:
        return [
            Route("/v1/auth/{server}", handled(self.status), methods=["GET"]),
            Route("/v1/auth/{server}/login", handled(self.start_login), methods=["POST"]),
            Route("/v1/auth/{server}/callback", handled(self.callback), methods=["GET"]),
        ]

    def _config(self, server: str) -> Any:
        sourced = self.location.manifests.servers.get(split_grant_key(server)[0])
        config = sourced.value if sourced is not None else None
        if config is None or config.url is None or config.oauth_mode == "none":
            return None
        return config

    def _grant_key(self, request: Request, server: str, config: Any) -> str | Response:
        """The grant a request is about: the server's own, or one user's (per_user)."""
        asked = request.query_params.get("user") or None
        role_user = request.scope.get(ROLE_KEY) == "user"
        if config is None and asked is not None and not role_user:
            return _not_found(server)
        if role_user:
            user = request.scope.get(USER_KEY)
            per_user = config is not None and config.oauth is not None and config.oauth.per_user
            if not per_user or asked not in (None, user):
                return JSONResponse({"error": {"code": "forbidden_role", "message": (
                    f"{user} has the role user: it logs in only its own grant of a server "
                    f"with credentials per user (oauth.per_user); not {request.method} "
                    f"{request.url.path}")}}, status_code=403)
            asked = user
        if asked is None:
            return server
        if config.oauth is None or not config.oauth.per_user:
            return JSONResponse({"error": {"code": "not_per_user", "field": "user", "message": (
                f"server {server!r} has no credentials per user (oauth.per_user)")}},
                status_code=400)
        return user_grant_key(server, str(asked))

    async def status(self, request: Request) -> Response:
        server = request.path_params["server"]
        config = self._config(server)
        key = self._grant_key(request, server, config)
        if isinstance(key, Response):
            return key
        if key != server:
            try:
                record = await self.store.get(key)
            except GrantStoreUnavailable as exc:
                return _unavailable(exc)
            report = grant_status(key, config, record, time.time())
            report["login"] = await self._login(key)
            return JSONResponse({"server": server, "user": split_grant_key(key)[1], **report})
        try:
            record = await self.store.get(server)
        except GrantStoreUnavailable as exc:
            return _unavailable(exc)
        if config is None and record is None:
            return _not_found(server)
        report = grant_status(server, config, record, time.time())
        report["login"] = await self._login(server)
        return JSONResponse({"server": server, **report})

    async def _login(self, server: str) -> dict[str, Any] | None:
        """The newest login of `server`: this replica's own (it holds the authorization URL),
        unless the pending logins know a newer one (another replica's)."""
        running = self.logins.get(server)
        mine = None if running is None else {**running.to_json(), "replica": replica_id()}
        callbacks = self.location.stores.login_callbacks
        if callbacks is None:
            return mine
        try:
            newest = await callbacks.pending.latest(server, callbacks.finish_within)
        except Exception as exc:  # the grant store answered: still show this replica's own
            log.debug("[%s] pending logins unreadable: %s", server, type(exc).__name__)
            return mine
        if newest is None or (running is not None and (
                running.state_key == newest.key or running.started_at >= newest.started_at)):
            return mine
        return newest.to_json()

    async def start_login(self, request: Request) -> Response:
        server = request.path_params["server"]
        config = self._config(server)
        key = self._grant_key(request, server, config)
        if isinstance(key, Response):
            return key
        started = await self.begin(key)
        if started is None:
            return _not_found(server)
        status = 202 if started["state"] == "pending" else 200
        return JSONResponse({"server": server, **started}, status_code=status)

    async def begin(self, server: str) -> dict[str, Any] | None:
        """Start (or join) a login of `server`: its state once the authorization URL is known
        (`authorization_url`), or its result when the grant needs no browser. None when the
        manifests have no such OAuth-capable server. The console's login button uses it."""
        config = self._config(server)
        if config is None:
            return None
        return (await self.logins.begin(server, config)).to_json()

    async def callback(self, request: Request) -> Response:
        """The authorization server's redirect (see the module docstring). Never echoes the
        code or the state, and never logs them."""
        server = request.path_params["server"]
        callbacks = self.location.stores.login_callbacks
        if callbacks is None:
            return _page(404, "not_configured", f"This daemon has no public URL "
                         f"({PUBLIC_URL_ENV}): its logins redirect to a loopback callback.")
        query = request.query_params
        state = query.get("state")
        if not state:
            return _page(400, "missing_state", "The redirect has no state parameter: it "
                         "cannot be matched to a login. Start the login again.")
        try:
            pending = await callbacks.pending.take(state, server)
        except LoginStateRejected as exc:
            return _page(400, exc.code, f"{exc}.")
        except GrantStoreUnavailable as exc:
            return _page(503, "grant_store_unavailable", str(exc))
        error = query.get("error")
        config = self._config(server)
        if error is not None:
            detail = _printable(query.get("error_description", ""), 300)
            message = (f"{server}: the authorization server refused the login: "
                       f"error={_printable(error, 100)}" + (f" ({detail})" if detail else ""))
            code, status = "authorization_refused", 400
        elif not query.get("code"):
            message, code, status = f"{server}: the redirect has no authorization code", (
                "missing_code"), 400
        elif config is None:
            message, code, status = (f"{server}: no HTTP server {server!r} that may use OAuth "
                                     "in this replica's manifests"), "unknown_server", 404
        else:
            try:
                message = await finish_login(server, config, self.store, pending,
                                             query["code"], query.get("iss"),
                                             callbacks.exchange_timeout)
                code, status = "authorized", 200
            except CallbackFailed as exc:
                message, code, status = str(exc), "exchange_failed", 502
            except GrantStoreUnavailable as exc:
                message, code, status = str(exc), "grant_store_unavailable", 503
            except Exception as exc:  # e.g. the database went down: the starter is told
                with contextlib.suppress(Exception):
                    await callbacks.pending.finish(state, "failed", (
                        f"{server}: the replica that received the redirect failed to finish "
                        f"the login ({type(exc).__name__}); start it again"))
                raise
        await callbacks.pending.finish(state, "authorized" if status == 200 else "failed",
                                       message)
        log.info("[%s] login callback: %s", server, code)
        return _page(status, code, message + ("" if status != 200 else
                                              ". You can close this window."))

    async def aclose(self) -> None:
        await self._own.aclose()


def _page(status: int, code: str, message: str) -> Response:
    """The small page the browser shows: the message (escaped), the code in a header too.
    Not cached and sending no referrer: its address holds the code and the state."""
    body = (f"<!doctype html><title>mcp-sidecar</title><p>{html.escape(message)}</p>"
            f"<!-- {code} -->")
    return HTMLResponse(body, status_code=status, headers={
        "sidecar-login": code, "cache-control": "no-store", "referrer-policy": "no-referrer"})


def _printable(text: str, limit: int) -> str:
    """What the authorization server sent, as shown and reported: printable, bounded."""
    return "".join(c for c in text[:limit] if c.isprintable())


def _unavailable(exc: GrantStoreUnavailable) -> Response:
    return JSONResponse({"error": {"code": "grant_store_unavailable", "message": str(exc)}},
                        status_code=503)


def _not_found(server: str) -> Response:
    return JSONResponse({"error": {
        "code": "unknown_server", "field": "server",
        "message": f"no HTTP server {server!r} that may use OAuth in the manifests"}},
        status_code=404)

"""`/v1/auth/{server}`: OAuth logins of the Location's HTTP servers, started in the daemon.

    GET  /v1/auth/{server}        the server's authorization (as `sidecar auth status --json`)
                                  and the state of a login started here
    POST /v1/auth/{server}/login  start a login: answers once the authorization URL is known
                                  (202, `authorization_url`), or with the result when the grant
                                  needs no browser (client credentials: 200)

The daemon listens for the redirect on its own loopback callback (127.0.0.1), so the browser
that opens the URL must run on the daemon's machine. The tokens go to the Location's grant
store (the state directory; in a fleet the database, where every replica finds them), where
the waiting server finds them (`bridges.mcp.oauth`). One login per server at a time. A grant
store that cannot be used (fleet: `SIDECAR_GRANT_KEY` missing or another replica's) answers
503 `grant_store_unavailable` with the reason.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from bridges.mcp.oauth.attempts import Logins
from bridges.mcp.oauth.records import grant_status
from sidecar.grant_store import GrantStoreUnavailable

if TYPE_CHECKING:
    from sidecar.location import Location


class AuthApi:
    def __init__(self, location: Location) -> None:
        self.location = location
        self.store = location.grant_store()
        self._own = Logins(self.store)

    @property
    def logins(self) -> Logins:
        """The daemon's logins: the server pool's (shared with the MCP facade, which starts a
        login for a client that can open a URL), else this API's own."""
        pool = self.location.sources.pool if self.location.sources is not None else None
        return pool.logins if pool is not None and pool.logins is not None else self._own

    def routes(self, handled: Any) -> list[Route]:
        return [
            Route("/v1/auth/{server}", handled(self.status), methods=["GET"]),
            Route("/v1/auth/{server}/login", handled(self.start_login), methods=["POST"]),
        ]

    def _config(self, server: str) -> Any:
        sourced = self.location.manifests.servers.get(server)
        config = sourced.value if sourced is not None else None
        if config is None or config.url is None or config.oauth_mode == "none":
            return None
        return config

    async def status(self, request: Request) -> Response:
        server = request.path_params["server"]
        config = self._config(server)
        try:
            record = await self.store.get(server)
        except GrantStoreUnavailable as exc:
            return _unavailable(exc)
        if config is None and record is None:
            return _not_found(server)
        report = grant_status(server, config, record, time.time())
        running = self.logins.get(server)
        report["login"] = running.to_json() if running is not None else None
        return JSONResponse({"server": server, **report})

    async def start_login(self, request: Request) -> Response:
        server = request.path_params["server"]
        started = await self.begin(server)
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

    async def aclose(self) -> None:
        await self._own.aclose()


def _unavailable(exc: GrantStoreUnavailable) -> Response:
    return JSONResponse({"error": {"code": "grant_store_unavailable", "message": str(exc)}},
                        status_code=503)


def _not_found(server: str) -> Response:
    return JSONResponse({"error": {
        "code": "unknown_server", "field": "server",
        "message": f"no HTTP server {server!r} that may use OAuth in the manifests"}},
        status_code=404)

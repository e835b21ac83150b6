"""An OAuth-protected MCP server for the tests: one ASGI app that is both the resource server
(`/mcp`, a stateless `mcp` SDK server behind a Bearer check; the same server over the legacy
SSE transport at `/sse`) and its authorization server
(RFC 9728 and RFC 8414 metadata, dynamic registration, an `/authorize` that redirects straight
back with a code, a token endpoint with refresh-token rotation, revocation).

Tokens are random and expire after `expires_in` seconds; `grants` records every token
request's grant type, `rejected` counts the MCP requests answered 401, `reused` the refreshes
with a refresh token that was already spent (what two clients sharing one grant must never
do). `called` records, for every tool call, the tool and the access token it carried. `/token`
also takes RFC 8693 token exchanges (client `exchanger`/`exchanger-secret`, HTTP Basic): any
subject token not in `refuse` is exchanged for an access token, recorded in `exchanged` as
(subject token, resource, the token issued).
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlencode

import anyio
import mcp_types as types
from mcp.server import Server
from mcp.server.sse import SseServerTransport
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, RedirectResponse, Response
from starlette.routing import Mount, Route


class OAuthServer:
    def __init__(self, *, expires_in: int = 3600) -> None:
        self.expires_in = expires_in
        self.base = ""
        self.access: dict[str, float] = {}
        self.refresh: set[str] = set()
        self.spent: set[str] = set()
        self.reused = 0
        self.codes: dict[str, str] = {}
        self.grants: list[str] = []
        self.rejected = 0
        self.called: list[tuple[str, str]] = []
        self.exchanged: list[tuple[str, str, str]] = []
        self.refuse: set[str] = set()
        self.revoked: list[str] = []
        self.meeting = 0
        self.met = anyio.Event()
        self.deny: str | None = None
        """An `error` code `/authorize` redirects back with instead of a code."""
        self.token_gate: anyio.Event | None = None
        """When set, `/token` records the grant asked for, then answers once the event is."""
        server = Server("protected", on_list_tools=self._list_tools, on_call_tool=self._call)
        self._mcp = server.streamable_http_app(streamable_http_path="/mcp", stateless_http=True,
                                               json_response=True)
        self._sse = _sse_app(server)
        self._oauth = Starlette(routes=[
            Route("/.well-known/oauth-protected-resource/mcp", self._resource_metadata),
            Route("/.well-known/oauth-protected-resource/sse", self._resource_metadata),
            Route("/.well-known/oauth-authorization-server", self._server_metadata),
            Route("/authorize", self._authorize),
            Route("/token", self._token, methods=["POST"]),
            Route("/register", self._register, methods=["POST"]),
            Route("/revoke", self._revoke, methods=["POST"]),
        ])

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        sse = scope["type"] == "http" and (
            scope["path"] == "/sse" or scope["path"].startswith("/messages/"))
        if scope["type"] == "http" and scope["path"] != "/mcp" and not sse:
            await self._oauth(scope, receive, send)
            return
        if scope["type"] == "http":
            headers = dict(scope["headers"])
            token = headers.get(b"authorization", b"").decode().removeprefix("Bearer ")
            if self.access.get(token, 0.0) < time.time():
                self.rejected += 1
                resource = "sse" if sse else "mcp"
                metadata = f"{self.base}/.well-known/oauth-protected-resource/{resource}"
                response = JSONResponse({"error": "invalid_token"}, status_code=401, headers={
                    "WWW-Authenticate": f'Bearer resource_metadata="{metadata}"'})
                await response(scope, receive, send)
                return
        await (self._sse if sse else self._mcp)(scope, receive, send)

    # --- the MCP server ----------------------------------------------------------------

    async def _list_tools(self, ctx: Any, params: Any) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[
            types.Tool(name="whoami", input_schema={"type": "object"}),
            types.Tool(name="meet", input_schema={"type": "object"}),
        ])

    async def _call(self, ctx: Any, params: types.CallToolRequestParams) -> types.CallToolResult:
        request = getattr(ctx, "request", None)
        if request is not None:
            bearer = request.headers.get("authorization", "").removeprefix("Bearer ")
            self.called.append((params.name, bearer))
        if params.name == "meet":  # answers once two calls are in flight at the same time
            self.meeting += 1
            if self.meeting % 2 == 0:
                self.met.set()
            with anyio.move_on_after(10):
                await self.met.wait()
            return types.CallToolResult(content=[types.TextContent(
                text="met" if self.met.is_set() else "alone")])
        return types.CallToolResult(content=[types.TextContent(text="authorized")])

    # --- the authorization server ------------------------------------------------------

    async def _resource_metadata(self, request: Request) -> Response:
        resource = request.url.path.rsplit("/", 1)[1]
        return JSONResponse({"resource": f"{self.base}/{resource}",
                             "authorization_servers": [self.base]})

    async def _server_metadata(self, request: Request) -> Response:
        return JSONResponse({
            "issuer": self.base,
            "authorization_endpoint": f"{self.base}/authorize",
            "token_endpoint": f"{self.base}/token",
            "registration_endpoint": f"{self.base}/register",
            "revocation_endpoint": f"{self.base}/revoke",
            "response_types_supported": ["code"],
            "grant_types_supported": ["authorization_code", "refresh_token"],
            "code_challenge_methods_supported": ["S256"],
            "token_endpoint_auth_methods_supported": ["none"],
        })

    async def _register(self, request: Request) -> Response:
        body = await request.json()
        return JSONResponse({"client_id": "client-" + secrets.token_hex(4),
                             "redirect_uris": body.get("redirect_uris", []),
                             "token_endpoint_auth_method": "none"}, status_code=201)

    async def _authorize(self, request: Request) -> Response:
        query = request.query_params
        if self.deny is not None:
            refusal = urlencode({"error": self.deny, "error_description": "the user said no",
                                 "state": query["state"]})
            target = f"{query['redirect_uri']}?{refusal}"
            return RedirectResponse(target, status_code=302)
        code = secrets.token_urlsafe(16)
        self.codes[code] = query["code_challenge"]
        target = f"{query['redirect_uri']}?{urlencode({'code': code, 'state': query['state']})}"
        return RedirectResponse(target, status_code=302)

    def manifests(self, directory: Path) -> Path:
        """`directory`, made, with one manifest: the MCP server `cloud` at this server's
        `/mcp` (`base` set), logging in with OAuth."""
        directory.mkdir()
        (directory / "cloud.json").write_text(json.dumps({"mcpServers": {"cloud": {
            "url": f"{self.base}/mcp", "auth": "oauth", "timeouts": {"startup": 10}}}}))
        return directory

    def _issue(self) -> dict[str, Any]:
        access, refresh = secrets.token_urlsafe(24), secrets.token_urlsafe(24)
        self.access[access] = time.time() + self.expires_in
        self.refresh.add(refresh)
        return {"access_token": access, "token_type": "Bearer", "expires_in": self.expires_in,
                "refresh_token": refresh}

    async def _token(self, request: Request) -> Response:
        form = await request.form()
        grant = str(form.get("grant_type"))
        self.grants.append(grant)
        if self.token_gate is not None:
            await self.token_gate.wait()
        if grant == "authorization_code":
            challenge = self.codes.pop(str(form.get("code")), None)
            verifier = str(form.get("code_verifier", "")).encode()
            digest = base64.urlsafe_b64encode(hashlib.sha256(verifier).digest()).rstrip(b"=")
            if challenge is None or digest.decode() != challenge:
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            return JSONResponse(self._issue())
        if grant == "refresh_token":
            old = str(form.get("refresh_token"))
            if old not in self.refresh:
                self.reused += old in self.spent
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            self.refresh.discard(old)  # rotation: a refresh token is used once
            self.spent.add(old)
            return JSONResponse(self._issue())
        if grant == "urn:ietf:params:oauth:grant-type:token-exchange":
            basic = base64.b64encode(b"exchanger:exchanger-secret").decode()
            if request.headers.get("authorization") != f"Basic {basic}":
                return JSONResponse({"error": "invalid_client"}, status_code=401)
            subject = str(form.get("subject_token", ""))
            if not subject or subject in self.refuse or form.get("subject_token_type") != (
                    "urn:ietf:params:oauth:token-type:access_token"):
                return JSONResponse({"error": "invalid_grant"}, status_code=400)
            issued = self._issue()
            del issued["refresh_token"]
            self.exchanged.append((subject, str(form.get("resource")), issued["access_token"]))
            return JSONResponse({**issued, "issued_token_type":
                                 "urn:ietf:params:oauth:token-type:access_token"})
        return JSONResponse({"error": "unsupported_grant_type"}, status_code=400)

    async def _revoke(self, request: Request) -> Response:
        form = await request.form()
        token = str(form.get("token"))
        self.revoked.append(token)
        self.refresh.discard(token)
        self.access.pop(token, None)
        return Response(status_code=200)


def _sse_app(server: Server[Any]) -> Any:
    transport = SseServerTransport("/messages/")

    async def handle_sse(request: Request) -> Response:
        async with transport.connect_sse(request.scope, request.receive, request._send) as (r, w):
            await server.run(r, w, server.create_initialization_options())
        return Response()

    return Starlette(routes=[
        Route("/sse", endpoint=handle_sse, methods=["GET"]),
        Mount("/messages/", app=transport.handle_post_message),
    ])

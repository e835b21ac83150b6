"""One authorization of one server: what `sidecar auth login NAME` and `POST /v1/auth/...` run.

`login` listens on a loopback callback (`127.0.0.1`, an ephemeral port unless the manifest's
`oauth.callback_port`/`redirect_uri` fixes one; a daemon with a public URL has the redirect
come to `/v1/auth/{server}/callback` instead, `bridges.mcp.oauth.callback`), connects to the
server with the login-mode auth (`build_auth(..., interactive=...)`), lets the server's 401
start the SDK's flow (discovery, registration, PKCE), shows the authorization URL, waits for
the redirect, exchanges the code and stores the tokens. It then lists the server's tools once,
with the new token, to say whether the server accepts it. Client-credentials grants need no
browser: the same connection fetches a token. `logout` revokes the stored tokens where the
authorization server has a revocation endpoint (RFC 7009) and forgets them.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qsl, quote, urlsplit

import anyio
import httpx2
from mcp import Client
from mcp.client.auth import OAuthFlowError
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.auth import AuthorizationCodeResult

from bridges.manifest.loading import ServerConfig
from bridges.manifest.oauth import OAuthSettings
from bridges.mcp.oauth.callback import PublicRedirect
from bridges.mcp.oauth.providers import Interactive, build_auth
from bridges.mcp.oauth.records import LoginStatus, RecordStorage, canonical_resource
from bridges.mcp.sse import sse_transport
from bridges.mcp.transport_state import TransportState
from sidecar.stores.errors import database_failure
from sidecar.stores.grants import GrantStore, GrantStoreUnavailable
from sidecar.stores.pending_logins import LoginCallbacks

log = logging.getLogger("bridges.mcp.oauth")

LOGIN_TIMEOUT = 300.0
PROBE_TIMEOUT = 30.0
_PAGE = (b"<!doctype html><title>mcp-sidecar</title><p>%s</p>"
         b"<p>You can close this window.</p>")


@dataclass(frozen=True, slots=True)
class LoginResult:
    ok: bool
    message: str
    scope: str | None = None
    expires_at: float | None = None


class LoopbackCallback:
    """A one-shot HTTP listener on 127.0.0.1 that receives the authorization redirect."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.port = 0
        self._server: asyncio.Server | None = None
        self._result: asyncio.Future[AuthorizationCodeResult] | None = None

    @classmethod
    @contextlib.asynccontextmanager
    async def open(cls, port: int = 0, path: str = "/callback") -> AsyncIterator[LoopbackCallback]:
        callback = cls(path)
        callback._result = asyncio.get_running_loop().create_future()
        server = await asyncio.start_server(callback._serve, "127.0.0.1", port)
        callback._server = server
        callback.port = server.sockets[0].getsockname()[1]
        try:
            yield callback
        finally:
            server.close()
            await server.wait_closed()

    async def wait(self) -> AuthorizationCodeResult:
        assert self._result is not None
        return await asyncio.shield(self._result)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            with anyio.fail_after(10):
                head = await reader.readuntil(b"\r\n\r\n")
            target = head.split(b"\r\n", 1)[0].split(b" ")[1].decode("ascii", "replace")
            parts = urlsplit(target)
            if parts.path != self.path:
                writer.write(b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n"
                             b"connection: close\r\n\r\n")
                return
            query = dict(parse_qsl(parts.query))
            if "error" in query:
                detail = query.get("error_description", "")
                text = f"authorization failed: {query['error']} {detail}"
                self._settle(exception=OAuthFlowError(text.strip()))
                body = _PAGE % b"Authorization failed."
            elif "code" in query:
                self._settle(AuthorizationCodeResult(
                    code=query["code"], state=query.get("state"), iss=query.get("iss")
                ))
                body = _PAGE % b"Authorized: mcp-sidecar stored the tokens."
            else:
                body = _PAGE % b"No authorization code in this request."
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: text/html; charset=utf-8\r\n"
                         b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
        except (OSError, ValueError, IndexError, TimeoutError, asyncio.IncompleteReadError):
            pass
        finally:
            with contextlib.suppress(OSError):
                await writer.drain()
            writer.close()

    def _settle(self, result: AuthorizationCodeResult | None = None, *,
                exception: BaseException | None = None) -> None:
        if self._result is None or self._result.done():
            return
        if exception is not None:
            self._result.set_exception(exception)
        else:
            self._result.set_result(result)  # type: ignore[arg-type]


def _callback_address(settings: OAuthSettings) -> tuple[int, str]:
    if settings.redirect_uri:
        parts = urlsplit(settings.redirect_uri)
        return parts.port or 0, parts.path or "/"
    return settings.callback_port or 0, "/callback"


async def login(
    server: str,
    config: ServerConfig,
    store: GrantStore,
    *,
    show: Callable[[str], Awaitable[None]],
    patience: float = LOGIN_TIMEOUT,
    callbacks: LoginCallbacks | None = None,
) -> LoginResult:
    """Authorize `server` once and store its tokens; never raises for an OAuth failure.

    With `callbacks` (the daemon's public URL) and no redirect fixed by the manifest, the
    redirect goes to `{public URL}/v1/auth/{server}/callback`, where any replica may finish
    the login (`bridges.mcp.oauth.callback`); otherwise to a loopback listener here."""
    if config.url is None or config.oauth_mode == "none":
        return LoginResult(False, f"server {server!r} is not an HTTP server that may use "
                           "OAuth (`url`, and no `auth = \"none\"`)")
    settings = config.oauth or OAuthSettings()
    started = time.time()
    status = LoginStatus(server)
    storage = RecordStorage(store, server, canonical_resource(config.url))
    port, path = _callback_address(settings)
    public = None
    interactive_grant = settings.grant in ("authorization_code", "token_exchange")
    if callbacks is not None and interactive_grant and not (
        settings.redirect_uri or settings.callback_port
    ):
        public = PublicRedirect(server, canonical_resource(config.url), callbacks.pending,
                                patience, callbacks.finish_within)
    async with contextlib.AsyncExitStack() as stack:
        interactive = None
        if public is not None:
            assert callbacks is not None
            interactive = public.interactive(callbacks.redirect_uri(server), show)
        elif interactive_grant:  # token_exchange: the server's own login lists its tools
            try:
                callback = await stack.enter_async_context(LoopbackCallback.open(port, path))
            except OSError as exc:
                return LoginResult(False, f"cannot listen on 127.0.0.1:{port} for the "
                                   f"authorization callback: {exc.strerror or exc}")
            redirect_uri = settings.redirect_uri or f"http://127.0.0.1:{callback.port}{path}"
            interactive = Interactive(redirect_uri, show, callback.wait)
        else:
            await storage.forget_tokens()  # a login fetches a fresh token
        auth = build_auth(server, config, store, status, interactive=interactive)
        probe_error = await _probe(config, auth, patience)
    record = await storage.record()
    tokens = (record or {}).get("tokens")
    # finished by another replica: its clock stamped the tokens, so trust its outcome
    elsewhere = public is not None and public.outcome is not None and (
        public.outcome[0] == "authorized")
    if not tokens or (float(record.get("obtained_at") or 0) < started  # type: ignore[union-attr]
                      and not elsewhere):
        reason = status.reason or status.transient or probe_error or (
            "the server did not ask for authorization")
        return LoginResult(False, f"{server}: no tokens stored: {reason}")
    assert record is not None
    message = f"{server}: authorized; tokens stored"
    if probe_error:
        message += f" (but the server still refused a request: {probe_error})"
    return LoginResult(True, message, tokens.get("scope"), record.get("expires_at"))


async def _probe(config: ServerConfig, auth: httpx2.Auth, patience: float) -> str | None:
    """Connect and list tools (the 401 starts the authorization); the error, if any."""
    assert config.url is not None
    try:
        with anyio.fail_after(patience):
            async with httpx2.AsyncClient(
                headers=dict(config.headers), auth=auth,
                timeout=httpx2.Timeout(PROBE_TIMEOUT, read=patience),
            ) as http:
                transport: Any = (
                    sse_transport(config.url, headers=config.headers,
                                  connect_timeout=PROBE_TIMEOUT, read_timeout=patience,
                                  max_event_size=config.max_result_bytes,
                                  state=TransportState(), auth=auth)
                    if config.transport == "sse"
                    else streamable_http_client(config.url, http_client=http)
                )
                # The login only needs the server's 401: the handshake era skips the
                # `server/discover` probe (a 2025 server may take long to refuse it).
                mode = "legacy" if config.protocol == "auto" else config.protocol
                async with Client(transport, mode=mode, cache=None,
                                  read_timeout_seconds=PROBE_TIMEOUT) as client:
                    await client.list_tools()
    except Exception as exc:
        while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
            exc = exc.exceptions[0]  # type: ignore[assignment]
        if _grant_store_failed(exc):
            raise exc  # not the server's answer: the caller says the grant store failed
        if isinstance(exc, TimeoutError):
            return f"no answer within {patience:g} s"
        text = str(exc).strip().splitlines()
        return f"{type(exc).__name__}: {text[0] if text else ''}".rstrip(": ")
    return None


def _grant_store_failed(exc: BaseException) -> bool:
    """Whether `exc` is the fleet database failing under the grant store (read or written by
    the SDK's auth flow during the probe), not the server refusing."""
    return database_failure(exc) is not None  # (a local grant store raises none)


async def logout(server: str, config: ServerConfig | None, store: GrantStore) -> str:
    """Revoke (where the authorization server supports it) and forget `server`'s tokens. A
    record this process cannot read (the fleet's grant key is missing or another) is forgotten
    without revocation."""
    try:
        record = await store.get(server)
    except GrantStoreUnavailable as exc:
        if not await store.delete(server):
            raise
        return f"{server}: tokens forgotten (not revoked: {exc})"
    if record is None:
        return f"{server}: no stored tokens"
    note = "forgotten"
    endpoint = (record.get("oauth_metadata") or {}).get("revocation_endpoint")
    tokens = record.get("tokens") or {}
    if endpoint and tokens:
        revoked = await _revoke(endpoint, tokens, record.get("client") or {}, config)
        note = "revoked and forgotten" if revoked else f"forgotten (revocation failed: {revoked!s})"
    await store.delete(server)
    return f"{server}: tokens {note}"


class _Failed(str):
    def __bool__(self) -> bool:
        return False


async def _revoke(
    endpoint: str, tokens: dict[str, Any], client: dict[str, Any], config: ServerConfig | None
) -> str:
    settings = (config.oauth if config is not None else None) or OAuthSettings()
    client_id = settings.client_id or client.get("client_id")
    secret = settings.client_secret or client.get("client_secret")
    method = client.get("token_endpoint_auth_method") or settings.token_endpoint_auth_method
    headers: dict[str, str] = {}
    base: dict[str, str] = {}
    if secret and client_id and method != "client_secret_post":
        pair = f"{quote(client_id, safe='')}:{quote(secret, safe='')}".encode()
        headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
    elif client_id:
        base["client_id"] = client_id
        if secret:
            base["client_secret"] = secret
    try:
        async with httpx2.AsyncClient(timeout=PROBE_TIMEOUT) as http:
            for kind in ("refresh_token", "access_token"):
                if tokens.get(kind):
                    response = await http.post(endpoint, headers=headers, data={
                        **base, "token": tokens[kind], "token_type_hint": kind})
                    if response.status_code != 200:
                        return _Failed(f"HTTP {response.status_code}")
    except httpx2.HTTPError as exc:
        return _Failed(type(exc).__name__)
    return "revoked"

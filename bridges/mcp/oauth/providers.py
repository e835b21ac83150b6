"""The `httpx2.Auth` an OAuth-protected upstream's HTTP client carries: the `mcp` SDK's OAuth
providers (discovery per RFC 9728 / RFC 8414 / OpenID with the 2025-03-26 fallbacks, PKCE S256,
RFC 8707 resource indicators, CIMD, dynamic registration, refresh, client credentials with
`client_secret_basic`/`client_secret_post`/`private_key_jwt`), wrapped by `_SidecarAuth`
(what the wrapper adds in the daemon and at a login, and how a refresh is shared between
processes: its docstring). Imports `bridges.manifest`, `bridges.mcp.oauth` and
`sidecar.stores.grants`; exports `build_auth`, the providers, `LoginRequired`, `Interactive`.
"""

from __future__ import annotations

import dataclasses
import logging
import warnings
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any, Literal, NoReturn
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

import httpx2
from mcp.client.auth import OAuthClientProvider, OAuthFlowError
from mcp.client.auth.extensions.client_credentials import (
    ClientCredentialsOAuthProvider,
    PrivateKeyJWTOAuthProvider,
    SignedJWTParameters,
)
from mcp.client.auth.extensions.identity_assertion import IdentityAssertionOAuthProvider
from mcp.client.auth.oauth2 import OAuthContext
from mcp.client.auth.utils import extract_field_from_www_auth, union_scopes
from mcp.shared.auth import AuthorizationCodeResult, OAuthClientInformationFull, OAuthClientMetadata
from pydantic import AnyUrl, ValidationError

from bridges.manifest.loading import ServerConfig
from bridges.manifest.oauth import OAuthSettings
from bridges.mcp.oauth.records import (
    LoginStatus,
    RecordStorage,
    canonical_resource,
    restore_metadata,
)
from sidecar.stores.grants import GrantRecord, GrantStore, GrantStoreUnavailable

log = logging.getLogger("bridges.mcp.oauth")

Refreshed = Literal["refreshed", "adopted", "refused", "unreachable", "impossible"]
"""How `refresh_shared` ended: new tokens from the authorization server; tokens another
process stored meanwhile; refused (a login is needed); the server did not answer; nothing to
refresh with."""
REFRESH_TIMEOUT = 30.0

REFRESH_MARGIN = 60.0
"""Seconds before its expiry a token counts as expired (refreshed before it is sent)."""
DAEMON_REDIRECT_URI = "http://127.0.0.1/callback"
"""Placeholder: the daemon never redirects anyone (only `sidecar auth login` does)."""


class LoginRequired(Exception):
    """A person must authorize (raised where the SDK would send them to the browser)."""

    def __init__(self, reason: str, scope: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.scope = scope


@dataclass(frozen=True, slots=True)
class Interactive:
    """How `sidecar auth login` takes part in the authorization-code flow."""

    redirect_uri: str
    show: Callable[[str], Awaitable[None]]
    """Shows the authorization URL (prints it, opens a browser)."""
    wait: Callable[[], Awaitable[AuthorizationCodeResult]]
    """Waits for the redirect back to `redirect_uri`."""
    elsewhere: Callable[[Any], Awaitable[NoReturn]] | None = None
    """Replaces the SDK's authorization step when the redirect may reach another replica
    (`bridges.mcp.oauth.callback.PublicRedirect.authorize`): raises `AuthorizedElsewhere`
    once that replica stored the tokens."""


class AuthorizedElsewhere(Exception):
    """The replica the browser's redirect reached finished this login and stored the tokens."""


class _QuietElsewhere(logging.Filter):
    """The SDK logs every exception leaving its flow as "OAuth flow error", with a traceback:
    a login finished by another replica is not one."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.exc_info and isinstance(record.exc_info[1], AuthorizedElsewhere))


logging.getLogger("mcp.client.auth.oauth2").addFilter(_QuietElsewhere())


@dataclass
class _GuardedContext(OAuthContext):
    """The SDK's `OAuthContext` with its inline refresh switched off (its flow refreshes
    whenever `can_refresh_token()` says it may, with the refresh token in memory):
    `_SidecarAuth.refresh_shared` refreshes instead, under the grant store's lock."""

    def can_refresh_token(self) -> bool:
        return False

    def refreshable(self) -> bool:
        return OAuthContext.can_refresh_token(self)


def _guarded(context: OAuthContext) -> _GuardedContext:
    return _GuardedContext(**{f.name: getattr(context, f.name)
                              for f in dataclasses.fields(context) if f.init})


def _sent_token(request: httpx2.Request) -> str | None:
    value = request.headers.get("authorization", "")
    return value[7:] if value[:7].lower() == "bearer " else None


def _bearer_challenge(response: httpx2.Response) -> bool:
    return response.headers.get("www-authenticate", "").lower().startswith("bearer")


def _insufficient_scope(response: httpx2.Response) -> bool:
    return (response.status_code == 403
            and extract_field_from_www_auth(response, "error") == "insufficient_scope")


def _with_scope(url: str, scope: str | None) -> str:
    """`url` with its `scope` parameter widened by `scope`."""
    if not scope:
        return url
    parts = urlsplit(url)
    query = parse_qsl(parts.query, keep_blank_values=True)
    current = next((v for k, v in query if k == "scope"), None)
    widened = union_scopes(current, scope)
    query = [(k, v) for k, v in query if k != "scope"] + [("scope", widened or scope)]
    return urlunsplit(parts._replace(query=urlencode(query)))


_METADATA_PATHS = ("/.well-known/oauth-authorization-server", "/.well-known/openid-configuration")


def _issuer_as_origin(response: httpx2.Response, server_url: str) -> httpx2.Response:
    """`response` with the metadata's issuer replaced by the server's origin (see
    `_legacy_metadata`): the SDK checks that issuer against the origin on this path."""
    url = httpx2.URL(server_url)
    metadata = dict(response.json())
    metadata["issuer"] = f"{url.scheme}://{url.netloc.decode()}"
    return httpx2.Response(200, json=metadata, request=response.request)


class _SidecarAuth:
    """Mixin over an SDK provider. Must come first in the MRO.

    What the wrapper adds, in two modes:

    - **daemon** (`interactive=None`): nobody is there to log in. A 401 first tries the refresh
      token (once per request); if that cannot help, or the server answers `403 insufficient_scope`,
      the server's `LoginStatus` records why and which scope it wants, and the response goes back
      to the transport unchanged: that request fails, nothing loops. Discovery and registration are
      left to `sidecar auth login`. Client-credentials grants need no person, so the SDK's flow runs
      in full here.
    - **login** (`interactive` given): the SDK's authorization-code flow runs in full, with the
      stored tokens ignored (a login always authorizes afresh), the scope widened by the one a
      step-up challenge recorded, and at most one authorization per login.

    In both, stored tokens carry an absolute expiry (`RecordStorage`), so after a restart a token
    close to its end is refreshed before it is sent, and the discovered metadata is restored so
    the refresh goes to the right token endpoint. Every refresh runs under the grant store's
    `exclusive(server)` hold and starts from the stored record, never from this process's copy:
    with rotating refresh tokens (each works once) a grant shared by several processes (a fleet's
    replicas on one database, or the daemon and `sidecar auth`) would otherwise be refreshed twice
    with one refresh token, and the second refresh would fail. A process that finds new tokens in
    the store once it holds the lock uses them and does not refresh (`refresh_shared`). The SDK's
    own inline refresh is switched off for this (`_GuardedContext`).

    With `auto` (no `auth` key), a 401 without a Bearer challenge is not OAuth: it goes back to the
    transport untouched.
    """

    context: Any
    _initialized: bool
    status: LoginStatus
    storage: RecordStorage
    auto: bool
    interactive: Interactive | None
    fixed_client: OAuthClientInformationFull | None
    person_needed: bool
    """The grant needs a person (authorization code): the daemon never starts it itself."""
    _authorized: bool
    refused_refresh: str | None
    """The access token whose refresh `refresh_shared` saw refused last (the SDK's handler
    forgets the tokens)."""

    def _setup(self, storage: RecordStorage, status: LoginStatus, *, auto: bool,
               interactive: Interactive | None,
               fixed_client: OAuthClientInformationFull | None, person_needed: bool) -> None:
        self.storage = storage
        self.status = status
        self.auto = auto
        self.interactive = interactive
        self.fixed_client = fixed_client
        self.person_needed = person_needed
        self._authorized = False
        self.refused_refresh = None
        self.context = _guarded(self.context)
        storage.context = lambda: self.context

    def reload(self) -> None:
        """Read the stored grant again before the next request (a login wrote a new one)."""
        self._initialized = False
        self.context.current_tokens = None
        self.context.token_expiry_time = None

    async def _initialize(self) -> None:
        await super()._initialize()  # type: ignore[misc]
        record = await self.storage.record()
        if record is not None:
            restore_metadata(record, self.context)
            self._expiry_from(record)
        if self.interactive is not None:
            # A login authorizes afresh; a client registered for another redirect URI
            # (the loopback port is ephemeral) registers again.
            self.context.clear_tokens()
            client = self.context.client_info
            uris = [str(u) for u in (client.redirect_uris or [])] if client is not None else []
            if client is not None and self.interactive.redirect_uri not in uris:
                self.context.client_info = None
        if self.fixed_client is not None:
            self.context.client_info = self.fixed_client

    def _expiry_from(self, record: GrantRecord) -> None:
        expires_at = record.get("expires_at")
        if expires_at is not None:
            lifetime = float(expires_at) - float(record.get("obtained_at") or 0)
            margin = min(REFRESH_MARGIN, max(lifetime, 0.0) / 4)
            self.context.token_expiry_time = float(expires_at) - margin
        else:
            self.context.token_expiry_time = None

    async def refresh_shared(self, sent: str | None) -> Refreshed:
        """Refresh the tokens, unless another process (or task) already did: `sent` is the
        access token the caller found stale. Holds the grant store's `exclusive(server)` while
        it reads the stored record, and while the refresh request runs; the caller holds
        `context.lock`. Tokens in the store other than `sent` are used as they are when still
        valid, and otherwise their refresh token is the one spent."""
        storage = self.storage
        async with storage.store.exclusive(storage.server):
            found = await storage.current()
            if found is None:
                self.context.clear_tokens()  # logged out elsewhere: never written back
                return "impossible"
            record, tokens = found
            self.context.current_tokens = tokens  # the store's, which may be newer than ours
            self._expiry_from(record)
            if tokens.access_token != sent and self.context.is_token_valid():
                return "adopted"
            if not self.context.refreshable():
                return "impossible"
            request = await self._refresh_token()  # type: ignore[attr-defined]
            try:
                async with httpx2.AsyncClient(timeout=REFRESH_TIMEOUT) as http:
                    response = await http.send(request)
                    await response.aread()
            except httpx2.HTTPError as exc:
                self.status.transient = f"refreshing the token failed: {type(exc).__name__}"
                log.warning("[%s] %s", self.status.server, self.status.transient)
                return "unreachable"
            ok = await self._handle_refresh_response(response)
        if not ok:
            self.refused_refresh = tokens.access_token
        return "refreshed" if ok else "refused"

    async def _refresh_if_due(self) -> Refreshed | None:
        """Before a request: refresh a token that is no longer valid (the SDK's flow would
        have refreshed it inline); None when nothing was due."""
        if self.interactive is not None or self.status.needs_login:
            return None
        if self._initialized and (self.context.is_token_valid()
                                  or not self.context.refreshable()):
            return None
        async with self.context.lock:
            if not self._initialized:
                await self._initialize()
            if self.context.is_token_valid() or not self.context.refreshable():
                return None
            tokens = self.context.current_tokens
            return await self.refresh_shared(tokens.access_token if tokens else None)

    async def _handle_refresh_response(self, response: httpx2.Response) -> bool:
        if response.status_code != 200:
            await response.aread()
        ok: bool = await super()._handle_refresh_response(response)  # type: ignore[misc]
        if not ok:
            error = ""
            try:
                body = response.json()
                error = f": {body.get('error')}" if isinstance(body, dict) else ""
            except ValueError:
                pass
            self.status.require(f"refreshing the token failed (HTTP {response.status_code}"
                                f"{error})")
        return ok

    async def _auth_flow(
        self, request: httpx2.Request
    ) -> AsyncGenerator[httpx2.Request, httpx2.Response]:
        if self.status.needs_login and self._initialized:
            generation = self.storage.generation
            record = await self.storage.record()
            if record is not None and record.get("updated_at") != generation:
                self.reload()
        try:
            due = await self._refresh_if_due()
        except GrantStoreUnavailable as exc:  # e.g. a fleet replica without the grant key
            self.status.store_error = str(exc)
            self.status.require("the stored OAuth grant cannot be used")
            log.warning("[%s] %s", self.status.server, self.status.hint())
            due = "unreachable"
        if due == "unreachable":
            yield request  # without a fresh token: its 401 goes back to the transport
            return
        if self._settled():
            # The common case: no lock held while the request runs (the SDK's flow holds its
            # lock until the response headers arrive, which would serialize concurrent calls
            # to a server that answers with plain JSON at the end of each call).
            tokens = self.context.current_tokens
            if tokens is not None:
                request.headers["Authorization"] = f"Bearer {tokens.access_token}"
            response = yield request
            if not self._challenge(response):
                return
            # Challenged: the SDK's flow sends the request again and handles the answer.
        flow: AsyncGenerator[httpx2.Request, httpx2.Response] = super()._auth_flow(request)  # type: ignore[misc]
        retried_refresh = False
        adopt = False
        try:
            outgoing = await flow.__anext__()
            while True:
                response = yield outgoing
                if outgoing is request and response.status_code in (401, 403):
                    if response.status_code == 401 and self.auto and not _bearer_challenge(
                        response
                    ):
                        return  # not an OAuth challenge: the transport sees the 401
                    if (response.status_code == 401 and not retried_refresh
                            and self.context.refreshable()):
                        # The server no longer takes the token: refresh once (or use the
                        # one another process stored since), then resend.
                        retried_refresh = True
                        await flow.aclose()
                        async with self.context.lock:
                            outcome = await self.refresh_shared(_sent_token(outgoing))
                        if outcome == "unreachable":
                            return  # the transport sees the 401
                        flow = super()._auth_flow(request)  # type: ignore[misc]
                        outgoing = await flow.__anext__()
                        continue
                    if self._needs_person(response):
                        if await self._login_required(response):
                            return
                        adopt = True  # tokens another process has since replaced
                        break
                    if _insufficient_scope(response) and self._authorized:
                        return  # one authorization per login: the caller reports it
                elif outgoing.url.path.startswith(_METADATA_PATHS):
                    await response.aread()
                    if self._legacy_metadata(outgoing, response):
                        response = _issuer_as_origin(response, self.context.server_url)
                outgoing = await flow.asend(response)
        except StopAsyncIteration:
            return
        except AuthorizedElsewhere:  # the tokens are in the store: this and later requests
            adopt = True  # go with them, as after an exchange here
        except LoginRequired as exc:
            adopt = not await self._note(exc.reason, exc.scope, _sent_token(request))
        except OAuthFlowError as exc:
            adopt = not await self._note(f"authorization failed: {exc}", None,
                                         _sent_token(request))
        except (httpx2.HTTPError, ValidationError, ValueError) as exc:
            self.status.transient = f"authorization failed: {type(exc).__name__}: {exc}"
            log.warning("[%s] %s", self.status.server, self.status.transient)
        finally:
            await flow.aclose()
        if adopt:
            await self._adopt(request)
        yield request  # the server's own answer goes back to the transport

    async def _adopt(self, request: httpx2.Request) -> None:
        """Send `request`, and later ones, with the stored tokens."""
        found = await self.storage.current()
        if found is not None:
            self.context.current_tokens = found[1]
            self._expiry_from(found[0])
            request.headers["Authorization"] = f"Bearer {found[1].access_token}"

    def _settled(self) -> bool:
        """Whether a request can go out as it is: initialized, no login pending, and a token
        that is valid (or, before any OAuth challenge, none at all)."""
        if not self._initialized or self.status.needs_login or self.interactive is not None:
            return False
        if self.context.current_tokens is None:
            return self.auto
        return bool(self.context.is_token_valid())

    def _challenge(self, response: httpx2.Response) -> bool:
        """Whether `response` asks for (more) authorization."""
        if response.status_code == 401:
            return not self.auto or _bearer_challenge(response)
        return _insufficient_scope(response)

    def _legacy_metadata(self, outgoing: httpx2.Request, response: httpx2.Response) -> bool:
        """Authorization server metadata fetched on the 2025-03-26 path (no protected resource
        metadata: the MCP server's origin is the authorization server) whose issuer adds a
        path on that same origin (`{origin}/oauth`)."""
        if self.context.auth_server_url is not None or response.status_code != 200:
            return False
        server = httpx2.URL(self.context.server_url)
        if (outgoing.url.scheme, outgoing.url.host, outgoing.url.port) != (
            server.scheme, server.host, server.port
        ):
            return False
        try:
            issuer = httpx2.URL(str(response.json().get("issuer", "")))
        except (ValueError, AttributeError, httpx2.InvalidURL):
            return False
        return (issuer.scheme, issuer.host, issuer.port) == (
            server.scheme, server.host, server.port
        ) and issuer.path not in ("", "/")

    def _needs_person(self, response: httpx2.Response) -> bool:
        return self.person_needed and self.interactive is None and (
            response.status_code == 401 or _insufficient_scope(response)
        )

    async def _login_required(self, response: httpx2.Response) -> bool:
        """Note that `response` asks for a login; False when it refused tokens the store no
        longer holds (see `_note`)."""
        challenged = extract_field_from_www_auth(response, "scope")
        if response.status_code == 403:
            granted = self.context.current_tokens.scope if self.context.current_tokens else None
            scope = union_scopes(granted, challenged)
            reason = f"the server asks for a broader scope ({scope})"
        elif self.status.needs_login:
            scope, reason = challenged, self.status.reason or ""  # e.g. the refresh failed
        else:
            scope = challenged
            reason = "authorization required"
        return await self._note(reason, scope, _sent_token(response.request))

    async def _note(self, reason: str, scope: str | None, refused: str | None) -> bool:
        """A login is needed: say so here and in the grant store. Unless the store holds
        tokens other than `refused` (the access token the refused request carried): another
        process stored them after that request left (a login through another replica), so
        nothing is noted and False tells the caller to send again with them. A login's own
        failure (`interactive`) is always noted."""
        try:
            if not await self.storage.note_login_required(
                    reason, scope, refused, whatever_stored=self.interactive is not None):
                log.info("[%s] a request refused with replaced tokens: sent again with the "
                         "stored ones", self.status.server)
                return False
        except (OSError, GrantStoreUnavailable) as exc:
            if isinstance(exc, GrantStoreUnavailable):
                self.status.store_error = str(exc)
            log.warning("[%s] cannot record the login state: %s", self.status.server, exc)
        self.status.require(reason, scope)
        log.warning("[%s] %s", self.status.server, self.status.hint())
        return True

    async def _redirect(self, url: str) -> None:
        """The SDK's redirect handler: show the URL (login) or refuse (daemon)."""
        if self.interactive is None:
            scope = dict(parse_qsl(urlsplit(url).query)).get("scope")
            raise LoginRequired("authorization required", scope)
        record = await self.storage.record()
        pending = record.get("pending_scope") if record else None
        self._authorized = True
        await self.interactive.show(_with_scope(url, pending))

    async def _callback(self) -> AuthorizationCodeResult:
        assert self.interactive is not None
        return await self.interactive.wait()


class AuthorizationCodeAuth(_SidecarAuth, OAuthClientProvider):
    async def _perform_authorization(self) -> httpx2.Request:
        if self.interactive is not None and self.interactive.elsewhere is not None:
            await self.interactive.elsewhere(self)
        return await super()._perform_authorization()


class ClientSecretAuth(_SidecarAuth, ClientCredentialsOAuthProvider):
    pass


class PrivateKeyJwtAuth(_SidecarAuth, PrivateKeyJWTOAuthProvider):
    pass


class CrossAppAuth(IdentityAssertionOAuthProvider):
    """SEP-990: the SDK's jwt-bearer leg, with the ID-JAG fetched from the enterprise IdP by
    an RFC 8693 token exchange of the configured ID token."""

    def __init__(self, server_url: str, storage: RecordStorage, status: LoginStatus,
                 settings: OAuthSettings, scope: str | None) -> None:
        assert settings.client_id and settings.client_secret and settings.issuer
        method = settings.token_endpoint_auth_method
        super().__init__(
            server_url, storage, settings.client_id, settings.client_secret, settings.issuer,
            self._id_jag, scope=scope,
            token_endpoint_auth_method=(
                "client_secret_basic" if method == "client_secret_basic" else "client_secret_post"
            ),
        )
        self.storage = storage
        self.status = status
        self.settings = settings

    def reload(self) -> None:
        self._initialized = False

    async def _id_jag(self, audience: str, resource: str) -> str:
        settings = self.settings
        assert settings.idp_token_endpoint and settings.id_token and settings.idp_client_id
        async with httpx2.AsyncClient(timeout=30.0) as http:
            response = await http.post(settings.idp_token_endpoint, data={
                "grant_type": "urn:ietf:params:oauth:grant-type:token-exchange",
                "requested_token_type": "urn:ietf:params:oauth:token-type:id-jag",
                "audience": audience,
                "resource": resource,
                "subject_token": settings.id_token,
                "subject_token_type": "urn:ietf:params:oauth:token-type:id_token",
                "client_id": settings.idp_client_id,
            })
        if response.status_code != 200:
            raise OAuthFlowError(f"the IdP refused the token exchange (HTTP "
                                 f"{response.status_code})")
        token = response.json().get("access_token")
        if not isinstance(token, str):
            raise OAuthFlowError("the IdP's token exchange answer has no access_token")
        return token


SidecarAuth = AuthorizationCodeAuth | ClientSecretAuth | PrivateKeyJwtAuth | CrossAppAuth


def build_auth(
    server: str,
    config: ServerConfig,
    store: GrantStore,
    status: LoginStatus,
    *,
    interactive: Interactive | None = None,
    on_secret: Callable[[str], None] | None = None,
) -> SidecarAuth:
    """The auth of one HTTP server entry whose `oauth_mode` is not `none`."""
    assert config.url is not None
    settings = config.oauth or OAuthSettings()
    scope = " ".join(settings.scopes) if settings.scopes else None

    def seen(tokens: Any) -> None:
        if on_secret is not None:
            for secret in (tokens.access_token, tokens.refresh_token):
                if secret:
                    on_secret(secret)

    storage = RecordStorage(store, server, canonical_resource(config.url), on_tokens=seen,
                            on_saved=status.clear)
    auto = config.oauth_mode == "auto"
    provider: SidecarAuth
    with warnings.catch_warnings():
        # Omitting `issuer` is deprecated in the SDK; it stays optional in the manifest.
        warnings.simplefilter("ignore")
        if settings.grant == "cross_app_access":
            return CrossAppAuth(config.url, storage, status, settings, scope)
        if settings.grant == "client_credentials":
            assert settings.client_id is not None
            if settings.private_key:
                assertion = SignedJWTParameters(
                    issuer=settings.client_id, subject=settings.client_id,
                    signing_key=settings.private_key,
                    signing_algorithm=settings.signing_algorithm,
                ).create_assertion_provider()
                provider = PrivateKeyJwtAuth(
                    config.url, storage, settings.client_id, assertion, scope=scope,
                    issuer=settings.issuer,
                )
            else:
                assert settings.client_secret is not None
                method = settings.token_endpoint_auth_method
                provider = ClientSecretAuth(
                    config.url, storage, settings.client_id, settings.client_secret,
                    token_endpoint_auth_method=(
                        method if method == "client_secret_post" else "client_secret_basic"
                    ),
                    scope=scope, issuer=settings.issuer,
                )
            provider._setup(storage, status, auto=auto, interactive=None, fixed_client=None,
                            person_needed=False)
            return provider
        redirect_uri = (interactive.redirect_uri if interactive is not None
                        else settings.redirect_uri or DAEMON_REDIRECT_URI)
        metadata = OAuthClientMetadata(
            client_name=settings.client_name,
            redirect_uris=[AnyUrl(redirect_uri)],
            scope=scope,
            token_endpoint_auth_method=settings.token_endpoint_auth_method,
        )
        fixed = None
        if settings.client_id:
            fixed = OAuthClientInformationFull(
                client_id=settings.client_id,
                client_secret=settings.client_secret,
                redirect_uris=[AnyUrl(redirect_uri)],
                token_endpoint_auth_method=settings.token_endpoint_auth_method or (
                    "client_secret_basic" if settings.client_secret else "none"
                ),
            )
        code = AuthorizationCodeAuth(
            config.url, metadata, storage, client_metadata_url=settings.client_metadata_url,
        )
    code._setup(storage, status, auto=auto, interactive=interactive, fixed_client=fixed,
                person_needed=True)
    code.context.redirect_handler = code._redirect
    code.context.callback_handler = code._callback
    return code

"""HTTP security shared by every route (`/v1`, `/mcp`, `/metrics`): `SecurityMiddleware` (what
it checks, in which order, is its docstring), the bearer token (`load_or_create_token`) and
the strict parsers of `Host` and `Origin`. Errors are JSON: `{"error": {"code", "message"}}`.
The token is never logged.

Imports `sidecar.serve.serve_policy`. Exports `SecurityMiddleware`, `load_or_create_token`,
`token_owner`, `profile_allowed`, `parse_authority`, `host_allowed`, `origin_allowed`,
`request_problem`, `TokenUnverifiable`, `TokenRefused` and the scope keys and paths
(`TOKEN_KEY`, `GRANT_KEY`, `ADMIT_KEY`, `USER_KEY`, `ROLE_KEY`, `MCP_PROFILE_PATH`,
`LOGIN_CALLBACK_PATH`, `SERVER_CARD_PATH`, `SCOPED_API_PATHS`, `TOKEN_FILE`, `LOCAL_HOSTS`).
"""

from __future__ import annotations

import errno
import hmac
import ipaddress
import json
import os
import re
import secrets
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from starlette.types import ASGIApp, Receive, Scope, Send

from sidecar.serve.serve_policy import check_token_file

if TYPE_CHECKING:
    from sidecar.serve.identities.roles import Identity

GRANT_KEY = "sidecar.grant"
"""The ASGI scope key holding the profiles a scoped token reaches (absent: every profile)."""
TOKEN_KEY = "sidecar.token"
USER_KEY = "sidecar.user"
"""The ASGI scope key of the signed-in user's name (`sidecar.serve.identities`): an identity
provider's access token, or a scoped token that belongs to a user."""
ROLE_KEY = "sidecar.role"
"""The ASGI scope key of that user's role (admin, operator, user)."""
ADMIT_KEY = "sidecar.admit"
"""The ASGI scope key of a callable (no arguments) the HTTP connection puts there: called once
the request presented a valid bearer token, so that a connection flood evicts the
connections of clients without one first (`sidecar.serve.http_guard`)."""


def token_owner(scope: Scope | None) -> str | None:
    """The client per-client limits count against: `"user:<name>"` for a signed-in user,
    `"token:<id>"` for a request a scoped token authenticated, None for the all-access token
    (callers then count the session)."""
    user = scope.get(USER_KEY) if scope is not None else None
    if isinstance(user, str):
        return f"user:{user}"
    token_id = scope.get(TOKEN_KEY) if scope is not None else None
    return f"token:{token_id}" if isinstance(token_id, str) else None
"""The ASGI scope key holding the id of the scoped token the request came with (absent: the
all-access token, or no authentication): what per-client limits count against."""
MCP_PROFILE_PATH = re.compile(r"/mcp(?:/([A-Za-z0-9_-]{1,64}))?")
LOGIN_CALLBACK_PATH = re.compile(r"/v1/auth/[^/]+/callback")
"""The browser's OAuth redirect (`SIDECAR_PUBLIC_URL`): it carries no bearer token; the
login's `state` authorizes it (`sidecar.serve.auth_api`)."""
SERVER_CARD_PATH = re.compile(
    r"/\.well-known/mcp/(?:server-card(?:\.json)?(?:/[^/]+)?|catalog\.json)"
    r"|/mcp(?:/[^/]+)?/server-card")
"""MCP Server Cards and their catalog (`mcp_facade.server_card`): public metadata read before
a client connects, so no token is asked for."""
_USER_TOKEN_PATHS = re.compile(r"/v1/(?:calls|permissions|permissions/[^/]+/reply|"
                               r"auth/[^/]+|auth/[^/]+/login)")
SCOPED_API_PATHS = re.compile(r"/v1/(?:tools|snapshots|snapshots/[^/]+/calls|managed/[^/]+)")
"""What a scoped token may reach besides `/mcp` and `/mcp/NAME` of its profiles: listing
tools, snapshots and calls on them (each checks the profile), and retained text."""

Verifier = Callable[[str], Awaitable[tuple[str, frozenset[str], str | None] | None]]
"""A presented bearer secret -> its scoped token's id, the profiles it reaches and the user it
belongs to (None: not one)."""
IdentityVerifier = Callable[[str], Awaitable["Identity | None"]]
"""A presented bearer secret -> the signed-in person it proves (None: not an access token of
the configured provider); raises `TokenRefused` (401, its message) or `TokenUnverifiable`."""
RouteRefusal = Callable[["Identity", str, str], str | None]
"""(identity, path, method) -> why the identity's role may not reach the route, or None."""


def profile_allowed(scope: Scope, profile: str) -> bool:
    """Whether the request's token reaches `profile` (the all-access token reaches all)."""
    grant: frozenset[str] | None = scope.get(GRANT_KEY)
    return grant is None or profile in grant

TOKEN_FILE = "token"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def load_or_create_token(state_dir: Path) -> tuple[str, bool]:
    """(token, created): `SIDECAR_TOKEN` if set, else the state file, else a new one.
    `UnsafeConfiguration` for a state file that is a symlink, another user's, or readable or
    writable by others (`serve_policy.check_token_file`)."""
    explicit = os.environ.get("SIDECAR_TOKEN")
    if explicit:
        return explicit, False
    path = state_dir / TOKEN_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        fd = -1
    except OSError as exc:
        if exc.errno != errno.ELOOP:
            raise
        check_token_file(path, path.lstat())  # a symlink: refused
        raise
    if fd >= 0:
        with os.fdopen(fd) as f:
            check_token_file(path, os.fstat(f.fileno()))
            token = f.read(64 * 1024).strip()
        if token:
            return token, False
    state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


_PORT = r"(?::([0-9]{1,5}))?"
_REG_NAME = re.compile(r"([a-z0-9](?:[a-z0-9._-]*[a-z0-9])?)" + _PORT)
_IP_LITERAL = re.compile(r"\[([0-9a-f:.]+)\]" + _PORT)
_ORIGIN = re.compile(r"(https?)://([^/?#@\\]+)")


def parse_authority(value: str) -> str | None:
    """The host name of a `Host` header value (`host[:port]`, RFC 9110), lower case with an
    IPv6 literal in brackets; None when the value is anything else.

    Strict on purpose: no user info (`localhost:80@evil`), nothing after an IPv6 literal
    (`[::1]evil`), a port of digits only (at most 65535), no whitespace, no empty name.
    """
    text = value.lower()
    literal = _IP_LITERAL.fullmatch(text)
    if literal is not None:
        try:
            ipaddress.IPv6Address(literal.group(1))
        except ValueError:
            return None
        host, port = f"[{literal.group(1)}]", literal.group(2)
    else:
        name = _REG_NAME.fullmatch(text)
        if name is None:
            return None
        host, port = name.group(1), name.group(2)
    if port is not None and int(port) > 65535:
        return None
    return host


def host_allowed(host: str | None, extra: frozenset[str]) -> bool:
    if not host:
        return False
    name = parse_authority(host)
    return name is not None and (name in LOCAL_HOSTS or name in extra)


def origin_allowed(origin: str | None, extra: frozenset[str]) -> bool:
    """An absent Origin is allowed (not a browser, or same-origin navigation); a present one
    must be exactly `http(s)://host[:port]` with a local host (no path, no user info)."""
    if origin is None:
        return True
    match = _ORIGIN.fullmatch(origin.lower())
    if match is None:
        return False
    name = parse_authority(match.group(2))
    return name is not None and (name in LOCAL_HOSTS or name in extra)


def request_problem(scope: Scope) -> str | None:
    """Why a request is malformed before any header is trusted, or None: an absolute-form or
    authority-form request target (only `/path` is served; `*` for OPTIONS), or a `Host` or
    `Origin` header sent more than once (which one wins differs between parsers)."""
    raw_path = scope.get("raw_path") or scope.get("path", "").encode()
    if not raw_path.startswith(b"/") and not (scope.get("method") == "OPTIONS"
                                              and raw_path == b"*"):
        return "the request target must be a path (absolute-form targets are refused)"
    seen: set[bytes] = set()
    for name, _ in scope["headers"]:
        if name in (b"host", b"origin"):
            if name in seen:
                return f"more than one {name.decode().capitalize()} header"
            seen.add(name)
    return None


class TokenUnverifiable(Exception):
    """A scoped token could not be checked (its store, the fleet database, does not answer):
    the message says so, answered 503 `unavailable`."""


class TokenRefused(Exception):
    """A bearer token that is well formed but refused (an access token for another audience,
    expired, of another issuer, of a person without a grant): 401 with this message."""


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mcp-sidecar"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


def _admit(scope: Scope) -> None:
    admit = scope.get(ADMIT_KEY)
    if callable(admit):
        admit()


class SecurityMiddleware:
    """ASGI middleware: Host/Origin checks, then the bearer token.

    - Malformed requests are refused with 400 first (`request_problem`): a request target
      that is not a path (absolute-form `GET http://evil/...`), a duplicated Host or Origin
      header.
    - DNS-rebinding protection: a request whose `Host` is not a local name (127.0.0.1,
      localhost, [::1], plus configured extra hosts) or whose `Origin`, when present, is not a
      local origin is refused with 403, before authentication and before any route runs. Both
      are parsed strictly (`parse_authority`): `[::1]evil` or `localhost:1@evil` is not local.
    - Bearer token, required by default (`load_or_create_token`: `<state>/token`, created
      0600 on first start; `SIDECAR_TOKEN` overrides it). `auth=False` (`--no-auth`) disables
      the check explicitly.
    - Scoped tokens (`sidecar.stores.tokens`, `sidecar token create --profile NAME`): a bearer
      that is not the token above is looked up (`scoped`); it reaches only `/mcp/NAME` (and
      `/mcp` when the default profile is one) of its profiles, and on `/v1` only tools,
      snapshots and calls of its profiles (the API checks the profile) and retained text;
      anything else is 403 `forbidden_profile`.
    - Access tokens of the manifest's OpenID provider (`[auth.oidc]`, `identify`): a signed
      JWT proves a person; their role (`route_refusal`) decides which routes they reach (403
      `forbidden_role`), their grant which profiles; a refused token is 401 with the reason
      (wrong audience, expired, another issuer, no grant). docs/identities.md.
    - The OAuth login callback (`GET /v1/auth/NAME/callback`) needs no token: the browser's
      redirect has none; the login's single-use `state` is what authorizes it. Nor do the MCP
      Server Cards and their catalog (GET of `SERVER_CARD_PATH`): public by design.
    """

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allowed_hosts: Iterable[str] = (),
        open_paths: Iterable[str] = (),
        scoped: Verifier | None = None,
        identify: IdentityVerifier | None = None,
        route_refusal: RouteRefusal | None = None,
        default_profile: Callable[[], str] = lambda: "default",
        own_auth_prefix: str | None = None,
    ) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._scoped = scoped
        self._identify = identify
        self._route_refusal = route_refusal
        self._default_profile = default_profile
        self._extra = frozenset(h.lower() for h in allowed_hosts)
        self._open = frozenset(open_paths)
        # routes under this prefix (the console, `/ui`) check their own login cookie
        self._own_auth = own_auth_prefix

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        problem = request_problem(scope)
        if problem is not None:
            await _refuse(send, 400, "bad_request", problem)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host"), self._extra):
            await _refuse(send, 403, "forbidden_host", "the Host header is not a local name")
            return
        if not origin_allowed(headers.get("origin"), self._extra):
            await _refuse(send, 403, "forbidden_origin", "the Origin is not a local origin")
            return
        path = scope["path"]
        own = self._own_auth is not None and (
            path == self._own_auth or path.startswith(self._own_auth + "/"))
        if self._token is not None and path not in self._open and not own and (
            LOGIN_CALLBACK_PATH.fullmatch(path) is None
            and (SERVER_CARD_PATH.fullmatch(path) is None or scope["method"] != "GET")
        ):
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            value = value.strip()
            verified_all = scheme.lower() == "bearer" and hmac.compare_digest(
                value.encode(), self._token)
            if not verified_all and self._identify is not None and scheme.lower() == "bearer" \
                    and not value.startswith("sct_"):
                await self._with_identity(scope, receive, send, value)
                return
            if not verified_all:
                try:
                    verified = await self._scoped(value) if self._scoped is not None and (
                        scheme.lower() == "bearer") else None
                except TokenUnverifiable as exc:  # the tokens' database is down
                    await _refuse(send, 503, "unavailable", str(exc))
                    return
                if verified is None:
                    await _refuse(send, 401, "unauthorized", "a valid bearer token is required")
                    return
                _admit(scope)
                token_id, grant, user = verified
                refusal = self._scope_refusal(scope["path"], grant, user)
                if refusal is not None:
                    await _refuse(send, 403, "forbidden_profile", refusal)
                    return
                scope[GRANT_KEY] = grant
                scope[TOKEN_KEY] = token_id
                if user is not None:  # a user's token: their history, their quotas
                    scope[USER_KEY], scope[ROLE_KEY] = user, "user"
            else:
                _admit(scope)
        await self.app(scope, receive, send)

    async def _with_identity(self, scope: Scope, receive: Receive, send: Send,
                             value: str) -> None:
        """A bearer that may be the identity provider's access token (`identify`)."""
        assert self._identify is not None
        try:
            identity = await self._identify(value)
        except TokenUnverifiable as exc:
            await _refuse(send, 503, "unavailable", str(exc))
            return
        except TokenRefused as exc:
            await _refuse(send, 401, "unauthorized", str(exc))
            return
        if identity is None:
            await _refuse(send, 401, "unauthorized", "a valid bearer token is required")
            return
        _admit(scope)
        refusal = self._route_refusal(identity, scope["path"], scope.get("method", "GET")) \
            if self._route_refusal is not None else None
        if refusal is not None:
            await _refuse(send, 403, "forbidden_role", refusal)
            return
        scope[USER_KEY] = identity.user
        scope[ROLE_KEY] = identity.role
        if identity.profiles is not None or identity.role == "user":
            scope[GRANT_KEY] = identity.profiles if identity.profiles else frozenset(
                {self._default_profile()})
        await self.app(scope, receive, send)

    def _scope_refusal(self, path: str, grant: frozenset[str],
                       user: str | None = None) -> str | None:
        """Why a scoped token may not reach `path` (None: it may, so far). A token that
        belongs to a user also reads that user's history (`/v1/calls`), the asks of their
        calls (`/v1/permissions`) and their own grants (`/v1/auth/NAME`, `AuthApi`)."""
        if user is not None and _USER_TOKEN_PATHS.fullmatch(path):
            return None
        mcp = MCP_PROFILE_PATH.fullmatch(path)
        if mcp is not None:
            profile = mcp.group(1) or self._default_profile()
            if profile in grant:
                return None
            return f"this token reaches only the profiles {', '.join(sorted(grant))}"
        if SCOPED_API_PATHS.fullmatch(path):
            return None
        return ("this token is scoped to profiles; it reaches /mcp/NAME, /v1/tools, "
                "/v1/snapshots and calls on them, and /v1/managed")

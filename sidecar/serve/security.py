"""HTTP security shared by every route (`/v1`, `/mcp`, `/metrics`).

- Bearer token, required by default. `load_or_create_token(state_dir)` reads
  `<state>/token`, or creates it (mode 0600) on first start; `SIDECAR_TOKEN` overrides it.
  `auth=False` (`--no-auth`) disables the check explicitly.
- DNS-rebinding protection: a request whose `Host` is not a local name (127.0.0.1,
  localhost, [::1], plus configured extra hosts) or whose `Origin`, when present, is not a
  local origin is refused with 403, before authentication and before any route runs.

Errors are JSON: `{"error": {"code", "message"}}`. The token is never logged.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
from collections.abc import Iterable
from pathlib import Path
from urllib.parse import urlsplit

from starlette.types import ASGIApp, Receive, Scope, Send

GRANT_KEY = "sidecar.grant"
"""The ASGI scope key holding the profiles a scoped token reaches (absent: every profile)."""


def profile_allowed(scope: Scope, profile: str) -> bool:
    """Whether the request's token reaches `profile` (the all-access token reaches all)."""
    grant: frozenset[str] | None = scope.get(GRANT_KEY)
    return grant is None or profile in grant

TOKEN_FILE = "token"
LOCAL_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def load_or_create_token(state_dir: Path) -> tuple[str, bool]:
    """(token, created): `SIDECAR_TOKEN` if set, else the state file, else a new one."""
    explicit = os.environ.get("SIDECAR_TOKEN")
    if explicit:
        return explicit, False
    path = state_dir / TOKEN_FILE
    try:
        token = path.read_text().strip()
        if token:
            return token, False
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    token = secrets.token_urlsafe(32)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(token + "\n")
    return token, True


def _hostname(host: str) -> str:
    host = host.strip().lower()
    if host.startswith("["):
        return host[: host.find("]") + 1] if "]" in host else host
    return host.rsplit(":", 1)[0] if host.count(":") == 1 else host


def host_allowed(host: str | None, extra: frozenset[str]) -> bool:
    if not host:
        return False
    name = _hostname(host)
    return name in LOCAL_HOSTS or name in extra


def origin_allowed(origin: str | None, extra: frozenset[str]) -> bool:
    if origin is None:
        return True  # not a browser, or a same-origin navigation
    parts = urlsplit(origin)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    name = parts.hostname.lower()
    return name in LOCAL_HOSTS or f"[{name}]" in LOCAL_HOSTS or name in extra


async def _refuse(send: Send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"code": code, "message": message}}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    if status == 401:
        headers.append((b"www-authenticate", b'Bearer realm="mcp-sidecar"'))
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class SecurityMiddleware:
    """ASGI middleware: Host/Origin checks, then the bearer token."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        token: str | None,
        allowed_hosts: Iterable[str] = (),
        open_paths: Iterable[str] = (),
    ) -> None:
        self.app = app
        self._token = token.encode() if token else None
        self._extra = frozenset(h.lower() for h in allowed_hosts)
        self._open = frozenset(open_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not host_allowed(headers.get("host"), self._extra):
            await _refuse(send, 403, "forbidden_host", "the Host header is not a local name")
            return
        if not origin_allowed(headers.get("origin"), self._extra):
            await _refuse(send, 403, "forbidden_origin", "the Origin is not a local origin")
            return
        if self._token is not None and scope["path"] not in self._open:
            given = headers.get("authorization", "")
            scheme, _, value = given.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                value.strip().encode(), self._token
            ):
                await _refuse(send, 401, "unauthorized", "a valid bearer token is required")
                return
        await self.app(scope, receive, send)

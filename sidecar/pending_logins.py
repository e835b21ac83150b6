"""OAuth logins waiting for the browser's redirect, readable by the replica that receives it.

With a public URL (`SIDECAR_PUBLIC_URL=https://gateway.example`), a login started inside the
daemon (`POST /v1/auth/{server}/login`, the console, an MCP client asked to open a URL)
redirects the browser to `{public URL}/v1/auth/{server}/callback` instead of a loopback
listener. Behind a load balancer that request may reach any replica, so the replica that
started the login keeps what finishing it needs here, under the OAuth `state` it sent:

    await pending.add(state, server, record, ttl)     # the starting replica
    record = await pending.take(state, server)        # the replica the browser reached: once
    await pending.finish(state, "authorized", text)   # its result, for the starting replica
    await pending.outcome(state)                      # ("authorized" | "failed", text) or None

`record` is opaque here (the OAuth bridge's: PKCE verifier, registered client, discovered
metadata, redirect URI); it holds secrets, so a shared implementation seals it
(`sidecar.postgres_pending_logins`, with `SIDECAR_GRANT_KEY`). `take` succeeds once per state,
before its expiry, for the server the login was started for; otherwise it raises
`LoginStateRejected` saying which: unknown, expired or already used. Rows are keyed by a hash
of the state, never the state itself. The embedded default, `MemoryPendingLogins`, serves one
process (a single daemon behind a reverse proxy).
"""

from __future__ import annotations

import hashlib
import os
import time
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlsplit

PUBLIC_URL_ENV = "SIDECAR_PUBLIC_URL"
PENDING_LOGIN_SECONDS = 300.0
"""How long a login waits for the browser's redirect (the state's expiry)."""
KEEP_USED_SECONDS = 3600.0
"""How long an expired or used state is remembered, so a replay is named as such."""

PendingRecord = dict[str, Any]
Rejection = Literal["unknown_state", "expired_state", "used_state"]


class LoginStateRejected(Exception):
    """A callback whose `state` cannot finish a login; `code` says why."""

    def __init__(self, code: Rejection, server: str) -> None:
        self.code = code
        why = {
            "unknown_state": f"no login of {server!r} was started with this state (it may "
                             "belong to another server, or was forgotten)",
            "expired_state": f"this login of {server!r} expired: the redirect did not come "
                             f"back within {PENDING_LOGIN_SECONDS:g} s; start the login again",
            "used_state": f"this login of {server!r} was already completed with this state "
                          "(a state works once); start the login again if needed",
        }[code]
        super().__init__(why)


def state_key(state: str) -> str:
    """What a state is stored under: its SHA-256 (a stored key cannot finish a login)."""
    return hashlib.sha256(state.encode()).hexdigest()


class PendingLogins(Protocol):
    async def add(self, state: str, server: str, record: PendingRecord, ttl: float) -> None:
        """Keep `record` for `ttl` seconds under `state` (fresh, random, never reused)."""
        ...

    async def take(self, state: str, server: str) -> PendingRecord:
        """The record of `state` for `server`, once; `LoginStateRejected` otherwise."""
        ...

    async def finish(self, state: str, outcome: str, message: str) -> None:
        """Record how the login of a taken `state` ended (`message` holds no secret)."""
        ...

    async def outcome(self, state: str) -> tuple[str, str] | None:
        """How the login of `state` ended, or None while it has not."""
        ...


@dataclass(slots=True)
class _Entry:
    server: str
    record: PendingRecord | None
    expires_at: float
    used: bool = False
    outcome: tuple[str, str] | None = None


@dataclass(slots=True)
class MemoryPendingLogins:
    """`PendingLogins` in this process's memory (no fleet database)."""

    _entries: dict[str, _Entry] = field(default_factory=dict)

    async def add(self, state: str, server: str, record: PendingRecord, ttl: float) -> None:
        now = time.monotonic()
        for key in [k for k, e in self._entries.items()
                    if e.expires_at + KEEP_USED_SECONDS < now]:
            del self._entries[key]
        self._entries[state_key(state)] = _Entry(server, record, now + ttl)

    async def take(self, state: str, server: str) -> PendingRecord:
        entry = self._entries.get(state_key(state))
        if entry is None or entry.server != server:
            raise LoginStateRejected("unknown_state", server)
        if entry.used:
            raise LoginStateRejected("used_state", server)
        if entry.expires_at <= time.monotonic():
            raise LoginStateRejected("expired_state", server)
        record, entry.record, entry.used = entry.record, None, True
        assert record is not None
        return record

    async def finish(self, state: str, outcome: str, message: str) -> None:
        entry = self._entries.get(state_key(state))
        if entry is not None:
            entry.outcome = (outcome, message)

    async def outcome(self, state: str) -> tuple[str, str] | None:
        entry = self._entries.get(state_key(state))
        return None if entry is None else entry.outcome

    def expire(self, state: str) -> None:
        """Make `state` expired now (tests of the expiry path)."""
        self._entries[state_key(state)].expires_at = time.monotonic()


@dataclass(frozen=True, slots=True)
class LoginCallbacks:
    """Logins redirect to the daemon's public URL (not a loopback listener): set when the
    operator names one (`SIDECAR_PUBLIC_URL`). `pending` keeps the logins waiting for it."""

    public_url: str
    pending: PendingLogins

    def redirect_uri(self, server: str) -> str:
        return f"{self.public_url}/v1/auth/{quote(server, safe='')}/callback"

    @property
    def host(self) -> str:
        """The public URL's host name (an IPv6 literal in brackets): requests naming it in
        their `Host` header are the daemon's own."""
        name = urlsplit(self.public_url).hostname or ""
        return f"[{name}]" if ":" in name else name


def public_url_from_env(environ: Any = None) -> str | None:
    """`SIDECAR_PUBLIC_URL` without a trailing slash (None when unset); `ValueError` naming the
    variable when it is not an absolute http(s) URL without query or fragment."""
    env = os.environ if environ is None else environ
    text = env.get(PUBLIC_URL_ENV, "").strip()
    if not text:
        return None
    parts = urlsplit(text)
    if parts.scheme not in ("http", "https") or not parts.netloc or parts.query or (
        parts.fragment or "@" in parts.netloc
    ):
        raise ValueError(f"{PUBLIC_URL_ENV}={text!r} is not an absolute http(s) URL of this "
                         "daemon (e.g. https://gateway.example), without query or fragment")
    return text.rstrip("/")

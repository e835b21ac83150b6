"""The pending logins' port: OAuth logins waiting for the browser's redirect to the daemon's
public URL (`SIDECAR_PUBLIC_URL`), readable by whichever replica the redirect reaches.

    await pending.add(state, server, record, ttl)     # the starting replica
    record = await pending.take(state, server)        # the replica the browser reached: once
    await pending.finish(state, "authorized", text)   # its result, for the starting replica
    await pending.outcome(state, within)              # ("authorized" | "failed", text) or None
    await pending.latest(server, within)              # the server's newest login, any replica

`record` is opaque (the OAuth bridge's; it holds secrets, so a shared store seals it). `take`
succeeds once per state, before its expiry, for the server the login was started for, else
raises `LoginStateRejected`. Rows are keyed by `state_key`, never the state itself.

Imports nothing of the sidecar. Exports `PendingLogins`, `LoginCallbacks`, `LoginSeen`, `seen`,
`LoginStateRejected`, `state_key` and the settings (`public_url_from_env`, ...).
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from typing import Any, Literal, Protocol
from urllib.parse import quote, urlsplit

PUBLIC_URL_ENV = "SIDECAR_PUBLIC_URL"
PENDING_LOGIN_SECONDS = 300.0
"""How long a login waits for the browser's redirect (the state's expiry)."""
EXCHANGE_TIMEOUT_ENV = "SIDECAR_LOGIN_EXCHANGE_TIMEOUT"
EXCHANGE_SECONDS = 30.0
"""How long the replica the redirect reaches may spend exchanging the code at the token
endpoint (`SIDECAR_LOGIN_EXCHANGE_TIMEOUT`); the starting replica waits twice that after the
redirect was taken before it calls the login failed."""
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

    async def outcome(self, state: str, within: float) -> tuple[str, str] | None:
        """How the login of `state` ended, or None while it has not; ("failed", why) once
        its redirect was taken over `within` seconds ago without an outcome."""
        ...

    async def latest(self, server: str, within: float) -> LoginSeen | None:
        """The newest login of `server` this store remembers (any replica's), or None;
        `within` as for `outcome`."""
        ...


@dataclass(frozen=True, slots=True)
class LoginSeen:
    """A login as the pending logins know it: `key` is its `state_key`."""

    key: str
    state: str  # pending | authorized | failed
    message: str
    started_at: float
    replica: str

    @property
    def ended(self) -> tuple[str, str] | None:
        """(state, message) once the login ended, None while it is pending (`outcome`)."""
        return None if self.state == "pending" else (self.state, self.message)

    def to_json(self) -> dict[str, Any]:
        """As `GET /v1/auth/{server}` shows a login (`login`), without the authorization
        URL, which only the starting replica holds."""
        return {"state": self.state, "authorization_url": None, "message": self.message,
                "started_at": self.started_at, "replica": self.replica}


def seen(key: str, server: str, *, replica: str, started_at: float, expired: bool,
         taken_by: str | None, taken_for: float | None, outcome: tuple[str, str] | None,
         within: float) -> LoginSeen:
    """What a stored login amounts to now (both stores): its outcome when recorded; failed
    once expired untaken, or taken over `within` seconds ago without an outcome; else
    pending, saying where it waits."""
    if outcome is not None:
        state, message = outcome
    elif taken_by is not None and taken_for is not None and taken_for > within:
        state, message = "failed", (
            f"{server}: replica {taken_by} received the browser's redirect {taken_for:.0f} s "
            "ago and did not finish the login (it may have stopped mid-exchange); start the "
            "login again")
    elif taken_by is not None:
        state, message = "pending", (f"the browser's redirect reached replica {taken_by}, "
                                     "which is finishing the login")
    elif expired:
        state, message = "failed", (f"the redirect did not come back within "
                                    f"{PENDING_LOGIN_SECONDS:g} s; start the login again")
    else:
        state, message = "pending", (f"waiting for the browser (started on replica "
                                     f"{replica}, which shows its authorization URL)")
    return LoginSeen(key, state, message, started_at, replica)


def exchange_timeout_from_env(environ: Any = None) -> float:
    """`SIDECAR_LOGIN_EXCHANGE_TIMEOUT` in seconds (default 30); `ValueError` naming the
    variable when it is not a number in (0, 3600]."""
    env = os.environ if environ is None else environ
    text = env.get(EXCHANGE_TIMEOUT_ENV, "").strip()
    if not text:
        return EXCHANGE_SECONDS
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value <= 3600:
        raise ValueError(f"{EXCHANGE_TIMEOUT_ENV}={text!r} is not a number of seconds in "
                         "(0, 3600]")
    return value


@dataclass(frozen=True, slots=True)
class LoginCallbacks:
    """Logins redirect to the daemon's public URL (not a loopback listener): set when the
    operator names one (`SIDECAR_PUBLIC_URL`). `pending` keeps the logins waiting for it."""

    public_url: str
    pending: PendingLogins
    exchange_timeout: float = EXCHANGE_SECONDS
    """The receiver's bound on the code exchange (`SIDECAR_LOGIN_EXCHANGE_TIMEOUT`)."""

    @property
    def finish_within(self) -> float:
        """How long after its redirect was taken a login may go without an outcome."""
        return 2 * self.exchange_timeout

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

"""Console login sessions: a random session id in an HttpOnly cookie, a CSRF token per session.
Imports nothing of ours. Exports `ConsoleSessions`, `ConsoleSession`, `COOKIE`,
`SESSION_SECONDS` and `MAX_SESSIONS`.
"""

from __future__ import annotations

import hmac
import secrets
import time
from dataclasses import dataclass

from starlette.requests import Request
from starlette.responses import Response

COOKIE = "sidecar_ui"
SESSION_SECONDS = 12 * 3600
MAX_SESSIONS = 64


@dataclass(slots=True)
class ConsoleSession:
    csrf: str
    expires: float
    label: str = ""
    """The session id the console's own tool runs carry (`console-...`: not a secret)."""
    user: str | None = None
    """Who signed in through the identity provider (None: the daemon's token)."""
    role: str = "admin"
    """Their role (docs/identities.md); the daemon's token is `admin`."""


class ConsoleSessions:
    def __init__(self, token: str | None) -> None:
        self._token = token.encode() if token else None
        self._sessions: dict[str, ConsoleSession] = {}

    @property
    def needs_login(self) -> bool:
        return self._token is not None

    def token_ok(self, given: str) -> bool:
        if self._token is None:
            return True
        return hmac.compare_digest(given.strip().encode(), self._token)

    def start(self, response: Response, user: str | None = None, role: str = "admin") -> None:
        now = time.monotonic()
        self._sessions = {k: s for k, s in self._sessions.items() if s.expires > now}
        while len(self._sessions) >= MAX_SESSIONS:
            del self._sessions[next(iter(self._sessions))]
        sid = secrets.token_urlsafe(32)
        self._sessions[sid] = ConsoleSession(secrets.token_urlsafe(24), now + SESSION_SECONDS,
                                             _label(), user, role)
        response.set_cookie(COOKIE, sid, max_age=SESSION_SECONDS, path="/ui", httponly=True,
                            samesite="strict")

    def end(self, request: Request, response: Response) -> None:
        self._sessions.pop(request.cookies.get(COOKIE, ""), None)
        response.delete_cookie(COOKIE, path="/ui", httponly=True, samesite="strict")

    def session(self, request: Request) -> ConsoleSession | None:
        """The request's session, or None. Without a token (`--no-auth`) every request has one."""
        if self._token is None:
            return self._sessions.setdefault("", ConsoleSession(secrets.token_urlsafe(24),
                                                                float("inf"), _label()))
        found = self._sessions.get(request.cookies.get(COOKIE, ""))
        if found is None or found.expires <= time.monotonic():
            return None
        return found

    @staticmethod
    def csrf_ok(session: ConsoleSession, given: str | None) -> bool:
        return given is not None and hmac.compare_digest(given.encode(), session.csrf.encode())


def _label() -> str:
    return "console-" + secrets.token_hex(4)

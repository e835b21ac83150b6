"""Logins started inside the daemon: `POST /v1/auth/{server}/login`, the console's button, and
a downstream MCP client asked to open the authorization URL (URL-mode elicitation).

    attempt = await logins.begin(server, config)   # once the authorization URL is known
    attempt.authorization_url                       # what to open in a browser
    await attempt.finished(within)                  # True once the login ended (any result)

One login per server at a time: a second `begin` while one is pending joins it, unless its
redirect already came back to another replica (the outcome is in the pending logins before
this replica's next look at it): then its state is spent, and a new login starts. The login
itself is `login.login` (loopback callback on the daemon's machine, or, with the daemon's
public URL, `GET /v1/auth/{server}/callback` on any replica; tokens to the grant store, where
the waiting server finds them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from bridges.manifest.loading import ServerConfig
from bridges.mcp.oauth.login import login
from sidecar.stores.grants import GrantStore
from sidecar.stores.pending_logins import LoginCallbacks, state_key

URL_WAIT = 30.0
"""How long `begin` waits for discovery and registration to give the URL."""


@dataclass(slots=True)
class LoginAttempt:
    state: str = "pending"  # pending | authorized | failed
    authorization_url: str | None = None
    message: str | None = None
    started_at: float = field(default_factory=time.time)
    url_known: asyncio.Event = field(default_factory=asyncio.Event)
    task: asyncio.Task[None] | None = None

    def to_json(self) -> dict[str, Any]:
        return {"state": self.state, "authorization_url": self.authorization_url,
                "message": self.message, "started_at": self.started_at}

    @property
    def oauth_state(self) -> str | None:
        """The OAuth `state` its authorization URL carries, once the URL is known."""
        if self.authorization_url is None:
            return None
        states = parse_qs(urlsplit(self.authorization_url).query).get("state") or []
        return states[0] if states else None

    @property
    def state_key(self) -> str | None:
        """The key its pending login is kept under (`pending_logins.state_key`)."""
        state = self.oauth_state
        return None if state is None else state_key(state)

    async def finished(self, within: float) -> bool:
        """Wait up to `within` seconds for the login to end; whether it did."""
        if self.task is None or self.task.done():
            return True
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.task), within)
        return self.task.done()


class Logins:
    """The daemon's logins, by server."""

    def __init__(self, store: GrantStore, callbacks: LoginCallbacks | None = None) -> None:
        self.store = store
        self.callbacks = callbacks
        """The daemon's public URL and pending logins (None: loopback redirects)."""
        self._attempts: dict[str, LoginAttempt] = {}
        self._tasks: set[asyncio.Task[None]] = set()

    def get(self, server: str) -> LoginAttempt | None:
        return self._attempts.get(server)

    async def begin(self, server: str, config: ServerConfig) -> LoginAttempt:
        """Start (or join) a login of `server`; returns once the authorization URL is known
        (`authorization_url`), the login ended (a grant that needs no browser), or `URL_WAIT`
        passed."""
        running = self._attempts.get(server)
        if running is not None and running.state == "pending":
            if not await self._spent(running):
                return running
            newer = self._attempts.get(server)
            if newer is not running and newer is not None and newer.state == "pending":
                return newer  # another `begin` started the next one meanwhile: join it
        attempt = LoginAttempt()
        self._attempts[server] = attempt

        async def show(url: str) -> None:
            attempt.authorization_url = url
            attempt.url_known.set()

        async def run() -> None:
            try:
                result = await login(server, config, self.store, show=show,
                                     callbacks=self.callbacks)
                attempt.state = "authorized" if result.ok else "failed"
                attempt.message = result.message
            except Exception as exc:  # reported to whoever asks, never raised into the loop
                attempt.state, attempt.message = "failed", f"{type(exc).__name__}: {exc}"
            finally:
                attempt.url_known.set()

        attempt.task = asyncio.create_task(run(), name=f"oauth login {server}")
        self._tasks.add(attempt.task)  # a replaced attempt still ends (and is closed) itself
        attempt.task.add_done_callback(self._tasks.discard)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(attempt.url_known.wait()), URL_WAIT)
        return attempt

    async def _spent(self, attempt: LoginAttempt) -> bool:
        """Whether the redirect of `attempt` (pending here) already ended its login on another
        replica: its outcome is stored, and this replica has not looked since."""
        state = attempt.oauth_state
        if self.callbacks is None or state is None:
            return False
        return await self.callbacks.pending.outcome(
            state, self.callbacks.finish_within) is not None

    async def aclose(self) -> None:
        running = list(self._tasks)
        for task in running:
            task.cancel()
        if running:
            await asyncio.wait(running)

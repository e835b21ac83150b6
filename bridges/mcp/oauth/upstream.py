"""OAuth for one supervised upstream: its auth, its login state, and the tasks that keep it
current.

`UpstreamAuth` is what a `Supervisor` holds for an HTTP server whose `oauth_mode` is not
`none`. It owns the server's `LoginStatus` and its `httpx2.Auth` (daemon mode), and runs:

- `wait_for_login()`: while the server is in `needs_auth`, polls the token store (once per
  `POLL_INTERVAL`) until a login stored new tokens, then makes the auth read them. No request
  goes to the server meanwhile: nothing retries a 401.
- `keep_fresh()`: refreshes the access token ahead of its expiry (a share of its lifetime,
  `refresh_lead`), off the call path, so calls find a valid token; a refresh the
  authorization server refuses puts the server in `needs_auth` with the reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Literal

import anyio

from bridges.manifest.loading import ServerConfig
from bridges.mcp.oauth.providers import CrossAppAuth, SidecarAuth, build_auth
from bridges.mcp.oauth.records import LoginStatus, RecordStorage
from sidecar.stores.grants import GrantRecord, GrantStore, GrantStoreUnavailable

log = logging.getLogger("bridges.mcp.oauth")

POLL_INTERVAL = 1.0
MIN_REFRESH_PAUSE = 1.0


def refresh_lead(lifetime: float) -> float:
    """How long before expiry a token of `lifetime` seconds is refreshed: a tenth of its life,
    at least 30 s, at most half of it."""
    return min(lifetime / 2, max(30.0, lifetime / 10))


class UpstreamAuth:
    __slots__ = ("auth", "status", "store")

    def __init__(self, server: str, config: ServerConfig, store: GrantStore,
                 on_secret: Callable[[str], None] | None = None) -> None:
        self.store = store
        self.status = LoginStatus(server)
        self.auth: SidecarAuth = build_auth(server, config, store, self.status,
                                            on_secret=on_secret)

    @classmethod
    def of(cls, server: str, config: ServerConfig, store: GrantStore | None,
           on_secret: Callable[[str], None] | None = None) -> UpstreamAuth | None:
        if store is None or config.transport == "stdio" or config.oauth_mode == "none":
            return None
        return cls(server, config, store, on_secret)

    def hint(self) -> str | None:
        """The login sentence while a login is needed, else None."""
        return self.status.hint() if self.status.needs_login else None

    async def wait_for_login(self) -> None:
        """Return once the stored grant changed (a login or another process wrote it): new
        tokens, not marked as needing a login, written after the record last seen here or
        after this process's own mark (another of its tasks may have read them first)."""
        storage = self.auth.storage
        seen = storage.generation
        while True:
            await anyio.sleep(POLL_INTERVAL)
            record = await self._read(storage)
            if record is False:
                continue
            if record is not None and record.get("tokens") and not record.get("login_required"):
                stamp = record.get("updated_at")
                marked = storage.marked
                if stamp != seen or (marked is not None and float(stamp or 0.0) > marked):
                    break
            if record is not None:
                seen = record.get("updated_at")
        storage.marked = None
        self.status.clear()
        self.auth.reload()

    async def watch_login(self, on_change: Callable[[str | None], None]) -> None:
        """While connected: report a login becoming needed (a step-up, a refused refresh)
        and its resolution (`on_change(hint or None)`)."""
        reported: str | None = None
        while True:
            hint = self.hint()
            if hint is not None and hint != reported:
                reported = hint
                on_change(hint)
            if hint is not None:
                await self.wait_for_login()
                reported = None
                on_change(None)
                continue
            await anyio.sleep(POLL_INTERVAL)

    async def _read(self, storage: RecordStorage) -> GrantRecord | Literal[False] | None:
        """The stored record, or False while the grant store cannot be used (said once in
        the log and in the login hint; polled again like a missing login)."""
        try:
            record = await storage.record()
        except GrantStoreUnavailable as exc:
            if self.status.store_error != str(exc):
                self.status.store_error = str(exc)
                log.warning("[%s] the OAuth grant cannot be read: %s", self.status.server, exc)
            return False
        self.status.store_error = None
        return record

    async def keep_fresh(self) -> None:
        """Refresh the access token ahead of its expiry, for as long as the server runs."""
        while True:
            record = await self._read(self.auth.storage)
            if record is False:
                await anyio.sleep(POLL_INTERVAL * 5)
                continue
            tokens = (record or {}).get("tokens") or {}
            expires_at = (record or {}).get("expires_at")
            if not tokens.get("refresh_token") or expires_at is None or self.status.needs_login:
                await anyio.sleep(POLL_INTERVAL * 5)
                continue
            obtained = float((record or {}).get("obtained_at") or time.time())
            due = float(expires_at) - refresh_lead(max(float(expires_at) - obtained, 1.0))
            await anyio.sleep(max(due - time.time(), MIN_REFRESH_PAUSE))
            if await self._read(self.auth.storage) != record:
                continue  # refreshed meanwhile (inline, or by another process)
            await self.refresh_now(record)

    async def refresh_now(self, seen: GrantRecord | None = None) -> bool:
        """One refresh with the stored refresh token (the SDK builds and reads the request),
        unless the stored record's tokens are no longer those of `seen` (another process
        refreshed them meanwhile: they are used instead)."""
        provider = self.auth
        if isinstance(provider, CrossAppAuth):
            return False  # a new ID-JAG is exchanged on the next 401 instead
        context = provider.context
        async with context.lock:
            if not provider._initialized:
                await provider._initialize()
            if not context.refreshable():
                return False
            if seen is not None:
                sent = ((seen.get("tokens") or {}).get("access_token"))
            else:
                sent = context.current_tokens.access_token if context.current_tokens else None
            outcome = await provider.refresh_shared(sent)
        if outcome == "refused":
            log.warning("[%s] %s", self.status.server, self.status.hint())
            await provider.storage.note_login_required(self.status.reason or "refresh failed",
                                                       None, provider.refused_refresh)
        elif outcome == "refreshed":
            log.info("[%s] access token refreshed", self.status.server)
        elif outcome == "adopted":
            log.info("[%s] access token refreshed by another process", self.status.server)
        return outcome in ("refreshed", "adopted")

"""The grant store's port: stored OAuth grants for upstream servers (not to be confused with
`sidecar.stores.tokens`, the daemon's own scoped bearer tokens).

A record is an opaque JSON object per server key; the bridge that authorizes the server
decides what it holds (tokens, the registered client, discovered metadata, the resource the
tokens are bound to). A store only keeps it: `get`, `put`, `update`, `delete`, `servers`,
and never logs a record or puts one in an exception message. `exclusive(server)` is held
while a process refreshes a server's tokens: a rotating refresh token works once, so two
processes must never refresh one grant at the same time.

Imports nothing of the sidecar. Exports `GrantStore`, `GrantRecord`, `GrantStoreUnavailable`
and `LOCK_POLL` (implementations: `sidecar.backends.local.grants` (file, keyring),
`sidecar.backends.postgres.grants`).
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

__all__ = ["LOCK_POLL", "GrantRecord", "GrantStore", "GrantStoreUnavailable"]

GrantRecord = dict[str, Any]
LOCK_POLL = 0.02
"""Seconds between two tries of a held refresh lock (refreshes are rare and short)."""


class GrantStore(Protocol):
    """Where OAuth grants for upstream servers live (embedded file; fleet: a database)."""

    async def get(self, server: str) -> GrantRecord | None:
        """The record of `server`, or None."""
        ...

    async def put(self, server: str, record: GrantRecord) -> None:
        """Replace the record of `server`."""
        ...

    async def update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        """Apply `change` to the record of `server` atomically (None deletes it); returns the
        new record."""
        ...

    async def delete(self, server: str) -> bool:
        """Forget `server`'s record; whether there was one."""
        ...

    async def servers(self) -> list[str]:
        """The servers that have a record."""
        ...

    def exclusive(self, server: str) -> AbstractAsyncContextManager[None]:
        """Held by at most one holder per server among every process sharing this store
        (and every task of this one), for as long as a refresh of `server`'s tokens takes;
        `get`/`update` work while it is held. Cancelling a wait for it is safe."""
        ...


class GrantStoreUnavailable(Exception):
    """The configured grant store cannot be used here (e.g. no OS keyring on this machine)."""

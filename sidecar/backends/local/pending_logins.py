"""`MemoryPendingLogins`: the embedded `PendingLogins` (`sidecar.stores.pending_logins`), in
this process's memory: one daemon (e.g. behind a reverse proxy), no fleet database.

Imports `sidecar.stores` and `sidecar.model`. Exports `MemoryPendingLogins`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from sidecar.model.replica import replica_id
from sidecar.stores.pending_logins import (
    KEEP_USED_SECONDS,
    LoginSeen,
    LoginStateRejected,
    PendingRecord,
    seen,
    state_key,
)

__all__ = ["MemoryPendingLogins"]


@dataclass(slots=True)
class _Entry:
    server: str
    record: PendingRecord | None
    expires_at: float
    started_at: float = field(default_factory=time.time)
    used_at: float | None = None
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
        if entry.used_at is not None:
            raise LoginStateRejected("used_state", server)
        if entry.expires_at <= time.monotonic():
            raise LoginStateRejected("expired_state", server)
        record, entry.record, entry.used_at = entry.record, None, time.monotonic()
        assert record is not None
        return record

    async def finish(self, state: str, outcome: str, message: str) -> None:
        entry = self._entries.get(state_key(state))
        if entry is not None:
            entry.outcome = (outcome, message)

    async def outcome(self, state: str, within: float) -> tuple[str, str] | None:
        key = state_key(state)
        entry = self._entries.get(key)
        if entry is None or (entry.outcome is None and entry.used_at is None):
            return None
        return self._seen(key, entry, within).ended

    async def latest(self, server: str, within: float) -> LoginSeen | None:
        mine = [(e.started_at, k) for k, e in self._entries.items() if e.server == server]
        if not mine:
            return None
        key = max(mine)[1]
        return self._seen(key, self._entries[key], within)

    def _seen(self, key: str, entry: _Entry, within: float) -> LoginSeen:
        now = time.monotonic()
        return seen(key, entry.server, replica=replica_id(), started_at=entry.started_at,
                    expired=entry.expires_at <= now,
                    taken_by=None if entry.used_at is None else replica_id(),
                    taken_for=None if entry.used_at is None else now - entry.used_at,
                    outcome=entry.outcome, within=within)

    def expire(self, state: str) -> None:
        """Make `state` expired now (tests of the expiry path)."""
        self._entries[state_key(state)].expires_at = time.monotonic()

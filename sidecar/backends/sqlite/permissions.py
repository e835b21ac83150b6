"""`SqlitePermissionStore`: `always` permission replies in `<state>/permissions.sqlite`, the
embedded `PermissionStore` (`sidecar.stores.permissions`). One connection, owned by one thread
(`sidecar.backends.sqlite.owner`), so no read or write blocks the event loop. Only the
composition root names this class.

Imports `sidecar.stores`, `sidecar.model` and `sqlite3`. Exports `SqlitePermissionStore`.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from sidecar.backends.sqlite.files import private_connection
from sidecar.backends.sqlite.owner import SqliteOwner
from sidecar.model.permissions import PermissionRule
from sidecar.stores.permissions import StoredRule

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS always_rules (
    location   TEXT NOT NULL,
    session_id TEXT NOT NULL,   -- '' for a Location-wide rule
    action     TEXT NOT NULL,
    resource   TEXT,
    decision   TEXT NOT NULL,
    created_at REAL NOT NULL
);
CREATE INDEX IF NOT EXISTS always_rules_location ON always_rules (location);
"""


class SqlitePermissionStore:
    """Implements `PermissionStore` on one SQLite file (created 0600)."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._owner: SqliteOwner[None] = SqliteOwner(
            "permissions", closed=lambda: RuntimeError("the permission store is closed"))

    @classmethod
    async def open(cls, path: Path) -> SqlitePermissionStore:
        store = cls(path)
        await store._owner.open(store._connect)
        return store

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._owner.run(fn)

    def _connect(self) -> sqlite3.Connection:
        conn = private_connection(self._path)
        conn.execute("PRAGMA journal_size_limit=1048576")  # rare writes: keep no big WAL
        conn.executescript(_SCHEMA)
        return conn

    def _db(self) -> sqlite3.Connection:
        conn = self._owner.connection
        if conn is None:
            raise RuntimeError("the permission store is closed")
        return conn

    async def rules(self, location: str) -> list[StoredRule]:
        def read() -> list[StoredRule]:
            rows = self._db().execute(
                "SELECT session_id, action, resource, decision FROM always_rules "
                "WHERE location=? ORDER BY created_at, rowid",
                (location,),
            ).fetchall()
            return [
                StoredRule(session_id, PermissionRule(action, decision, resource))
                for session_id, action, resource, decision in rows
            ]

        return await self._run(read)

    async def add(self, location: str, session_id: str, rule: PermissionRule) -> None:
        row = (location, session_id, rule.action, rule.resource, rule.decision, time.time())
        await self._run(
            lambda: self._db().execute("INSERT INTO always_rules VALUES (?,?,?,?,?,?)", row)
        )

    async def aclose(self) -> None:
        await self._owner.close()

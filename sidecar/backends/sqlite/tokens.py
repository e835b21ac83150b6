"""`SqliteTokenStore`: the embedded `TokenStore` (`sidecar.stores.tokens`), one SQLite file in
the state directory (`tokens.sqlite`, WAL), shared by `sidecar token ...` and a running daemon.

Imports `sidecar.stores` and `sidecar.model`. Exports `SqliteTokenStore`.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.backends.sqlite.files import private_connection
from sidecar.backends.sqlite.owner import SqliteOwner
from sidecar.stores.tokens import TokenError, TokenRecord

__all__ = ["SqliteTokenStore"]

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS tokens (
    id         TEXT PRIMARY KEY,
    digest     TEXT NOT NULL UNIQUE,
    profiles   TEXT NOT NULL,      -- space-separated profile names
    label      TEXT NOT NULL,
    created_at REAL NOT NULL,
    username   TEXT                -- the user the token belongs to (NULL: nobody's)
);
"""


class SqliteTokenStore:
    """`TokenStore` in one SQLite file (WAL), used from one worker thread."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._owner: SqliteOwner[None] = SqliteOwner(
            "tokens", closed=lambda: TokenError("the token store is closed"))

    @classmethod
    async def open(cls, path: Path) -> SqliteTokenStore:
        store = cls(path)
        await store._owner.open(store._connect)
        return store

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._owner.run(fn)

    def _connect(self) -> sqlite3.Connection:
        conn = private_connection(self._path, timeout=10)
        conn.executescript(_SCHEMA)
        if "username" not in {row[1] for row in conn.execute("PRAGMA table_info(tokens)")}:
            conn.execute("ALTER TABLE tokens ADD COLUMN username TEXT")  # made before users
        return conn

    def _db(self) -> sqlite3.Connection:
        conn = self._owner.connection
        if conn is None:
            raise TokenError("the token store is closed")
        return conn

    async def add(self, record: TokenRecord, digest: str) -> None:
        row = (record.id, digest, " ".join(record.profiles), record.label, record.created_at,
               record.user)
        await self._run(lambda: self._db().execute(
            "INSERT INTO tokens (id, digest, profiles, label, created_at, username) "
            "VALUES (?,?,?,?,?,?)", row))

    async def find(self, digest: str) -> TokenRecord | None:
        rows = await self._run(lambda: self._db().execute(
            "SELECT id, profiles, label, created_at, username FROM tokens WHERE digest=?",
            (digest,)
        ).fetchall())
        return _record(rows[0]) if rows else None

    async def list(self) -> list[TokenRecord]:
        rows = await self._run(lambda: self._db().execute(
            "SELECT id, profiles, label, created_at, username FROM tokens ORDER BY created_at"
        ).fetchall())
        return [_record(row) for row in rows]

    async def revoke(self, token_id: str) -> bool:
        cursor = await self._run(lambda: self._db().execute(
            "DELETE FROM tokens WHERE id=?", (token_id,)))
        return cursor.rowcount > 0

    async def aclose(self) -> None:
        await self._owner.close()


def _record(row: tuple[Any, ...]) -> TokenRecord:
    token_id, profiles, label, created_at, user = row
    return TokenRecord(token_id, tuple(profiles.split()), label, created_at, user)

"""Scoped bearer tokens on PostgreSQL: `sidecar.stores.tokens.TokenStore` shared by every
replica of a fleet and by `sidecar token ...` (which opens this store itself when
`SIDECAR_DATABASE_URL` is set). Table `sidecar_tokens`, component `tokens`.

Imports `sidecar.stores`, `asyncpg` (types only) and this package. Exports
`PostgresTokenStore` and `CACHE_SECONDS`.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, ClassVar

from sidecar.backends.postgres.pool import PostgresStore
from sidecar.stores.tokens import TokenRecord

if TYPE_CHECKING:
    import asyncpg

CACHE_SECONDS = 2.0
"""The longest a token revoked elsewhere keeps working on a replica that found it before."""
CACHE_ENTRIES = 1024


class PostgresTokenStore(PostgresStore):
    """The fleet's `TokenStore`. `await PostgresTokenStore.on_pool(pool)` on the replica's
    pool, or `.open(dsn)` with a pool of its own (the CLI).

    The embedded store's semantics: records by the SHA-256 digest of their secret (never the
    secret), listed oldest first, revoked by deleting the row. `find` (once per request)
    answers from a short cache of the tokens it found: a token made anywhere works at once on
    every replica (an unknown digest is never cached), and one revoked through another replica
    or the CLI stops working here within `CACHE_SECONDS` (at once when revoked through this
    store)."""

    COMPONENT = "tokens"
    SCHEMA_VERSION = 2
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_tokens (
    id         TEXT PRIMARY KEY,
    digest     TEXT NOT NULL UNIQUE,
    profiles   TEXT[] NOT NULL,
    label      TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
""", 2: "ALTER TABLE sidecar_tokens ADD COLUMN username TEXT"}

    def __init__(self, pool: asyncpg.Pool, *, owns_pool: bool = False,
                 location: str = "default") -> None:
        super().__init__(pool, owns_pool=owns_pool, location=location)
        self.cache_seconds = CACHE_SECONDS
        self._found: dict[str, tuple[float, TokenRecord]] = {}
        """digest -> (when it was read, its record)."""

    async def add(self, record: TokenRecord, digest: str) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO sidecar_tokens (id, digest, profiles, label, created_at, username) "
                "VALUES ($1, $2, $3, $4, $5, $6)", record.id, digest, list(record.profiles),
                record.label, record.created_at, record.user)

    async def find(self, digest: str) -> TokenRecord | None:
        now = time.monotonic()
        cached = self._found.get(digest)
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1]
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT id, profiles, label, created_at, username FROM sidecar_tokens "
                "WHERE digest = $1",
                digest)
        if row is None:
            self._found.pop(digest, None)
            return None
        record = _record(row)
        if len(self._found) >= CACHE_ENTRIES:
            self._found.clear()
        self._found[digest] = (now, record)
        return record

    async def list(self) -> list[TokenRecord]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT id, profiles, label, created_at, username "
                                    "FROM sidecar_tokens ORDER BY created_at, id")
        return [_record(row) for row in rows]

    async def revoke(self, token_id: str) -> bool:
        async with self._pool.acquire() as conn:
            gone = await conn.fetchval("DELETE FROM sidecar_tokens WHERE id = $1 RETURNING 1",
                                       token_id)
        for digest, (_, record) in list(self._found.items()):
            if record.id == token_id:
                del self._found[digest]
        return gone is not None


def _record(row: Any) -> TokenRecord:
    return TokenRecord(row["id"], tuple(row["profiles"]), row["label"], row["created_at"],
                       row["username"])

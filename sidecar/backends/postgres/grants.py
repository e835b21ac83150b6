"""OAuth grants of upstream servers on PostgreSQL: `sidecar.stores.grants.GrantStore` shared
by every replica of a fleet and by `sidecar auth login|status|logout|rekey` run with the fleet
database (a login done once serves every replica). Records are sealed with
`SIDECAR_GRANT_KEY` (`sidecar.backends.postgres.grant_keys`). Table `sidecar_grants`, component
`grants`.

Imports `sidecar.stores` and this package. Exports `PostgresGrantStore`.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any, ClassVar

from sidecar.backends.postgres.grant_keys import (
    Resealed,
    SealedPostgresStore,
    WaitingLogins,
    resealing,
    why_unopenable,
)
from sidecar.backends.postgres.pool import LOCK_GRANT_REFRESH, LOCK_GRANT_UPDATE
from sidecar.stores.grants import LOCK_POLL, GrantRecord


class PostgresGrantStore(SealedPostgresStore):
    """The fleet's `GrantStore`. `await PostgresGrantStore.on_pool(pool)` on the replica's
    pool, or `.open(dsn)` with a pool of its own (the CLI). The keys come from
    `SIDECAR_GRANT_KEY` (`GrantKeyInvalid` at open when it is malformed); `keys` may be set
    afterwards.

    The embedded stores' semantics: one opaque record per server key, `update` atomic (the
    change runs while the replica holds a transaction advisory lock on that server,
    `LOCK_GRANT_UPDATE`, so two replicas never both apply a change to the same old record),
    and `exclusive(server)` held by one replica at a time while it refreshes that server's
    tokens (`LOCK_GRANT_REFRESH`; the OAuth bridge reads the record again once it holds it).
    The database holds the server key, the key id and the sealed bytes. Without the key the
    store refuses to read or write any record (`GrantKeyMissing`, naming the variable);
    listing the servers and forgetting one (`delete`, for `sidecar auth logout` after a key
    was lost) need no key. `reseal` (for `sidecar auth rekey`) seals a record again with the
    first key under the same lock as `update`."""

    waiting_logins: Callable[[], Awaitable[WaitingLogins | None]] | None = None
    """Opens the fleet's logins waiting for their redirect, for `reseal_pending_logins` (the
    composition root sets it for `sidecar auth`; None: there are none to re-seal)."""

    COMPONENT = "grants"
    SCHEMA_VERSION = 1
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_grants (
    server     TEXT PRIMARY KEY,
    key_id     TEXT NOT NULL,
    sealed     BYTEA NOT NULL,
    updated_at TIMESTAMPTZ NOT NULL DEFAULT now()
);
"""}

    async def get(self, server: str) -> GrantRecord | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                "SELECT key_id, sealed FROM sidecar_grants WHERE server = $1", server)
        return None if row is None else self._open(server, row)

    async def put(self, server: str, record: GrantRecord) -> None:
        await self.update(server, lambda _old: record)

    async def update(
        self, server: str, change: Callable[[GrantRecord | None], GrantRecord | None]
    ) -> GrantRecord | None:
        keys = self._keys()  # refused before anything is read or written
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                               LOCK_GRANT_UPDATE, server)
            row = await conn.fetchrow(
                "SELECT key_id, sealed FROM sidecar_grants WHERE server = $1", server)
            new = change(None if row is None else self._open(server, row))
            if new is None:
                if row is not None:
                    await conn.execute("DELETE FROM sidecar_grants WHERE server = $1", server)
                return None
            kid, sealed = keys.seal(server, new)
            await conn.execute(
                "INSERT INTO sidecar_grants (server, key_id, sealed) VALUES ($1, $2, $3) "
                "ON CONFLICT (server) DO UPDATE SET key_id = EXCLUDED.key_id, "
                "sealed = EXCLUDED.sealed, updated_at = now()", server, kid, sealed)
            return new

    async def reseal_pending_logins(self, *, check: bool = False) -> Counter[str]:
        waiting = None if self.waiting_logins is None else await self.waiting_logins()
        if waiting is None:
            return Counter()
        try:
            waiting.keys = self.keys
            return await waiting.reseal_waiting(check=check)
        finally:
            await waiting.aclose()

    async def reseal(self, server: str, *, check: bool = False) -> Resealed:
        keys = self._keys()
        async with self._pool.acquire() as conn, conn.transaction():
            if not check:  # the lock `update` holds: a concurrent change is never lost
                await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                                   LOCK_GRANT_UPDATE, server)
            row = await conn.fetchrow(
                "SELECT key_id, sealed FROM sidecar_grants WHERE server = $1", server)
            if row is None:
                return Resealed(server, "gone")
            was = row["key_id"]
            outcome, new = resealing(keys, server, was, bytes(row["sealed"]), check=check)
            if outcome == "unopenable":
                return Resealed(server, outcome, was, why_unopenable(keys, was))
            if new is not None:  # updated_at is left: the record's content did not change
                await conn.execute("UPDATE sidecar_grants SET key_id = $2, sealed = $3 "
                                   "WHERE server = $1", server, *new)
            return Resealed(server, outcome, was)

    async def delete(self, server: str) -> bool:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1, hashtext($2))",
                               LOCK_GRANT_UPDATE, server)
            gone = await conn.fetchval(
                "DELETE FROM sidecar_grants WHERE server = $1 RETURNING 1", server)
        return gone is not None

    async def servers(self) -> list[str]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch("SELECT server FROM sidecar_grants ORDER BY server")
        return [r["server"] for r in rows]

    def exclusive(self, server: str) -> AbstractAsyncContextManager[None]:
        return self._exclusive(server)

    @asynccontextmanager
    async def _exclusive(self, server: str) -> AsyncIterator[None]:
        # Tried, not waited for in the server: a cancelled wait then never leaves a query
        # running on a pooled connection. The lock ends with the transaction.
        async with self._pool.acquire() as conn, conn.transaction():
            while True:
                if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1, hashtext($2))",
                                       LOCK_GRANT_REFRESH, server):
                    break
                await asyncio.sleep(LOCK_POLL * 5)
            yield

    def _open(self, server: str, row: Any) -> GrantRecord:
        return self._keys().open(server, row["key_id"], bytes(row["sealed"]))

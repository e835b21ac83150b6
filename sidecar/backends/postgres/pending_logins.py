"""OAuth logins waiting for the browser's redirect, on PostgreSQL:
`sidecar.stores.pending_logins.PendingLogins` for a fleet, so every replica can finish a login
another replica started. Table `sidecar_pending_logins`, component `pending_logins`, sealed
with `SIDECAR_GRANT_KEY` like the grants.

Imports `sidecar.stores`, `sidecar.model` and this package. Exports `PostgresPendingLogins`.
"""

from __future__ import annotations

from collections import Counter
from typing import Any, ClassVar

from sidecar.backends.postgres.grant_keys import GrantSealError, SealedPostgresStore, resealing
from sidecar.backends.postgres.pool import open_pool
from sidecar.model.replica import replica_id
from sidecar.stores.grants import GrantStoreUnavailable
from sidecar.stores.pending_logins import (
    KEEP_USED_SECONDS,
    LoginSeen,
    LoginStateRejected,
    PendingRecord,
    seen,
    state_key,
)

_TAKE = """
WITH old AS (SELECT key, key_id, sealed FROM sidecar_pending_logins
              WHERE key = $1 AND server = $2 AND used_at IS NULL AND expires_at > now()
                FOR UPDATE)
UPDATE sidecar_pending_logins p SET used_at = now(), replica_used = $3, sealed = NULL
  FROM old WHERE p.key = old.key
RETURNING old.key_id, old.sealed
"""
_WHY = """
SELECT used_at IS NOT NULL AS used, expires_at <= now() AS expired
  FROM sidecar_pending_logins WHERE key = $1 AND server = $2
"""


_SEEN = """
SELECT key, server, replica, extract(epoch FROM created_at) AS started_at,
       expires_at <= now() AS expired, replica_used,
       extract(epoch FROM now() - used_at) AS taken_for, outcome, message
  FROM sidecar_pending_logins
"""


class PostgresPendingLogins(SealedPostgresStore):
    """The fleet's `PendingLogins`. `await PostgresPendingLogins.on_pool(pool)`.

    One row per login: the SHA-256 of its OAuth `state` (never the state), the server, the
    record sealed with `SIDECAR_GRANT_KEY` (it holds the PKCE verifier and the registered
    client), the expiry and the use by the database's clock, and how the login ended
    (`outcome`, `message`: no secret). `outcome` and `latest` judge a row by the database's
    clock (`pending_logins.seen`). `take` marks the row used (and drops the sealed secrets) in
    the statement that reads it, so a state works once even when two replicas get the same
    redirect. Rows expired an hour ago are deleted by the next `add`. Without the key, `add`
    and `take` raise `GrantKeyMissing` naming it. `reseal_waiting` seals the logins still
    waiting for their redirect with the first key again (`sidecar auth rekey`)."""

    COMPONENT = "pending_logins"
    SCHEMA_VERSION = 1
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_pending_logins (
    key          TEXT PRIMARY KEY,
    server       TEXT NOT NULL,
    key_id       TEXT NOT NULL,
    sealed       BYTEA,
    replica      TEXT NOT NULL,
    created_at   TIMESTAMPTZ NOT NULL DEFAULT now(),
    expires_at   TIMESTAMPTZ NOT NULL,
    used_at      TIMESTAMPTZ,
    replica_used TEXT,
    outcome      TEXT,
    message      TEXT
);
CREATE INDEX sidecar_pending_logins_expiry ON sidecar_pending_logins (expires_at);
"""}

    async def add(self, state: str, server: str, record: PendingRecord, ttl: float) -> None:
        key = state_key(state)
        kid, sealed = self._keys().seal(_bound(key), record)
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute(
                "DELETE FROM sidecar_pending_logins "
                "WHERE expires_at < now() - make_interval(secs => $1)", KEEP_USED_SECONDS)
            await conn.execute(
                "INSERT INTO sidecar_pending_logins (key, server, key_id, sealed, replica, "
                "expires_at) VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs => $6))",
                key, server, kid, sealed, replica_id(), ttl)

    async def take(self, state: str, server: str) -> PendingRecord:
        key = state_key(state)
        keys = self._keys()  # refused before the state is spent
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(_TAKE, key, server, replica_id())
            if row is None:
                why = await conn.fetchrow(_WHY, key, server)
        if row is None:
            if why is None:
                raise LoginStateRejected("unknown_state", server)
            raise LoginStateRejected("used_state" if why["used"] else "expired_state", server)
        try:
            return keys.open(_bound(key), row["key_id"], bytes(row["sealed"]))
        except GrantSealError:
            raise GrantStoreUnavailable(
                f"the pending login of {server!r} was sealed with another SIDECAR_GRANT_KEY "
                f"(key id {row['key_id']}): give every replica the same key") from None

    @classmethod
    async def if_kept(cls, dsn: str) -> PostgresPendingLogins | None:
        """The pending logins of a database whose replicas keep them (a public URL made the
        table), on a connection of their own; else None: nothing is created here."""
        pool = await open_pool(dsn, min_size=1, max_size=1)
        try:
            async with pool.acquire() as conn:
                table = await conn.fetchval("SELECT to_regclass('sidecar_pending_logins')")
            if table is not None:
                return await cls.on_pool(pool, owns_pool=True)
        except BaseException:
            await pool.close()
            raise
        await pool.close()
        return None

    async def reseal_waiting(self, *, check: bool = False) -> Counter[str]:
        """Seal every login still waiting for its redirect (its record not taken, not
        expired) with the first key again, in one transaction that holds their rows (a
        `take` meanwhile waits, then opens the new seal). Counts by outcome, as for the
        grants: `resealed`, `current`, `unopenable` (no given key opens it: it cannot be
        finished and expires), or with `check`, which writes nothing, `stale`."""
        keys = self._keys()
        counts: Counter[str] = Counter()
        async with self._pool.acquire() as conn, conn.transaction():
            rows = await conn.fetch(
                "SELECT key, key_id, sealed FROM sidecar_pending_logins WHERE sealed IS NOT "
                "NULL AND used_at IS NULL AND expires_at > now() ORDER BY key"
                + ("" if check else " FOR UPDATE"))
            for row in rows:
                outcome, new = resealing(keys, _bound(row["key"]), row["key_id"],
                                         bytes(row["sealed"]), check=check)
                if new is not None:
                    await conn.execute("UPDATE sidecar_pending_logins SET key_id = $2, "
                                       "sealed = $3 WHERE key = $1", row["key"], *new)
                counts[outcome] += 1
        return counts

    async def finish(self, state: str, outcome: str, message: str) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(
                "UPDATE sidecar_pending_logins SET outcome = $2, message = $3 WHERE key = $1",
                state_key(state), outcome, message)

    async def outcome(self, state: str, within: float) -> tuple[str, str] | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(_SEEN + " WHERE key = $1", state_key(state))
        if row is None or (row["outcome"] is None and row["replica_used"] is None):
            return None
        return _seen(row, within).ended

    async def latest(self, server: str, within: float) -> LoginSeen | None:
        async with self._pool.acquire() as conn:
            row = await conn.fetchrow(
                _SEEN + " WHERE server = $1 ORDER BY created_at DESC LIMIT 1", server)
        return None if row is None else _seen(row, within)


def _seen(row: Any, within: float) -> LoginSeen:
    outcome = None if row["outcome"] is None else (str(row["outcome"]),
                                                   str(row["message"] or ""))
    taken_for = row["taken_for"]
    return seen(str(row["key"]), str(row["server"]), replica=str(row["replica"]),
                started_at=float(row["started_at"]), expired=bool(row["expired"]),
                taken_by=row["replica_used"],
                taken_for=None if taken_for is None else float(taken_for),
                outcome=outcome, within=within)


def _bound(key: str) -> str:
    """The associated data a record is sealed with: its row (a sealed record copied onto
    another row does not open)."""
    return f"pending login {key}"

"""PostgreSQL plumbing the fleet stores share (`asyncpg`): one connection pool per replica,
versioned schemas, and the advisory lock keys the replicas coordinate with.

Every PostgreSQL store takes the replica's pool (`open_pool`, opened once by the composition
root), names its own `component` row in `sidecar_schema`, keeps its tables as `sidecar_<name>`
and applies its migrations at open with `migrate`. A database whose schema for a component is
newer than this code knows is refused, so an old replica never writes a newer layout.
"""

from __future__ import annotations

from typing import Any

import asyncpg

__all__ = [
    "LOCK_MIGRATE",
    "LOCK_PRUNE_OUTCOMES",
    "LOCK_SNAPSHOTS",
    "DatabaseError",
    "migrate",
    "open_pool",
]

LOCK_MIGRATE = 0x51DECA2_0000
"""Held (per transaction) while a replica migrates any component: replicas starting together
migrate once."""
LOCK_PRUNE_OUTCOMES = 0x51DECA2_0001
"""Held by the one replica pruning the outcome log."""
LOCK_SNAPSHOTS = 0x51DECA2_0020
"""Held (per transaction) while a replica adds a snapshot and applies the fleet's caps."""
# Further keys: 0x51DECA2_0002 and up, one per job that must run on one replica at a time.

_VERSIONS = """
CREATE TABLE IF NOT EXISTS sidecar_schema (
    component TEXT PRIMARY KEY,
    version   INTEGER NOT NULL
)
"""


class DatabaseError(Exception):
    """The fleet database is unreachable, or its schema is one this sidecar cannot use."""


async def open_pool(dsn: str, *, min_size: int = 1, max_size: int = 10) -> asyncpg.Pool:
    """A pool on `dsn`; `DatabaseError` naming the cause when the server cannot be reached."""
    try:
        return await asyncpg.create_pool(dsn, min_size=min_size, max_size=max_size)
    except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
        raise DatabaseError(f"cannot reach the fleet database: {exc}") from exc


async def migrate(conn: Any, component: str, migrations: dict[int, str], newest: int, *,
                  error: type[Exception] = DatabaseError) -> int:
    """Apply `migrations` above the stored version of `component`, in one transaction and
    under `LOCK_MIGRATE`. Returns the version; raises `error` when the database's version is
    newer than `newest`."""
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MIGRATE)
        await conn.execute(_VERSIONS)
        current = await conn.fetchval(
            "SELECT version FROM sidecar_schema WHERE component = $1", component) or 0
        if current > newest:
            raise error(
                f"the database's {component} schema is version {current}, newer than this "
                f"sidecar knows ({newest}): upgrade the sidecar, or use another database")
        for version in range(current + 1, newest + 1):
            await conn.execute(migrations[version])
        if current < newest:
            await conn.execute(
                "INSERT INTO sidecar_schema VALUES ($1, $2) ON CONFLICT (component) "
                "DO UPDATE SET version = EXCLUDED.version", component, newest)
        return newest

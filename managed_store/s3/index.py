"""The S3 engine's index in PostgreSQL (`asyncpg`): which objects exist, their line marks,
and the keys that may hold bytes no row makes visible. Imports its `managed_store` siblings;
exports `PostgresIndex` (its tables and locks: its docstring), `Staged`, `Found`, `Evicted`,
the advisory lock ids and `SCHEMA_VERSION`.

The schema is versioned in `sidecar_schema` (component `managed_store`), migrated at open under
the same lock as every other component, and a newer schema is refused.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from managed_store.errors import ManagedStoreError, RetentionError
from managed_store.index import ORIGIN, LineMark, StoreStats
from managed_store.refs import ManagedRef
from managed_store.retention import RetentionPolicy
from managed_store.s3.quota import over_quota

LOCK_MIGRATE = 0x51DECA2_0000
"""The key every fleet component migrates under (`sidecar.backends.postgres.pool.LOCK_MIGRATE`):
kept equal
here because this library imports nothing of the daemon."""
LOCK_MANAGED_QUOTA = 0x51DECA2_0003
"""Held (per transaction) while a replica commits an object or evicts: one quota check at a
time for the fleet."""
LOCK_MANAGED_CLEANUP = 0x51DECA2_0004
"""Held by the one replica running retention and quota eviction (and the sweep)."""

COMPONENT = "managed_store"
SCHEMA_VERSION = 3
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_managed_objects (
    id          TEXT PRIMARY KEY,
    location    TEXT NOT NULL,
    namespace   TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    lines       BIGINT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL
);
CREATE INDEX sidecar_managed_objects_by_age
    ON sidecar_managed_objects (location, created_at, id);
CREATE TABLE sidecar_managed_marks (
    id          TEXT NOT NULL REFERENCES sidecar_managed_objects (id) ON DELETE CASCADE,
    byte_offset BIGINT NOT NULL,
    newlines    BIGINT NOT NULL,
    PRIMARY KEY (id, byte_offset)
);
CREATE INDEX sidecar_managed_marks_by_newlines
    ON sidecar_managed_marks (id, newlines, byte_offset);
CREATE TABLE sidecar_managed_pending (
    id        TEXT PRIMARY KEY,
    location  TEXT NOT NULL,
    since     DOUBLE PRECISION NOT NULL
);
CREATE INDEX sidecar_managed_pending_by_age ON sidecar_managed_pending (location, since);
""",
    # Per-owner shares of the quota (`managed_store.retention`); owners of older rows unknown.
    2: """
ALTER TABLE sidecar_managed_objects ADD COLUMN owner TEXT;
CREATE INDEX sidecar_managed_objects_by_owner
    ON sidecar_managed_objects (location, owner, created_at, id);
""",
    # Write-behind: objects committed from a replica's staging file before their upload ends.
    3: """
ALTER TABLE sidecar_managed_objects ADD COLUMN staged_in TEXT,
    ADD COLUMN staged_by TEXT, ADD COLUMN touched_at DOUBLE PRECISION;
CREATE INDEX sidecar_managed_objects_staged
    ON sidecar_managed_objects (location, staged_in) WHERE staged_in IS NOT NULL;
""",
}
_VERSIONS = """
CREATE TABLE IF NOT EXISTS sidecar_schema (
    component TEXT PRIMARY KEY,
    version   INTEGER NOT NULL
)
"""
_NOW = "extract(epoch from clock_timestamp())::double precision"
_REF = ("o.id, o.size_bytes, o.lines, o.created_at, o.namespace, o.staged_in, o.staged_by, "
        f"{_NOW} - o.touched_at AS idle")
_LINE_MARK = """LEFT JOIN LATERAL (
    SELECT byte_offset, newlines FROM sidecar_managed_marks m
    WHERE m.id = o.id AND m.newlines < {bound}
    ORDER BY m.newlines DESC, m.byte_offset DESC LIMIT 1) {name} ON true"""
# Positions are BIGINT: callers' limits go up to 2**62, and a sum of two must still fit.
_MAX_POSITION = 2**62


@dataclass(frozen=True, slots=True)
class Staged:
    """An object whose bytes are not in the bucket yet: they are in the staging directory
    `staging` of replica `replica`, whose uploader last renewed the row `idle` seconds ago (by
    the database's clock)."""

    staging: str
    replica: str
    idle: float


Found = tuple[ManagedRef, Staged | None]
"""An object's ref, and where its bytes are while its upload has not completed."""


@dataclass(frozen=True, slots=True)
class Evicted:
    """What one eviction pass removed from the index (their bytes are now pending)."""

    expired: list[str]
    over_quota: list[str]


def _ref(row: Any) -> ManagedRef:
    return ManagedRef(id=row["id"], size_bytes=row["size_bytes"], lines=row["lines"],
                      created_at=row["created_at"], namespace=row["namespace"])


def _found(row: Any) -> Found:
    staged = None
    if row["staged_in"] is not None:
        staged = Staged(row["staged_in"], row["staged_by"] or "?", float(row["idle"] or 0.0))
    return _ref(row), staged


def _mark(offset: int | None, newlines: int | None) -> LineMark:
    return ORIGIN if offset is None or newlines is None else LineMark(offset, newlines)


class PostgresIndex:
    """The index of one location (`bucket/prefix`) on the replica's pool.

        sidecar_managed_objects  one row per visible object (the source of truth, as the local
                                 store's SQLite rows are), scoped by `location` (bucket/prefix),
                                 with the `owner` it counts against (schema version 2) and, while
                                 its bytes are still being uploaded from a replica's staging file
                                 (write-behind, `s3.staging`), `staged_in` (that staging
                                 directory's id), `staged_by` (its replica) and `touched_at` (the
                                 uploader's last sign of life); `staged_in` is NULL once the object
                                 is in the bucket (schema version 3)
        sidecar_managed_marks    every `MARK_BYTES` of an object, the newlines before that offset
                                 (deleted with their object: ON DELETE CASCADE)
        sidecar_managed_pending  keys whose bytes may exist without a row: spools in
                                 progress (`since` = their start) and evicted objects whose
                                 bytes are not deleted yet (`since` = 0); a cleanup deletes
                                 the bytes, then the row

    Times come from the database's clock, so every replica orders and expires objects alike.
    Commits and evictions change the rows under `LOCK_MANAGED_QUOTA` (a transaction lock: the
    quota is checked against what the whole fleet holds); a cleanup runs on one replica at a time
    under `LOCK_MANAGED_CLEANUP` (a replica that does not get it skips that round).
    """

    def __init__(self, pool: asyncpg.Pool, location: str) -> None:
        self._pool = pool
        self._location = location

    async def migrate(self) -> None:
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MIGRATE)
            await conn.execute(_VERSIONS)
            current = await conn.fetchval(
                "SELECT version FROM sidecar_schema WHERE component = $1", COMPONENT) or 0
            if current > SCHEMA_VERSION:
                raise ManagedStoreError(
                    f"the database's {COMPONENT} schema is version {current}, newer than this "
                    f"sidecar knows ({SCHEMA_VERSION}): upgrade the sidecar, or use another "
                    "database")
            for version in range(current + 1, SCHEMA_VERSION + 1):
                await conn.execute(MIGRATIONS[version])
            if current < SCHEMA_VERSION:
                await conn.execute(
                    "INSERT INTO sidecar_schema VALUES ($1, $2) ON CONFLICT (component) "
                    "DO UPDATE SET version = EXCLUDED.version", COMPONENT, SCHEMA_VERSION)

    # -- writing ---------------------------------------------------------------------------

    async def begin(self, ref_id: str) -> None:
        """Record `ref_id` as pending before any of its bytes are uploaded."""
        await self._pool.execute(
            f"INSERT INTO sidecar_managed_pending (id, location, since) VALUES ($1, $2, {_NOW})",
            ref_id, self._location)

    async def commit(self, ref_id: str, namespace: str, size_bytes: int, lines: int,
                     marks: Sequence[LineMark], policy: RetentionPolicy, owner: str | None,
                     staged: tuple[str, str] | None = None) -> tuple[ManagedRef, list[str]]:
        """Make `ref_id` visible for `owner`, first evicting what its share and the quota need
        gone (`s3.quota`). `staged` = (staging id, replica) when the bytes are still being
        uploaded from that staging directory. Returns the ref and the evicted ids (pending
        now: the caller deletes their bytes)."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MANAGED_QUOTA)
            if not await conn.fetchval(
                    "DELETE FROM sidecar_managed_pending WHERE id = $1 RETURNING 1", ref_id):
                raise RetentionError(
                    "the upload outlived the spool grace period and was removed")
            victims = await over_quota(conn, self._location, size_bytes, policy, owner)
            await self._remove(conn, victims)
            row = await conn.fetchrow(
                "INSERT INTO sidecar_managed_objects AS o (id, location, namespace, size_bytes, "
                "lines, owner, staged_in, staged_by, touched_at, created_at) VALUES ($1, $2, "
                f"$3, $4, $5, $6, $7, $8, {_NOW}, (SELECT GREATEST("
                f"{_NOW}, COALESCE(MAX(created_at), 0) + 1e-6) FROM sidecar_managed_objects "
                f"WHERE location = $2)) RETURNING {_REF}",
                ref_id, self._location, namespace, size_bytes, lines, owner,
                *(staged or (None, None)))
            if marks:
                await conn.copy_records_to_table(
                    "sidecar_managed_marks", columns=("id", "byte_offset", "newlines"),
                    records=[(ref_id, m.byte_offset, m.newlines) for m in marks])
            return _ref(row), victims

    async def forget(self, ref_id: str) -> None:
        """Drop the pending row of a spool whose bytes are gone (aborted, or deleted)."""
        await self._pool.execute("DELETE FROM sidecar_managed_pending WHERE id = $1", ref_id)

    # -- write-behind ----------------------------------------------------------------------

    async def mark_uploaded(self, ref_id: str, staging: str) -> bool:
        """The upload of `ref_id` from `staging` completed: the object is in the bucket. False
        when its row is gone (evicted meanwhile: the caller deletes the bytes it uploaded)."""
        return bool(await self._pool.fetchval(
            "UPDATE sidecar_managed_objects SET staged_in = NULL, staged_by = NULL, "
            "touched_at = NULL WHERE id = $1 AND staged_in = $2 RETURNING 1", ref_id, staging))

    async def touch(self, staging: str, replica: str) -> set[str]:
        """Renew the rows of every object still uploading from `staging` (the uploader's sign
        of life, read by replicas waiting for them), now uploaded by `replica` (a replica
        restarted on the same state directory may have another name); returns their ids."""
        rows = await self._pool.fetch(
            f"UPDATE sidecar_managed_objects SET touched_at = {_NOW}, staged_by = $3 "
            "WHERE location = $1 AND staged_in = $2 RETURNING id", self._location, staging,
            replica)
        return {row["id"] for row in rows}

    async def staged_in(self, staging: str) -> dict[str, int]:
        """Objects whose bytes are still only in `staging`: id -> size."""
        rows = await self._pool.fetch(
            "SELECT id, size_bytes FROM sidecar_managed_objects WHERE location = $1 AND "
            "staged_in = $2", self._location, staging)
        return {row["id"]: int(row["size_bytes"]) for row in rows}

    async def staging_of(self, ref_id: str) -> Found | None:
        """The object's ref and where its bytes are (None: in the bucket); None if gone."""
        row = await self._pool.fetchrow(
            f"SELECT {_REF} FROM sidecar_managed_objects o WHERE o.id = $1 AND o.location = $2",
            ref_id, self._location)
        return None if row is None else _found(row)

    async def drop(self, ref_ids: Sequence[str]) -> None:
        """Remove these objects (their keys become pending): staged ones whose bytes are lost."""
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MANAGED_QUOTA)
            await self._remove(conn, list(ref_ids))

    # -- reading ---------------------------------------------------------------------------

    async def get(self, ref_id: str) -> Found | None:
        return await self.staging_of(ref_id)

    async def lines_at(self, ref_id: str, line: int, end_line: int
                       ) -> tuple[Found, LineMark, LineMark] | None:
        """The ref, the mark for line `line` and the mark for line `end_line` (see
        `Index.mark_for_line`): lines `line..end_line-1` lie within
        `first.byte_offset..last.byte_offset + MARK_BYTES`."""
        row = await self._pool.fetchrow(
            f"SELECT {_REF}, a.byte_offset AS a_off, a.newlines AS a_nl, b.byte_offset AS b_off,"
            " b.newlines AS b_nl FROM sidecar_managed_objects o "
            + _LINE_MARK.format(bound="$3", name="a") + " "
            + _LINE_MARK.format(bound="$4", name="b")
            + " WHERE o.id = $1 AND o.location = $2",
            ref_id, self._location, min(line, _MAX_POSITION) - 1,
            min(end_line, _MAX_POSITION) - 1)
        if row is None:
            return None
        return _found(row), _mark(row["a_off"], row["a_nl"]), _mark(row["b_off"], row["b_nl"])

    async def offset_at(self, ref_id: str, byte_offset: int
                        ) -> tuple[Found, LineMark] | None:
        """The ref and the last mark at or before `byte_offset`."""
        row = await self._pool.fetchrow(
            f"SELECT {_REF}, a.byte_offset AS a_off, a.newlines AS a_nl "
            "FROM sidecar_managed_objects o LEFT JOIN LATERAL ("
            " SELECT byte_offset, newlines FROM sidecar_managed_marks m"
            " WHERE m.id = o.id AND m.byte_offset <= $3"
            " ORDER BY m.byte_offset DESC LIMIT 1) a ON true"
            " WHERE o.id = $1 AND o.location = $2",
            ref_id, self._location, byte_offset)
        if row is None:
            return None
        return _found(row), _mark(row["a_off"], row["a_nl"])

    async def totals(self) -> StoreStats:
        row = await self._pool.fetchrow(
            "SELECT COUNT(*) AS n, COALESCE(SUM(size_bytes), 0) AS b, "
            "(SELECT COALESCE(SUM(pg_total_relation_size(t)), 0) FROM unnest(ARRAY["
            "'sidecar_managed_objects', 'sidecar_managed_marks', 'sidecar_managed_pending'"
            "]::regclass[]) t) AS i FROM sidecar_managed_objects WHERE location = $1",
            self._location)
        assert row is not None
        return StoreStats(count=row["n"], bytes=int(row["b"]), index_bytes=int(row["i"]))

    async def holdings(self) -> dict[str | None, int]:
        """Bytes held per owner (None: objects stored without one) in the location."""
        rows = await self._pool.fetch(
            "SELECT owner, SUM(size_bytes) AS b FROM sidecar_managed_objects "
            "WHERE location = $1 GROUP BY owner", self._location)
        return {row["owner"]: int(row["b"]) for row in rows}

    # -- retention -------------------------------------------------------------------------

    async def evict(self, conn: Any, policy: RetentionPolicy,
                    abandoned_after: float = math.inf) -> Evicted:
        """On `conn` (holding `LOCK_MANAGED_CLEANUP`): remove the rows of objects older than
        the policy's TTL, and of objects whose upload nobody renewed for `abandoned_after`
        seconds (their replica never came back), then of the largest holders' oldest until
        the location fits its quota; their keys become pending. Returns their ids."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MANAGED_QUOTA)
            expired: list[str] = []
            if not math.isinf(policy.ttl_seconds):
                rows = await conn.fetch(
                    f"SELECT id FROM sidecar_managed_objects WHERE location = $1 AND "
                    f"created_at < {_NOW} - $2 ORDER BY created_at, id",
                    self._location, policy.ttl_seconds)
                expired = [row["id"] for row in rows]
            if not math.isinf(abandoned_after):
                rows = await conn.fetch(
                    f"SELECT id FROM sidecar_managed_objects WHERE location = $1 AND "
                    f"staged_in IS NOT NULL AND touched_at < {_NOW} - $2", self._location,
                    abandoned_after)
                seen = set(expired)
                expired += [row["id"] for row in rows if row["id"] not in seen]
            await self._remove(conn, expired)
            over = await over_quota(conn, self._location, 0, policy)
            await self._remove(conn, over)
            return Evicted(expired, over)

    async def pending_before(self, conn: Any, grace_seconds: float,
                             limit: int = 1000) -> list[str]:
        """Pending keys to delete: evicted ones, and spools older than `grace_seconds`."""
        rows = await conn.fetch(
            f"SELECT id FROM sidecar_managed_pending WHERE location = $1 AND "
            f"since < {_NOW} - $2 ORDER BY since LIMIT $3",
            self._location, grace_seconds, limit)
        return [row["id"] for row in rows]

    async def forget_all(self, conn: Any, ref_ids: Sequence[str]) -> None:
        await conn.execute("DELETE FROM sidecar_managed_pending WHERE id = ANY($1::text[])",
                           list(ref_ids))

    async def _remove(self, conn: Any, ref_ids: list[str]) -> None:
        """Rows go (their marks with them) and their keys become pending, in one transaction
        (the caller's): no key is ever forgotten with its bytes still stored."""
        if not ref_ids:
            return
        await conn.execute(
            "DELETE FROM sidecar_managed_objects WHERE id = ANY($1::text[])", ref_ids)
        await conn.execute(
            "INSERT INTO sidecar_managed_pending (id, location, since) "
            "SELECT unnest($1::text[]), $2, 0 ON CONFLICT (id) DO NOTHING",
            ref_ids, self._location)

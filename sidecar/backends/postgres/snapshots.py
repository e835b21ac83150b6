"""Kept snapshots' recipes on PostgreSQL: `sidecar.stores.snapshot_records.SnapshotRecords`
shared by every replica of a fleet, so each serves every `/v1` snapshot id. Component
`snapshots`.

Imports `sidecar.stores` and this package. Exports `PostgresSnapshotRecords`.
"""

from __future__ import annotations

import json
from typing import Any

from sidecar.backends.postgres.pool import LOCK_SNAPSHOTS, PostgresStore, failures
from sidecar.stores.snapshot_records import (
    SnapshotLimits,
    SnapshotRecipe,
    SnapshotRecordsError,
    StoredSnapshot,
)

SCHEMA_VERSION = 2
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_snapshots (
    location    TEXT NOT NULL,
    id          TEXT NOT NULL,
    session_key TEXT NOT NULL,
    seq         BIGSERIAL,
    recipe      TEXT NOT NULL,
    digest      TEXT NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (location, id)
);
CREATE INDEX sidecar_snapshots_by_session ON sidecar_snapshots (location, session_key, seq);
CREATE INDEX sidecar_snapshots_by_expiry ON sidecar_snapshots (expires_at);
""",
    2: """
ALTER TABLE sidecar_snapshots ADD COLUMN owner TEXT;
CREATE INDEX sidecar_snapshots_by_owner ON sidecar_snapshots (location, owner, seq)
    WHERE owner IS NOT NULL;
""",
}
COMPONENT = "snapshots"

_DB_ERRORS = failures()


def _session_key(session_id: str | None) -> str:
    """None and "" are different sessions, as in the local store."""
    return json.dumps(session_id)


def _recipe_json(recipe: SnapshotRecipe) -> str:
    return json.dumps({
        "session_id": recipe.session_id, "profile": recipe.profile, "mode": recipe.mode,
        "final_step": recipe.final_step, "strict": recipe.strict, "names": list(recipe.names),
        "removed": list(recipe.removed), "owner": recipe.owner, "expose": recipe.expose,
        "always": list(recipe.always),
    }, ensure_ascii=False)


def _recipe(text: str) -> SnapshotRecipe:
    data: dict[str, Any] = json.loads(text)
    return SnapshotRecipe(
        session_id=data["session_id"], profile=data["profile"], mode=data["mode"],
        final_step=bool(data["final_step"]), strict=bool(data["strict"]),
        names=tuple(data["names"]), removed=tuple(data["removed"]), owner=data.get("owner"),
        expose=data.get("expose", "all"), always=tuple(data.get("always", ())),
    )


class PostgresSnapshotRecords(PostgresStore):
    """The fleet's `SnapshotRecords`. Build it with
    `await PostgresSnapshotRecords.on_pool(pool)` (the replica's pool) or `.open(dsn)`.

    One row per (Location, snapshot id): the recipe as JSON, the digest of the captured
    definitions and an expiry by the database's clock. The caps of the local `SnapshotStore`
    hold for the fleet: per session (its oldest go first), per owner (a scoped token, over all
    its sessions; its oldest go first) and in all (the session holding the most loses its
    oldest), applied when a row is added, under one advisory lock (`LOCK_SNAPSHOTS`) so that
    two replicas adding at once never overshoot. Expired rows are deleted as new ones are
    added."""

    COMPONENT = COMPONENT
    MIGRATIONS = MIGRATIONS
    SCHEMA_VERSION = SCHEMA_VERSION

    async def put(self, location: str, snapshot_id: str, recipe: SnapshotRecipe, digest: str,
                  limits: SnapshotLimits) -> None:
        session = _session_key(recipe.session_id)
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_SNAPSHOTS)
                await conn.execute("DELETE FROM sidecar_snapshots WHERE expires_at <= now()")
                await conn.execute(
                    "INSERT INTO sidecar_snapshots (location, id, session_key, recipe, digest, "
                    "expires_at, owner) VALUES ($1, $2, $3, $4, $5, now() + make_interval(secs "
                    "=> $6), $7)", location, snapshot_id, session, _recipe_json(recipe), digest,
                    float(limits.ttl_seconds), recipe.owner)
                await conn.execute(
                    "DELETE FROM sidecar_snapshots WHERE location = $1 AND id IN (SELECT id "
                    "FROM sidecar_snapshots WHERE location = $1 AND session_key = $2 ORDER BY "
                    "seq DESC OFFSET $3)", location, session, limits.max_per_session)
                if recipe.owner is not None:
                    await conn.execute(
                        "DELETE FROM sidecar_snapshots WHERE location = $1 AND id IN (SELECT "
                        "id FROM sidecar_snapshots WHERE location = $1 AND owner = $2 ORDER BY "
                        "seq DESC OFFSET $3)", location, recipe.owner, limits.max_per_owner)
                total = await conn.fetchval(
                    "SELECT count(*) FROM sidecar_snapshots WHERE location = $1", location)
                for _ in range(max(0, int(total) - limits.max_count)):
                    await conn.execute(
                        "DELETE FROM sidecar_snapshots WHERE location = $1 AND id = (SELECT id "
                        "FROM sidecar_snapshots WHERE location = $1 AND session_key = (SELECT "
                        "session_key FROM sidecar_snapshots WHERE location = $1 GROUP BY "
                        "session_key ORDER BY count(*) DESC, min(seq) LIMIT 1) ORDER BY seq "
                        "LIMIT 1)", location)
        except _DB_ERRORS as exc:
            raise SnapshotRecordsError(f"keeping snapshot {snapshot_id!r}: {exc}") from exc

    async def get(self, location: str, snapshot_id: str) -> StoredSnapshot | None:
        try:
            async with self._pool.acquire() as conn:
                row = await conn.fetchrow(
                    "SELECT recipe, digest, EXTRACT(EPOCH FROM expires_at - now()) AS left_s "
                    "FROM sidecar_snapshots WHERE location = $1 AND id = $2 AND expires_at > "
                    "now()", location, snapshot_id)
        except _DB_ERRORS as exc:
            raise SnapshotRecordsError(f"reading snapshot {snapshot_id!r}: {exc}") from exc
        if row is None:
            return None
        return StoredSnapshot(snapshot_id, _recipe(row["recipe"]), row["digest"],
                              float(row["left_s"]))

"""`always` permission replies on PostgreSQL: `sidecar.stores.permissions.PermissionStore`
shared by every replica of a fleet. Table `sidecar_permission_rules`, component
`permission_rules`.

Imports `sidecar.stores`, `sidecar.model` and this package. Exports `PostgresPermissionStore`.
"""

from __future__ import annotations

import time
from typing import ClassVar

from sidecar.backends.postgres.pool import PostgresStore
from sidecar.model.permissions import PermissionRule
from sidecar.stores.permissions import StoredRule


class PostgresPermissionStore(PostgresStore):
    """The fleet's `PermissionStore`. Build it with
    `await PostgresPermissionStore.on_pool(pool)` (or `.open(dsn)` for a pool of its own).

    The embedded store's semantics: rules per Location, oldest first, surviving a restart. A
    rule stored through one replica is returned by `rules` on every other; the permission
    service reads the store again before it raises an ask, so such a rule applies there at
    once (`sidecar.policy.permission_service`). Pending asks keep tables of their own."""

    COMPONENT = "permission_rules"
    SCHEMA_VERSION = 1
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_permission_rules (
    seq        BIGSERIAL PRIMARY KEY,
    location   TEXT NOT NULL,
    session_id TEXT NOT NULL,
    action     TEXT NOT NULL,
    resource   TEXT,
    decision   TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL
);
CREATE INDEX sidecar_permission_rules_by_location ON sidecar_permission_rules (location, seq);
"""}

    async def rules(self, location: str) -> list[StoredRule]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT session_id, action, resource, decision FROM sidecar_permission_rules "
                "WHERE location = $1 ORDER BY seq", location)
        return [StoredRule(r["session_id"], PermissionRule(r["action"], r["decision"],
                                                           r["resource"])) for r in rows]

    async def add(self, location: str, session_id: str, rule: PermissionRule) -> None:
        async with self._pool.acquire() as conn:
            await conn.execute(
                "INSERT INTO sidecar_permission_rules (location, session_id, action, resource, "
                "decision, created_at) VALUES ($1, $2, $3, $4, $5, $6)",
                location, session_id, rule.action, rule.resource, rule.decision, time.time())

"""Pinned tool definitions on PostgreSQL: `sidecar.stores.pins.PinStore` shared by every
replica of a fleet. Table `sidecar_pins`, component `pins`.

Imports `sidecar.stores` and this package. Exports `PostgresPinStore`.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar

from sidecar.backends.postgres.pool import PostgresStore
from sidecar.stores.pins import Pin


class PostgresPinStore(PostgresStore):
    """The fleet's `PinStore`. `await PostgresPinStore.on_pool(pool, location=...)`.

    The embedded store's semantics: one pin per `<server>/<tool>` key, the latest `put`
    replacing the earlier, all loaded when a Location opens. A replica that opens after
    another pinned a server's tools holds that server's changed definitions against those
    pins instead of trusting its own first listing. Rows carry the Location's name
    (Locations on one database stay apart)."""

    COMPONENT = "pins"
    SCHEMA_VERSION = 1
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_pins (
    location    TEXT NOT NULL,
    key         TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    definition  TEXT NOT NULL,
    pinned_at   DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (location, key)
);
"""}

    async def load(self) -> list[Pin]:
        async with self._pool.acquire() as conn:
            rows = await conn.fetch(
                "SELECT key, fingerprint, definition, pinned_at FROM sidecar_pins "
                "WHERE location = $1 ORDER BY key", self.location)
        return [Pin(r["key"], r["fingerprint"], json.loads(r["definition"]), r["pinned_at"])
                for r in rows]

    async def put(self, pin: Pin) -> None:
        await self.put_many([pin])

    async def put_many(self, pins: Sequence[Pin]) -> None:
        rows = [(self.location, p.key, p.fingerprint, json.dumps(p.definition), p.pinned_at)
                for p in pins]
        async with self._pool.acquire() as conn, conn.transaction():
            await conn.executemany(
                "INSERT INTO sidecar_pins (location, key, fingerprint, definition, pinned_at) "
                "VALUES ($1, $2, $3, $4, $5) ON CONFLICT (location, key) DO UPDATE SET "
                "fingerprint = EXCLUDED.fingerprint, definition = EXCLUDED.definition, "
                "pinned_at = EXCLUDED.pinned_at", rows)

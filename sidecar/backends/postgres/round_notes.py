"""Notifications of a call continued for another replica's request
(`sidecar.backends.postgres.rounds`): the holder's `Outbox`, `write_notes` and the table
`sidecar_round_notes` (`NOTES_MIGRATION`), rows keyed by the round and deleted with it.

Imports `asyncpg` and this package. Exports `Outbox`, `write_notes` and `NOTES_MIGRATION`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from sidecar.backends.postgres.pool import failures

log = logging.getLogger("sidecar.backends.postgres.rounds")

__all__ = ["NOTES_MIGRATION", "Outbox", "write_notes"]

NOTES_MIGRATION = """
ALTER TABLE sidecar_rounds ADD COLUMN relay TEXT;
CREATE TABLE sidecar_round_notes (
    location TEXT NOT NULL,
    key      TEXT NOT NULL,
    seq      INTEGER NOT NULL,
    slot     TEXT,
    body     TEXT NOT NULL,
    PRIMARY KEY (location, key, seq),
    FOREIGN KEY (location, key) REFERENCES sidecar_rounds (location, key) ON DELETE CASCADE
);
CREATE UNIQUE INDEX sidecar_round_notes_slot ON sidecar_round_notes (location, key, slot)
    WHERE slot IS NOT NULL;
"""
"""Schema v2 of the `rounds` component: what the resuming request wants relayed (`relay`),
and the notes on their way to it."""

_INSERT = """
INSERT INTO sidecar_round_notes (location, key, seq, slot, body)
SELECT $1, $2, n.seq, n.slot, n.body
FROM unnest($3::integer[], $4::text[], $5::text[]) AS n(seq, slot, body)
ON CONFLICT (location, key, slot) WHERE slot IS NOT NULL
DO UPDATE SET seq = EXCLUDED.seq, body = EXCLUDED.body"""
_FAILURES = failures()

Note = tuple[int, str | None, str]
"""(seq, slot, body as JSON)"""


async def write_notes(conn: Any, location: str, key: str, notes: list[Note]) -> None:
    """Insert `notes` (at most one per slot) on `conn`, inside the caller's transaction."""
    if notes:
        await conn.execute(_INSERT, location, key, [n[0] for n in notes],
                           [n[1] for n in notes], [n[2] for n in notes])


class Outbox:
    """The holder's side of one continued round. `wants` is what the resuming request asked
    to have relayed (None: nothing, and `put` drops every note). What the call emits on the
    way (progress, log lines: opaque JSON notes here) travels to the resuming replica:

        holder     `put(note, slot=)`: numbered in order, written in batches, one batch at a
                   time (one INSERT and a NOTIFY `noted`); a note with a `slot` replaces the
                   unread note of that slot (in memory while it waits, in the table when
                   written), so a progress report kept for a slow reader is only the latest
        holder     `finish()`: no more notes; what is still unwritten goes into the
                   transaction that writes the reply (after the batch being written, if
                   any), so the reply never overtakes a note and never waits for more than
                   that batch
        resumer    reads and deletes the notes with the reply, in one statement (`_REPLY` in
                   `sidecar.backends.postgres.rounds`), and hands them on in order before
                   the answer

    A note's batch that fails on the database is dropped with a warning (notes are
    best-effort: the call and its answer never depend on them). What is put is the caller's
    to bound."""

    def __init__(self, pool: asyncpg.Pool, location: str, key: str, wants: Any, *,
                 notice: tuple[str, str],
                 spawn: Callable[[Awaitable[None]], asyncio.Future[None]]) -> None:
        self._pool = pool
        self._location = location
        self._key = key
        self.wants = wants
        self._notice = notice  # the NOTIFY (channel, payload) that wakes the resuming replica
        self._spawn = spawn
        self._pending: list[Note] = []
        self._seq = 0
        self._writing: asyncio.Future[None] | None = None
        self._open = wants is not None

    def put(self, note: Any, *, slot: str | None = None) -> None:
        if not self._open:
            return
        self._seq += 1
        if slot is not None:
            self._pending = [n for n in self._pending if n[1] != slot]
        self._pending.append((self._seq, slot, json.dumps(note, ensure_ascii=False)))
        if self._writing is None:
            self._writing = self._spawn(self._write_all())

    async def _write_all(self) -> None:
        try:
            while self._pending and self._open:
                batch, self._pending = self._pending, []
                try:
                    async with self._pool.acquire() as conn, conn.transaction():
                        await write_notes(conn, self._location, self._key, batch)
                        await conn.execute("SELECT pg_notify($1, $2)", *self._notice)
                except asyncpg.ForeignKeyViolationError:  # the round is gone (cancelled)
                    self.close()
                except _FAILURES as exc:
                    log.warning("dropped %d notifications of a call resumed on another "
                                "replica: %s", len(batch), exc)
        finally:
            self._writing = None

    async def finish(self) -> list[Note]:
        """No more notes: waits for the batch being written, returns what is still unwritten
        (for the reply's transaction)."""
        writing = self._writing
        self._open = False
        if writing is not None:
            await asyncio.wait([writing])
        rest, self._pending = self._pending, []
        return rest

    def close(self) -> None:
        """Drop what is unwritten; later notes are dropped."""
        self._open = False
        self._pending = []

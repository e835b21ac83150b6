"""A Location's event log on PostgreSQL: `sidecar.stores.event_log.EventLog` with one
numbering for every replica of a fleet (the local one is
`sidecar.backends.local.MemoryEventLog`). Tables `sidecar_events` and `sidecar_event_counters`.

Imports `sidecar.stores`, `sidecar.model`, `asyncpg` and this package. Exports `PostgresEventLog`.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections import deque
from collections.abc import AsyncIterator
from typing import Any

import asyncpg

from sidecar.backends.postgres.pool import (
    LOCK_PRUNE_EVENTS,
    Carried,
    Listening,
    failures,
    migrate,
)
from sidecar.model.events import Event, EventBus
from sidecar.stores.errors import database_failure
from sidecar.stores.event_log import LoggedEvent, encode_event

log = logging.getLogger("sidecar.postgres_event_log")

SCHEMA_VERSION = 1
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_event_counters (
    location TEXT PRIMARY KEY,
    last_id  BIGINT NOT NULL
);
CREATE TABLE sidecar_events (
    location TEXT NOT NULL,
    id       BIGINT NOT NULL,
    name     TEXT NOT NULL,
    data     TEXT NOT NULL,
    PRIMARY KEY (location, id)
);
""",
}
COMPONENT = "event_log"
CHANNEL = "sidecar_events"
BATCH = 256
"""Events inserted per transaction at most."""
_FAILURES = failures()
RETRY_SECONDS = 1.0
"""Pause between two attempts to write a batch while the database is down."""


class PostgresEventLog:
    """The fleet's `EventLog`: the events of a Location published on any replica sharing
    the database are numbered in one sequence, and every replica's `/v1/events` readers see
    all of them in that order. `pool`: the replica's shared pool; it stays open when the log
    closes.

    Writing: a background task drains the Location's bus (publishing never waits for the
    database) and inserts what it found in one transaction per batch. The ids come from a
    counter row per Location, incremented in that transaction: the row lock makes the
    replicas' batches commit in id order, so ids are gapless and a reader that has seen id N
    never later finds a smaller one committed. The transaction ends with
    `pg_notify('sidecar_events', location)`.

    Reading: each replica keeps the newest `capacity` events of the Location in memory
    (loaded at start, then extended by a follower task that wakes on the NOTIFY, or every
    `poll_interval` seconds when notifications are lost), so `after` and `last_id` answer
    without a round trip, as the Protocol requires. A replica's own batch goes into that
    mirror at once when it directly follows what the mirror holds.

    Retention: the table keeps about the newest `capacity` events per Location; older rows
    are deleted by one replica at a time (`LOCK_PRUNE_EVENTS`), and readers resuming before
    the oldest kept event get a `stream.reset` first."""

    def __init__(self, bus: EventBus, *, pool: asyncpg.Pool, location: str,
                 capacity: int = 2048, poll_interval: float = 2.0) -> None:
        self._bus = bus
        self._pool = pool
        self._location = location
        self._capacity = capacity
        self._poll_interval = poll_interval
        self._buffer: deque[LoggedEvent] = deque(maxlen=capacity)
        self._last_id = 0
        self._changed = asyncio.Condition()
        self._wake = asyncio.Event()
        self._ready = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._listening = Listening(pool, CHANNEL, self._notified, what="events",
                                    poll_interval=poll_interval, log=log)
        self._carried = Carried()
        self.lost = 0
        """Events that could not be written (the database failed); each failure is logged."""

    @staticmethod
    async def prepare(pool: asyncpg.Pool) -> None:
        """Apply this log's migrations (`DatabaseError` when the database's schema is newer
        than this code knows): the composition root calls it when it opens the stores, so a
        replica refuses such a database at start, not when its first event log starts."""
        async with pool.acquire() as conn:
            await migrate(conn, COMPONENT, MIGRATIONS, SCHEMA_VERSION)

    # --- lifecycle -----------------------------------------------------------------------

    async def start(self) -> None:
        await self.prepare(self._pool)
        await self._listening.start()
        await self._fetch_new(initial=True)
        self._tasks = [
            asyncio.create_task(self._write(), name="event-log-write"),
            asyncio.create_task(self._follow_database(), name="event-log-follow"),
        ]
        await self._ready.wait()

    async def aclose(self) -> None:
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)  # waits without re-raising the tasks' cancellation
        await self._carried.drain()
        await self._listening.stop()

    # --- the EventLog reading side (from the mirror) -------------------------------------

    @property
    def last_id(self) -> int:
        return self._last_id

    def after(self, last_id: int) -> tuple[list[LoggedEvent], int]:
        events = [e for e in self._buffer if e.id > last_id]
        first_kept = self._buffer[0].id if self._buffer else self._last_id + 1
        missed = max(0, first_kept - last_id - 1)
        return events, missed

    async def follow(self, last_id: int | None) -> AsyncIterator[LoggedEvent]:
        cursor = self._last_id if last_id is None else last_id
        if last_id is not None:
            events, missed = self.after(cursor)
            if missed:
                data = json.dumps({"missed": missed, "oldest_available": events[0].id
                                   if events else self._last_id + 1})
                yield LoggedEvent(cursor, None, ("stream.reset", data))
            for event in events:
                yield event
                cursor = event.id
        while True:
            def advanced(seen: int = cursor) -> bool:
                return self._last_id > seen

            async with self._changed:
                await self._changed.wait_for(advanced)
            events, missed = self.after(cursor)
            if missed:  # this reader fell behind the mirror itself
                data = json.dumps({"missed": missed, "oldest_available": events[0].id})
                yield LoggedEvent(cursor, None, ("stream.reset", data))
            for event in events:
                yield event
                cursor = event.id

    async def _extend(self, rows: list[tuple[int, str, str]]) -> None:
        """Add rows (ascending ids) to the mirror; ids it holds already are skipped, and a
        gap (rows pruned before this replica read them) empties it first."""
        rows = [r for r in rows if r[0] > self._last_id]
        if not rows:
            return
        if rows[0][0] != self._last_id + 1:
            self._buffer.clear()
        for id_, name, data in rows:
            self._buffer.append(LoggedEvent(id_, None, (name, data)))
        self._last_id = rows[-1][0]
        async with self._changed:
            self._changed.notify_all()

    # --- writing -------------------------------------------------------------------------

    async def _write(self) -> None:
        async with self._bus.subscribe(maxsize=4096) as sub:
            self._ready.set()
            while True:
                batch: list[Event] = [await sub.next()]
                while len(batch) < BATCH and not sub.queue.empty():
                    batch.append(sub.queue.get_nowait())
                encoded = [encode_event(e) for e in batch]
                failed = False
                while True:  # the database down: the batch waits for it (events queue up)
                    try:
                        first: int | None = await self._carried.run(self._insert(encoded))
                        break
                    except _FAILURES as exc:
                        if database_failure(exc) is None:  # not the connection: dropped
                            self.lost += len(batch)
                            log.warning("could not write %d event(s) of %s to the database: "
                                        "%s", len(batch), self._location, exc)
                            first = None
                            break
                        if not failed:
                            log.warning("%d event(s) of %s wait for the database: %s",
                                        len(batch), self._location, exc)
                        failed = True
                        await asyncio.sleep(RETRY_SECONDS)
                if failed:
                    log.info("events of %s written again (the database is back)",
                             self._location)
                if first is None:
                    continue
                newest, every = first + len(batch) - 1, max(1, self._capacity // 4)
                if newest // every != (first - 1) // every:
                    await self._carried.run(self._prune(newest))
                if first == self._last_id + 1:  # nothing from other replicas in between
                    await self._extend([(first + i, name, data)
                                        for i, (name, data) in enumerate(encoded)])
                else:
                    self._wake.set()

    async def _insert(self, encoded: list[tuple[str, str]]) -> int:
        """Insert one batch; the id of its first event."""
        n = len(encoded)
        async with self._pool.acquire() as conn, conn.transaction():
            last: int = await conn.fetchval(
                "INSERT INTO sidecar_event_counters AS c (location, last_id) VALUES ($1, $2) "
                "ON CONFLICT (location) DO UPDATE SET last_id = c.last_id + EXCLUDED.last_id "
                "RETURNING last_id", self._location, n)
            first = last - n + 1
            await conn.execute(
                "INSERT INTO sidecar_events (location, id, name, data) SELECT $1, "
                "$2::bigint + ord - 1, name, data FROM unnest($3::text[], $4::text[]) "
                "WITH ORDINALITY AS t(name, data, ord)",
                self._location, first, [e[0] for e in encoded], [e[1] for e in encoded])
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL, self._location)
        return first

    async def _prune(self, newest: int) -> None:
        """Delete the Location's events older than the newest `capacity`, on one replica at a
        time (another holding the lock prunes instead)."""
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)",
                                       LOCK_PRUNE_EVENTS):
                    await conn.execute(
                        "DELETE FROM sidecar_events WHERE location = $1 AND id <= $2",
                        self._location, newest - self._capacity)
        except _FAILURES as exc:
            log.warning("pruning the events of %s failed: %s", self._location, exc)

    # --- following the other replicas ----------------------------------------------------

    async def _follow_database(self) -> None:
        while True:
            self._wake.clear()
            try:
                if self._listening.lost:
                    await self._carried.run(self._listening.restart())
                await self._carried.run(self._fetch_new())
            except _FAILURES as exc:
                log.warning("reading the events of %s failed (retrying): %s",
                            self._location, exc)
            try:
                async with asyncio.timeout(self._poll_interval):
                    await self._wake.wait()
            except TimeoutError:
                pass

    async def _fetch_new(self, *, initial: bool = False) -> None:
        async with self._pool.acquire() as conn:
            if initial:  # only the newest `capacity` are kept in the mirror
                newest = await conn.fetchval(
                    "SELECT last_id FROM sidecar_event_counters WHERE location = $1",
                    self._location) or 0
                self._last_id = max(0, newest - self._capacity)
                self._buffer.clear()
            while True:
                rows = await conn.fetch(
                    "SELECT id, name, data FROM sidecar_events WHERE location = $1 AND id > $2 "
                    "ORDER BY id LIMIT $3", self._location, self._last_id, BATCH)
                await self._extend([(r["id"], r["name"], r["data"]) for r in rows])
                if len(rows) < BATCH:
                    return

    def _notified(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        if payload == self._location:
            self._wake.set()

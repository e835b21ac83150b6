"""The call history (audit trail) on PostgreSQL: `sidecar.stores.call_history.CallHistory`
shared by every replica of a fleet, so `GET /v1/calls` and `sidecar calls` on any replica list
the calls settled on all of them. Table `sidecar_calls`, component `call_history`.

Imports `sidecar.stores`, `asyncpg` and this package. Exports `PostgresCallHistory`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import TYPE_CHECKING, Any, ClassVar, Self

from sidecar.backends.postgres.pool import LOCK_PRUNE_CALLS, PostgresStore
from sidecar.stores.call_history import (
    COLUMNS,
    FILTERS,
    GATHER_SECONDS,
    MAX_LIMIT,
    CallQuery,
    CallRecord,
    content_tokens,
    decode_cursor,
    encode_cursor,
    guardrail_json,
    record_of_row,
)
from sidecar.stores.errors import database_failure

if TYPE_CHECKING:
    import asyncpg

log = logging.getLogger("sidecar.backends.postgres.call_history")

_WRITTEN = COLUMNS[1:]  # every column but `seq`, which the database numbers
_TYPES = ("text", "text", "text", "text", "text", "text", "text", "text", "text", "float8",
          "float8", "int8", "text", "int8", "text", "bool", "text", "int8", "text", "text")
# A batch of rows in one statement (one array per column): `executemany` would execute the
# INSERT once per row. `seq` numbers them in the order they were added.
_INSERT = (
    f"INSERT INTO sidecar_calls (location, {', '.join(_WRITTEN)}) "
    f"SELECT $1, {', '.join(_WRITTEN)} FROM unnest("
    + ", ".join(f"${n}::{kind}[]" for n, kind in enumerate(_TYPES, start=2))
    + f") WITH ORDINALITY AS r({', '.join(_WRITTEN)}, n) ORDER BY n")


KEEP_UNWRITTEN = 10_000
"""Rows a replica keeps while its database is down (written once it is back); past it the
oldest batch is logged as lost."""
RETRY_SECONDS = 1.0
"""Pause between two attempts to write kept rows."""


class PostgresCallHistory(PostgresStore):
    """The fleet's `CallHistory`. `await PostgresCallHistory.on_pool(pool, location=...,
    retention_seconds=...)` on the replica's pool, or `.open(dsn)` with a pool of its own.

    The embedded history's semantics: `add` never blocks and never fails the call (rows are
    written in batches by one task on the event loop; a write error is logged), a `query`
    sees every row this replica added before it (pending rows are written first), newest
    first with an opaque cursor (`c<seq>`, the order of insertion for the whole fleet), and
    rows older than the retention period are pruned in batches, on one replica at a time
    (`LOCK_PRUNE_CALLS`: a replica that does not get it skips that round). Rows carry the
    Location's name."""

    COMPONENT = "call_history"
    SCHEMA_VERSION = 5
    MIGRATIONS: ClassVar[dict[int, str]] = {1: """
CREATE TABLE sidecar_calls (
    seq           BIGSERIAL PRIMARY KEY,
    location      TEXT NOT NULL,
    call_id       TEXT NOT NULL,
    tool          TEXT NOT NULL,
    server        TEXT,
    profile       TEXT,
    session_id    TEXT NOT NULL,
    agent         TEXT NOT NULL,
    message_id    TEXT NOT NULL,
    status        TEXT NOT NULL,
    error_kind    TEXT,
    started_at    DOUBLE PRECISION NOT NULL,
    duration_ms   DOUBLE PRECISION NOT NULL,
    input_bytes   BIGINT NOT NULL,
    input         TEXT,
    content_bytes BIGINT NOT NULL,
    retained      TEXT NOT NULL,
    replayed      BOOLEAN NOT NULL
);
CREATE INDEX sidecar_calls_by_location ON sidecar_calls (location, seq);
CREATE INDEX sidecar_calls_by_age ON sidecar_calls (started_at);
""", 2: "ALTER TABLE sidecar_calls ADD COLUMN error TEXT",
        3: "ALTER TABLE sidecar_calls ADD COLUMN content_tokens BIGINT",
        4: "ALTER TABLE sidecar_calls ADD COLUMN guardrail TEXT",
        5: "ALTER TABLE sidecar_calls ADD COLUMN username TEXT"}

    def __init__(self, pool: asyncpg.Pool, *, owns_pool: bool = False,
                 location: str = "default") -> None:
        super().__init__(pool, owns_pool=owns_pool, location=location)
        self.retention_seconds: float | None = None
        self.pruned = 0
        self._pruner: asyncio.Task[None] | None = None
        self._loop = asyncio.get_running_loop()
        self._lock = threading.Lock()  # `add` may come from any thread
        self._pending: list[CallRecord] = []
        self._writer: asyncio.Task[None] | None = None
        self._failing = False  # the last write found the database down: rows wait for it
        self._closing = False

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, *, owns_pool: bool = False,
                      location: str = "default", retention_seconds: float | None = None,
                      prune_interval: float | None = None) -> Self:
        """With `retention_seconds`, rows older than that are pruned every `prune_interval`
        seconds (default: a tenth of the retention, between 1 s and 10 min), in batches, by
        one replica at a time."""
        history = await super().on_pool(pool, owns_pool=owns_pool, location=location)
        if retention_seconds is not None:
            history.retention_seconds = retention_seconds
            interval = prune_interval or min(600.0, max(1.0, retention_seconds / 10))
            history._pruner = asyncio.create_task(history._prune_forever(interval),
                                                  name="call-history-prune")
        return history

    # --- writing ---------------------------------------------------------------------------

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self._pending.append(record)
            first = len(self._pending) == 1
        if first:
            try:
                self._loop.call_soon_threadsafe(self._start_writer)
            except RuntimeError:  # the loop is closed: the daemon is gone, and the row too
                log.warning("a call history row came after the history closed: not written")

    def _start_writer(self) -> None:
        if self._writer is None or self._writer.done():
            self._writer = self._loop.create_task(self._write(), name="call-history-write")

    async def _write(self) -> None:
        """Write what is pending, in batches, until nothing is. Each batch first gathers the
        rows of `GATHER_SECONDS` (as the embedded history does): a sequential caller's calls
        then cost one statement per ~50 ms, not one round trip to the database each."""
        while True:
            await asyncio.sleep(GATHER_SECONDS)
            with self._lock:
                rows, self._pending = self._pending, []
            if not rows:
                return
            # the results' tokens are counted in a thread, one hop per batch
            tokens = await asyncio.to_thread(_count_tokens, rows)
            values = [
                (r.call_id, r.tool, r.server, r.profile, r.session_id, r.agent, r.message_id,
                 r.status, r.error_kind, r.started_at, r.duration_ms, r.input_bytes,
                 r.input_json if r.input_json is not None
                 else None if r.input is None
                 else json.dumps(r.input, ensure_ascii=False, default=str),
                 r.content_bytes, json.dumps(list(r.retained)), r.replayed, r.error, n,
                 guardrail_json(r), r.username)
                for r, n in zip(rows, tokens, strict=True)
            ]
            try:
                async with self._pool.acquire() as conn:
                    await conn.execute(_INSERT, self.location,
                                       *map(list, zip(*values, strict=True)))
            except Exception as exc:  # the audit trail never fails a call
                with self._lock:  # the database down: kept (bounded) and written once back
                    keep = (database_failure(exc) is not None and not self._closing
                            and len(rows) + len(self._pending) <= KEEP_UNWRITTEN)
                    if keep:
                        self._pending[:0] = rows
                if not keep:  # say what was lost
                    log.exception("writing %d call history rows failed", len(values))
                    continue
                if not self._failing:
                    log.warning("call history rows wait for the database: %s", exc)
                self._failing = True
                await asyncio.sleep(RETRY_SECONDS)
                continue
            if self._failing:
                log.info("call history rows written again (the database is back)")
            self._failing = False

    async def _flush(self) -> None:
        """Every row added before this call is written (or its failure logged)."""
        while True:
            writer = self._writer
            if writer is not None and not writer.done():
                if self._failing:  # the database is down: what is written now is all
                    return
                # (never swallows our own cancellation; looks again when a write failed)
                await asyncio.wait([writer], timeout=GATHER_SECONDS)
                continue
            with self._lock:
                pending = bool(self._pending)
            if not pending:
                return
            self._start_writer()

    # --- reading and pruning ---------------------------------------------------------------

    async def query(self, query: CallQuery) -> tuple[list[CallRecord], str | None]:
        await self._flush()
        where = ["location = $1"]
        args: list[Any] = [self.location]

        def condition(sql: str, value: Any) -> None:
            args.append(value)
            where.append(sql.replace("?", f"${len(args)}"))

        for attr, column in FILTERS.items():
            value = getattr(query, attr)
            if value is not None:
                condition(f"{column} = ?", value)
        if query.since is not None:
            condition("started_at >= ?", query.since)
        if query.until is not None:
            condition("started_at < ?", query.until)
        if query.cursor is not None:
            condition("seq < ?", decode_cursor(query.cursor))
        limit = max(1, min(query.limit, MAX_LIMIT))
        args.append(limit + 1)
        sql = (f"SELECT {', '.join(COLUMNS)} FROM sidecar_calls WHERE {' AND '.join(where)} "
               f"ORDER BY seq DESC LIMIT ${len(args)}")
        async with self._pool.acquire() as conn:
            found = await conn.fetch(sql, *args)
        rows = [record_of_row(tuple(r)) for r in found]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (encode_cursor(rows[-1].seq) if more else None)

    async def prune(self, older_than: float, batch: int = 500) -> int:
        """Delete this Location's rows started before `older_than`, in batches; 0 when
        another replica holds the pruning lock."""
        await self._flush()  # as in a query: the rows added before it count
        total = 0
        while True:
            async with self._pool.acquire() as conn, conn.transaction():
                if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)",
                                           LOCK_PRUNE_CALLS):
                    return total
                deleted = len(await conn.fetch(
                    "DELETE FROM sidecar_calls WHERE seq IN (SELECT seq FROM sidecar_calls "
                    "WHERE location = $1 AND started_at < $2 ORDER BY seq LIMIT $3) "
                    "RETURNING 1", self.location, older_than, batch))
            total += deleted
            if deleted < batch:
                return total

    async def _prune_forever(self, interval: float) -> None:
        assert self.retention_seconds is not None
        while True:
            try:
                self.pruned += await self.prune(time.time() - self.retention_seconds)
            except Exception as exc:  # the database may be back at the next round
                log.warning("pruning the call history failed (retrying in %ss): %s",
                            interval, exc)
            await asyncio.sleep(interval)

    async def aclose(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.wait([self._pruner])  # never swallows our own cancellation
        self._closing = True
        await self._flush()
        if self._writer is not None and not self._writer.done():  # the database is down
            self._writer.cancel()
            await asyncio.wait([self._writer])
            with self._lock:
                lost, self._pending = len(self._pending), []
            log.error("closing with the database down: %d call history rows not written", lost)
        await super().aclose()


def _count_tokens(rows: list[CallRecord]) -> list[int | None]:
    return [content_tokens(r) for r in rows]

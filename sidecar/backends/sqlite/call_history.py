"""`SqliteCallHistory`: the embedded `CallHistory` (`sidecar.stores.call_history`), one SQLite
file (`<state>/history.sqlite`, created 0600) in WAL mode.

One thread owns the connection: it writes the rows `add` queued (gathered for
`GATHER_SECONDS`, then one transaction) and answers queries and pruning in order, each after
writing the rows added before it.

Imports `sidecar.stores` and `sidecar.model`. Exports `SqliteCallHistory`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.stores.call_history import (
    COLUMNS,
    FILTERS,
    GATHER_SECONDS,
    MAX_LIMIT,
    CallQuery,
    CallRecord,
    decode_cursor,
    encode_cursor,
    record_of_row,
)
from sidecar.stores.state_dir import PRIVATE_DIR_MODE, create_private_file

T = TypeVar("T")

__all__ = ["SqliteCallHistory"]

log = logging.getLogger("sidecar.stores.call_history")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS calls (
    seq           INTEGER PRIMARY KEY AUTOINCREMENT,
    call_id       TEXT NOT NULL,
    tool          TEXT NOT NULL,
    server        TEXT,
    profile       TEXT,
    session_id    TEXT NOT NULL,
    agent         TEXT NOT NULL,
    message_id    TEXT NOT NULL,
    status        TEXT NOT NULL,
    error_kind    TEXT,
    started_at    REAL NOT NULL,
    duration_ms   REAL NOT NULL,
    input_bytes   INTEGER NOT NULL,
    input         TEXT,
    content_bytes INTEGER NOT NULL,
    retained      TEXT NOT NULL,
    replayed      INTEGER NOT NULL,
    error         TEXT
);
CREATE INDEX IF NOT EXISTS calls_started ON calls (started_at);
"""
_ADD_ERROR = "ALTER TABLE calls ADD COLUMN error TEXT"
"""For a history written before failed calls kept their message."""


class SqliteCallHistory:
    """The embedded call history: `history.sqlite` in the state directory, created 0600."""

    def __init__(self, path: Path, retention_seconds: float | None = None,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        self._path = path
        self.retention_seconds = retention_seconds
        self._gather_seconds = gather_seconds
        self._pruner: asyncio.Task[None] | None = None
        self.pruned = 0
        self._jobs: queue.SimpleQueue[Callable[[], None] | None] = queue.SimpleQueue()
        self._pending: list[CallRecord] = []
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._serve, name="call-history", daemon=True)
        self._db: sqlite3.Connection | None = None

    @classmethod
    async def open(cls, path: Path, *, retention_seconds: float | None = None,
                   prune_interval: float | None = None,
                   gather_seconds: float = GATHER_SECONDS) -> SqliteCallHistory:
        """With `retention_seconds`, rows older than that are pruned every `prune_interval`
        seconds (default: a tenth of the retention, between 1 s and 10 min), in batches.
        Rows added within `gather_seconds` of the first unwritten one are written together in
        one transaction (a query, `prune` and `aclose` write them at once)."""
        history = cls(path, retention_seconds, gather_seconds)
        await asyncio.to_thread(history._connect)
        history._thread.start()
        if retention_seconds is not None:
            interval = prune_interval or min(600.0, max(1.0, retention_seconds / 10))
            history._pruner = asyncio.create_task(history._prune_forever(interval),
                                                  name="call-history-prune")
        return history

    async def _prune_forever(self, interval: float) -> None:
        assert self.retention_seconds is not None
        while True:
            try:
                self.pruned += await self.prune(time.time() - self.retention_seconds)
            except sqlite3.Error as exc:
                log.warning("pruning the call history failed (retrying in %ss): %s",
                            interval, exc)
            await asyncio.sleep(interval)

    def _connect(self) -> None:
        self._path.parent.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
        create_private_file(self._path)  # 0600 from the start; SQLite's -wal/-shm follow it
        db = sqlite3.connect(self._path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA journal_size_limit=8388608")
        db.executescript(_SCHEMA)
        if "error" not in {row[1] for row in db.execute("PRAGMA table_info(calls)")}:
            db.execute(_ADD_ERROR)
        self._db = db

    def _serve(self) -> None:
        job = self._jobs.get()
        while True:
            if job is None:
                self._flush()
                return
            if job == self._gather:
                try:  # whatever comes first (a query, the stop) writes the rows before it
                    job = self._jobs.get(timeout=self._gather_seconds)
                    continue
                except queue.Empty:
                    job = self._flush
            try:
                job()
            except Exception:  # one bad job must not end the writer
                log.exception("call history job failed")
            job = self._jobs.get()

    def _gather(self) -> None:
        """Queued with the first unwritten row: the writer waits `gather_seconds` for more."""
        self._flush()

    def add(self, record: CallRecord) -> None:
        with self._lock:
            self._pending.append(record)
            first = len(self._pending) == 1
        if first:  # one wake-up and one transaction for the rows of the next moment
            self._jobs.put(self._gather if self._gather_seconds > 0 else self._flush)

    def _flush(self) -> None:
        with self._lock:
            rows, self._pending = self._pending, []
        if not rows or self._db is None:
            return
        values = [
            (r.call_id, r.tool, r.server, r.profile, r.session_id, r.agent, r.message_id,
             r.status, r.error_kind, r.started_at, r.duration_ms, r.input_bytes,
             r.input_json if r.input_json is not None
             else None if r.input is None else json.dumps(r.input, ensure_ascii=False, default=str),
             r.content_bytes, "[]" if not r.retained else json.dumps(list(r.retained)),
             int(r.replayed), r.error)
            for r in rows
        ]
        try:
            with self._db:
                self._db.execute("BEGIN")
                self._db.executemany(
                    f"INSERT INTO calls ({', '.join(COLUMNS[1:])}) VALUES "
                    f"({', '.join('?' * (len(COLUMNS) - 1))})", values,
                )
        except sqlite3.Error:
            log.exception("writing %d call history rows failed", len(values))

    async def _run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()

        def job() -> None:
            self._flush()  # a query sees every row added before it
            try:
                result = fn()
            except BaseException as exc:
                loop.call_soon_threadsafe(_set, future, None, exc)
            else:
                loop.call_soon_threadsafe(_set, future, result, None)

        self._jobs.put(job)
        return await future

    async def query(self, query: CallQuery) -> tuple[list[CallRecord], str | None]:
        where: list[str] = []
        args: list[Any] = []
        for attr, column in FILTERS.items():
            value = getattr(query, attr)
            if value is not None:
                where.append(f"{column} = ?")
                args.append(value)
        if query.since is not None:
            where.append("started_at >= ?")
            args.append(query.since)
        if query.until is not None:
            where.append("started_at < ?")
            args.append(query.until)
        if query.cursor is not None:
            where.append("seq < ?")
            args.append(decode_cursor(query.cursor))
        limit = max(1, min(query.limit, MAX_LIMIT))
        sql = (f"SELECT {', '.join(COLUMNS)} FROM calls"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + " ORDER BY seq DESC LIMIT ?")
        args.append(limit + 1)

        def read() -> list[tuple[Any, ...]]:
            assert self._db is not None
            return self._db.execute(sql, args).fetchall()

        rows = [record_of_row(r) for r in await self._run(read)]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (encode_cursor(rows[-1].seq) if more else None)

    async def prune(self, older_than: float, batch: int = 500) -> int:
        total = 0
        while True:
            def delete() -> int:
                assert self._db is not None
                with self._db:
                    cursor = self._db.execute(
                        "DELETE FROM calls WHERE seq IN (SELECT seq FROM calls WHERE "
                        "started_at < ? ORDER BY seq LIMIT ?)", (older_than, batch),
                    )
                return cursor.rowcount

            deleted = await self._run(delete)
            total += deleted
            if deleted < batch:
                return total

    async def aclose(self) -> None:
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.wait([self._pruner])  # never swallows our own cancellation
        self._jobs.put(None)
        await asyncio.to_thread(self._thread.join)
        if self._db is not None:
            db, self._db = self._db, None
            await asyncio.to_thread(db.close)


def _set(future: asyncio.Future[T], result: T | None, exc: BaseException | None) -> None:
    if future.done():
        return
    if exc is not None:
        future.set_exception(exc)
    else:
        future.set_result(result)  # type: ignore[arg-type]

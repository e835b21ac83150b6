"""`SqliteCallHistory`: the embedded `CallHistory` (`sidecar.stores.call_history`), one SQLite
file (`<state>/history.sqlite`, created 0600) in WAL mode.

One thread owns the connection (`SqliteOwner`): it writes the rows `add` hands it (gathered
for `GATHER_SECONDS`, then one transaction) and answers queries and pruning in order, each
after writing the rows added before it.

Imports `sidecar.stores` and `sidecar.model`. Exports `SqliteCallHistory`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.backends.sqlite.files import private_connection
from sidecar.backends.sqlite.owner import SqliteOwner
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
    error         TEXT,
    content_tokens INTEGER,
    guardrail     TEXT,
    username      TEXT
);
CREATE INDEX IF NOT EXISTS calls_started ON calls (started_at);
"""
_ADDED = {"error": "ALTER TABLE calls ADD COLUMN error TEXT",
          "content_tokens": "ALTER TABLE calls ADD COLUMN content_tokens INTEGER",
          "guardrail": "ALTER TABLE calls ADD COLUMN guardrail TEXT",
          "username": "ALTER TABLE calls ADD COLUMN username TEXT"}
"""For a history written before failed calls kept their message, before rows counted the
tokens of results, before guardrails recorded their decisions, and before rows named the
signed-in user."""


class SqliteCallHistory:
    """The embedded call history: `history.sqlite` in the state directory, created 0600."""

    def __init__(self, path: Path, retention_seconds: float | None = None,
                 gather_seconds: float = GATHER_SECONDS) -> None:
        self._path = path
        self.retention_seconds = retention_seconds
        self._pruner: asyncio.Task[None] | None = None
        self.pruned = 0
        self._owner: SqliteOwner[CallRecord] = SqliteOwner(
            "call-history", write_gathered=_write_rows, gather_seconds=gather_seconds,
            closed=lambda: sqlite3.ProgrammingError("the call history is closed"))

    @classmethod
    async def open(cls, path: Path, *, retention_seconds: float | None = None,
                   prune_interval: float | None = None,
                   gather_seconds: float = GATHER_SECONDS) -> SqliteCallHistory:
        """With `retention_seconds`, rows older than that are pruned every `prune_interval`
        seconds (default: a tenth of the retention, between 1 s and 10 min), in batches.
        Rows added within `gather_seconds` of the first unwritten one are written together in
        one transaction (a query, `prune` and `aclose` write them at once)."""
        history = cls(path, retention_seconds, gather_seconds)
        await history._owner.open(history._connect)
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

    def _connect(self) -> sqlite3.Connection:
        db = private_connection(self._path)
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute("PRAGMA journal_size_limit=8388608")
        db.executescript(_SCHEMA)
        present = {row[1] for row in db.execute("PRAGMA table_info(calls)")}
        for column, statement in _ADDED.items():
            if column not in present:
                db.execute(statement)
        return db

    def _db(self) -> sqlite3.Connection:
        db = self._owner.connection
        if db is None:
            raise sqlite3.ProgrammingError("the call history is closed")
        return db

    def add(self, record: CallRecord) -> None:
        self._owner.gather(record)  # one wake-up and one transaction for the next moment's

    async def flush(self) -> None:
        """Return once the rows added before the call are written."""
        await self._run(lambda: None)

    async def _run(self, fn: Callable[[], T]) -> T:
        return await self._owner.run(fn)  # after writing every row added before it

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
            return self._db().execute(sql, args).fetchall()

        rows = [record_of_row(r) for r in await self._run(read)]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (encode_cursor(rows[-1].seq) if more else None)

    async def prune(self, older_than: float, batch: int = 500) -> int:
        total = 0
        while True:
            def delete() -> int:
                db = self._db()
                with db:
                    cursor = db.execute(
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
        await self._owner.close()  # writes the rows added until now


def _write_rows(db: sqlite3.Connection, rows: list[CallRecord]) -> None:
    """On the owner thread: the gathered rows, in one transaction (their results' tokens are
    counted here, off the event loop)."""
    values = [
        (r.call_id, r.tool, r.server, r.profile, r.session_id, r.agent, r.message_id,
         r.status, r.error_kind, r.started_at, r.duration_ms, r.input_bytes,
         r.input_json if r.input_json is not None
         else None if r.input is None else json.dumps(r.input, ensure_ascii=False, default=str),
         r.content_bytes, "[]" if not r.retained else json.dumps(list(r.retained)),
         int(r.replayed), r.error, content_tokens(r), guardrail_json(r), r.username)
        for r in rows
    ]
    try:
        with db:
            db.execute("BEGIN")
            db.executemany(
                f"INSERT INTO calls ({', '.join(COLUMNS[1:])}) VALUES "
                f"({', '.join('?' * (len(COLUMNS) - 1))})", values,
            )
    except sqlite3.Error:
        log.exception("writing %d call history rows failed", len(values))

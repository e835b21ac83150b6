"""Durable terminal outcomes (step 10 of the seam), one per `call_id` and Location.

`OutcomeLog` is the small interface the seam needs (record/get), so a fleet can keep outcomes
on a shared engine later. `SqliteOutcomeLog` is the embedded default: one SQLite file in WAL
mode, written by one worker thread that owns the connection, so no call blocks the event loop.

What is stored is exactly the outcome's model representation: for a completed call the bounded
content, metadata and managed references; for a failed call the error and the partial
snapshot. The output (machine value) is never stored, so a replayed outcome has no output.

Durability: each record is its own committed transaction before `record` returns. With WAL and
`synchronous=NORMAL` a committed transaction survives the process being killed (SIGKILL);
only an OS crash or power loss can lose the last transactions.

Speed: every call asks `get` first (safe retries), and nearly every call id is new. A Bloom
filter of the settled (location, call_id) keys, loaded at open and updated by `record`, answers
"never settled" without a trip to SQLite; a "maybe" still reads the row. This is sound because
one process owns a state directory (the managed store holds its lock), so no other writer can
settle a call behind the filter's back.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Protocol, TypeVar

from sidecar.errors import SidecarError
from sidecar.outcome import Outcome
from sidecar.tool import ToolContext

T = TypeVar("T")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS outcomes (
    location   TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    agent      TEXT NOT NULL,
    message_id TEXT NOT NULL,
    tool       TEXT NOT NULL,
    status     TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at REAL NOT NULL,
    PRIMARY KEY (location, call_id)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS outcomes_session ON outcomes (location, session_id, created_at);
"""


class SettledFilter:
    """A Bloom filter over settled call keys: no false negatives; about 2 % false positives at
    a million keys (2 MiB, 4 hashes), more beyond, which only costs extra reads."""

    __slots__ = ("_bits", "_mask")

    def __init__(self, bits: int = 1 << 24) -> None:
        self._bits = bytearray(bits // 8)
        self._mask = bits - 1

    def _positions(self, location: str, call_id: str) -> tuple[int, ...]:
        key = f"{location}\x00{call_id}".encode("utf-8", "surrogatepass")
        digest = hashlib.blake2b(key, digest_size=16).digest()
        return tuple(
            int.from_bytes(digest[i : i + 4], "little") & self._mask for i in range(0, 16, 4)
        )

    def add(self, location: str, call_id: str) -> None:
        for p in self._positions(location, call_id):
            self._bits[p >> 3] |= 1 << (p & 7)

    def may_contain(self, location: str, call_id: str) -> bool:
        bits = self._bits
        return all(bits[p >> 3] >> (p & 7) & 1 for p in self._positions(location, call_id))


class OutcomeLogError(SidecarError):
    """The durable log could not be read or written."""


class OutcomeLog(Protocol):
    async def record(self, location: str, outcome: Outcome, context: ToolContext) -> Outcome:
        """Store `outcome` unless one is already stored for its call; return the stored one."""
        ...

    async def get(self, location: str, call_id: str) -> Outcome | None: ...

    async def aclose(self) -> None: ...


class SqliteOutcomeLog:
    def __init__(self, path: Path) -> None:
        self._path = path
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="outcome-log")
        self._conn: sqlite3.Connection | None = None
        self._settled = SettledFilter()

    @classmethod
    async def open(cls, path: Path) -> SqliteOutcomeLog:
        log = cls(path)
        try:
            await log._run(log._connect)
        except BaseException:
            await log.aclose()
            raise
        return log

    async def _run(self, fn: Callable[[], T]) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._executor, fn)
        except (sqlite3.Error, OSError) as exc:
            raise OutcomeLogError(f"outcome log {self._path}: {exc}") from exc

    def _connect(self) -> None:
        self._path.parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.executescript(_SCHEMA)
        for location, call_id in conn.execute("SELECT location, call_id FROM outcomes"):
            self._settled.add(location, call_id)
        self._conn = conn

    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise sqlite3.ProgrammingError("the outcome log is closed")
        return self._conn

    async def record(self, location: str, outcome: Outcome, context: ToolContext) -> Outcome:
        body = json.dumps(outcome.to_json(include_output=False), ensure_ascii=False)
        row = (
            location, outcome.call_id, context.session_id, context.agent, context.message_id,
            outcome.tool, outcome.status, body, time.time(),
        )

        def write() -> str | None:
            db = self._db()
            inserted = db.execute(
                "INSERT OR IGNORE INTO outcomes VALUES (?,?,?,?,?,?,?,?,?)", row
            ).rowcount
            self._settled.add(location, outcome.call_id)
            if inserted:
                return None
            found = db.execute(
                "SELECT body FROM outcomes WHERE location=? AND call_id=?",
                (location, outcome.call_id),
            ).fetchone()
            return str(found[0])

        existing = await self._run(write)
        if existing is None:
            return outcome
        return Outcome.from_json(json.loads(existing), replayed=True)

    async def get(self, location: str, call_id: str) -> Outcome | None:
        if self._conn is not None and not self._settled.may_contain(location, call_id):
            return None  # never settled here: no trip to SQLite

        def read() -> Any:
            return self._db().execute(
                "SELECT body FROM outcomes WHERE location=? AND call_id=?", (location, call_id)
            ).fetchone()

        found = await self._run(read)
        if found is None:
            return None
        return Outcome.from_json(json.loads(found[0]), replayed=True)

    async def aclose(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.get_running_loop().run_in_executor(self._executor, conn.close)
        self._executor.shutdown(wait=False)

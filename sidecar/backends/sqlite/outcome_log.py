"""`SqliteOutcomeLog`: the embedded `OutcomeLog` (`sidecar.stores.outcome_log`), one SQLite
file in WAL mode (`<state>/outcomes.sqlite`).

One thread owns the connection (`SqliteOwner`); work queued while it was busy is committed
together (group commit), and a job queued while it is idle runs inline on the caller's
thread. A call's start goes to a journal file (`StartJournal`) before the call runs, and its
outcome row is appended there before `record` returns, so an outcome is durable (as a WAL
commit with `synchronous=NORMAL`: it survives SIGKILL) before its answer leaves; the row is
committed to SQLite behind it, gathered for `SETTLE_GATHER_SECONDS`, and read from memory
until then. Retention
prunes in small batches on that thread, leaving tombstones; a Bloom filter of settled keys
(`SettledFilter`) answers "never settled" without a trip to SQLite. See `README.md` of this package.

Imports `sidecar.stores`, `sidecar.model` and this package. Exports `SqliteOutcomeLog`,
`SettledFilter`, `CHECKPOINT_EVERY`, `PRUNE_BATCH` and `PRUNE_BATCH_SECONDS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from sidecar.backends.sqlite.files import private_connection
from sidecar.backends.sqlite.owner import SqliteOwner
from sidecar.backends.sqlite.start_journal import StartJournal
from sidecar.backends.sqlite.wal import (
    CHECKPOINT_EVERY,
    DEFAULT_IDLE_SECONDS,
    WalKeeper,
    WalStats,
    file_size,
    wal_path,
)
from sidecar.model.errors import CallIdConflict
from sidecar.model.json_text import compact
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.outcome_log import (
    DEFAULT_WAL_CAP_BYTES,
    OutcomeLogError,
    OutcomeLogStats,
    expired_outcome,
    interrupted_outcome,
    replayed_outcome,
)

T = TypeVar("T")

SETTLE_GATHER_SECONDS = 0.1
"""How long settled rows are gathered before the writer thread commits them to SQLite (they are
durable in the journal already). Each batch costs the writer ~300 µs of CPU beyond its rows (a
wake-up, the commit, the loop told): at 20 ms the writer took 26-38 µs of a sequential
`sidecar stdio` call, at 100 ms 11-14 (2026-12-06)."""

__all__ = ["CHECKPOINT_EVERY", "PRUNE_BATCH", "PRUNE_BATCH_SECONDS", "SettledFilter",
           "SqliteOutcomeLog"]

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
    fingerprint TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (location, call_id)
) WITHOUT ROWID;
DROP INDEX IF EXISTS outcomes_session;
CREATE INDEX IF NOT EXISTS outcomes_by_age ON outcomes (created_at);
CREATE TABLE IF NOT EXISTS started (
    location   TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    started_at REAL NOT NULL,
    PRIMARY KEY (location, call_id)
) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS expired (
    location   TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    settled_at REAL NOT NULL,
    PRIMARY KEY (location, call_id)
) WITHOUT ROWID;
"""
_COLUMNS = ("location, call_id, session_id, agent, message_id, tool, status, body, created_at, "
            "fingerprint")
_INSERT = f"INSERT OR IGNORE INTO outcomes ({_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?)"
_INSERT_UNLESS_EXPIRED = (  # a journaled row whose outcome was pruned since stays pruned
    f"INSERT OR IGNORE INTO outcomes ({_COLUMNS}) SELECT ?1,?2,?3,?4,?5,?6,?7,?8,?9,?10 "
    "WHERE NOT EXISTS (SELECT 1 FROM expired WHERE location=?1 AND call_id=?2)")
# `outcomes_session` (location, session_id, created_at) was never read and cost a quarter of
# every insert; logs that have it lose it at open. `outcomes_by_age` is what pruning reads; it
# is appended to in time order, so an insert touches only its rightmost page.


class SettledFilter:
    """A Bloom filter over settled call keys: no false negatives; about 0.2 % false positives at
    a million keys (2 MiB, 4 hashes), more beyond, which only costs extra reads."""

    __slots__ = ("_bits", "_mask")

    def __init__(self, bits: int = 1 << 24) -> None:
        self._bits = bytearray(bits // 8)
        self._mask = bits - 1

    def _positions(self, location: str, call_id: str) -> tuple[int, int, int, int]:
        # Double hashing over the halves of Python's own (keyed SipHash) string hashes, which
        # a str caches: the filter lives in memory only and is rebuilt at open, so a
        # per-process hash seed does no harm. A blake2b digest per call cost ~3 % of a bridged
        # call's CPU, hashing a (location, call id) tuple twice a call ~1 µs (2026-12-06).
        h = hash(call_id) ^ (hash(location) << 1)
        step = (h >> 32) | 1
        mask = self._mask
        return (h & mask, (h + step) & mask, (h + 2 * step) & mask, (h + 3 * step) & mask)

    def add(self, location: str, call_id: str) -> None:
        bits = self._bits
        for p in self._positions(location, call_id):
            bits[p >> 3] |= 1 << (p & 7)

    def may_contain(self, location: str, call_id: str) -> bool:
        bits = self._bits
        a, b, c, d = self._positions(location, call_id)
        return bool(bits[a >> 3] >> (a & 7) & bits[b >> 3] >> (b & 7)
                    & bits[c >> 3] >> (c & 7) & bits[d >> 3] >> (d & 7) & 1)


PRUNE_BATCH = 256
"""Outcomes pruned per transaction of the writer thread, at most."""
PRUNE_BATCH_SECONDS = 0.01
"""What one pruning batch should take: calls settling meanwhile wait for it."""

logger = logging.getLogger("sidecar.stores.outcome_log")


class SqliteOutcomeLog:
    def __init__(
        self, path: Path, *, retention_seconds: float | None = None,
        wal_cap_bytes: int = DEFAULT_WAL_CAP_BYTES, idle_seconds: float = DEFAULT_IDLE_SECONDS,
        prune_interval: float | None = None, prune_batch: int = PRUNE_BATCH,
        prune_batch_seconds: float = PRUNE_BATCH_SECONDS,
    ) -> None:
        if retention_seconds is not None and not retention_seconds > 0:
            raise ValueError(f"retention_seconds must be > 0, got {retention_seconds}")
        if prune_batch < 1:
            raise ValueError(f"prune_batch must be >= 1, got {prune_batch}")
        self._path = path
        self._settled = SettledFilter()
        self._keeper: WalKeeper | None = None
        self._wal_cap = wal_cap_bytes
        self._idle = idle_seconds
        self.retention_seconds = retention_seconds
        self._prune_interval = (
            prune_interval if prune_interval is not None
            else None if retention_seconds is None or math.isinf(retention_seconds)
            else min(600.0, max(1.0, retention_seconds / 10))
        )
        self._prune_batch = prune_batch
        self._prune_batch_seconds = prune_batch_seconds
        self._pruner: asyncio.Task[None] | None = None
        self._outcomes = 0
        self._expired = 0
        self._pruned = 0
        self._journal: StartJournal | None = None
        """The starts of running calls (event loop only), opened with the log."""
        self._unrecorded: dict[tuple[str, str], tuple[str, str, str]] = {}
        """Calls that ran but whose outcome could not be recorded: (tool, fingerprint, why)."""
        self._unwritten: dict[tuple[str, str], tuple[str, str]] = {}
        """Settled outcomes journaled and not yet committed to SQLite: (body, fingerprint)."""
        self._loop: asyncio.AbstractEventLoop | None = None
        self._owner: SqliteOwner[tuple[Any, ...]] = SqliteOwner(
            "outcome-log", group_commit=True,
            closed=lambda: OutcomeLogError(f"outcome log {path}: closed"),
            write_gathered=self._write_settled, gather_seconds=SETTLE_GATHER_SECONDS)
        self._owner.on_close = self._stop_keeper
        self._closed = False

    @classmethod
    async def open(
        cls, path: Path, *, retention_seconds: float | None = None,
        wal_cap_bytes: int = DEFAULT_WAL_CAP_BYTES, idle_seconds: float = DEFAULT_IDLE_SECONDS,
        prune_interval: float | None = None, prune_batch: int = PRUNE_BATCH,
        prune_batch_seconds: float = PRUNE_BATCH_SECONDS,
    ) -> SqliteOutcomeLog:
        """Open (creating if needed) the log at `path`.

        With `retention_seconds`, outcomes older than that are pruned every `prune_interval`
        seconds (default: a tenth of the retention, between 1 s and 10 min), `prune_batch`
        rows per transaction. The WAL is kept under `wal_cap_bytes` and emptied once the
        writer has been idle for `idle_seconds` (see `sidecar.backends.sqlite.wal`).
        """
        log = cls(path, retention_seconds=retention_seconds, wal_cap_bytes=wal_cap_bytes,
                  idle_seconds=idle_seconds, prune_interval=prune_interval,
                  prune_batch=prune_batch, prune_batch_seconds=prune_batch_seconds)
        try:
            await log._opened()
        except BaseException:
            await log.aclose()
            raise
        if log._prune_interval is not None and log.retention_seconds is not None:
            log._pruner = asyncio.create_task(log._prune_forever(), name=f"outcome-prune {path}")
        return log

    async def _run(self, fn: Callable[[], T], *, inline: bool = True) -> T:
        """`fn` on the writer's connection: inline when the writer thread is idle (a
        statement and its commit: `SqliteOwner.run_inline`), else on that thread."""
        if self._closed:
            raise OutcomeLogError(f"outcome log {self._path}: closed")
        try:
            done = self._owner.run_inline(fn) if inline else None
            if done is None:
                return await self._owner.submit(fn)
            ok, value = done
            if not ok:
                raise value
            return value  # type: ignore[no-any-return]
        except (sqlite3.Error, OSError) as exc:
            raise OutcomeLogError(f"outcome log {self._path}: {exc}") from exc

    async def _opened(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            await self._owner.open(self._connect)
            self._journal = StartJournal(self._starts_path)
            self._journal.empty()  # `_connect` turned what it held into outcomes
        except (sqlite3.Error, OSError) as exc:
            raise OutcomeLogError(f"outcome log {self._path}: {exc}") from exc

    @property
    def _starts_path(self) -> Path:
        return self._path.with_name(self._path.name + "-starts")

    def _connect(self) -> sqlite3.Connection:
        """On the owner thread: the connection, the schema migrated, the filter loaded."""
        conn = private_connection(self._path)
        try:
            conn.execute("PRAGMA synchronous=NORMAL")
            conn.executescript(_SCHEMA)
            columns = {row[1] for row in conn.execute("PRAGMA table_info(outcomes)")}
            if "fingerprint" not in columns:  # a log from before fingerprints: migrated here
                conn.execute(
                    "ALTER TABLE outcomes ADD COLUMN fingerprint TEXT NOT NULL DEFAULT ''")
            self._interrupt_started(conn)
            for location, call_id in conn.execute("SELECT location, call_id FROM outcomes"):
                self._settled.add(location, call_id)
                self._outcomes += 1
            for location, call_id in conn.execute("SELECT location, call_id FROM expired"):
                self._settled.add(location, call_id)
                self._expired += 1
            keeper = WalKeeper(self._path, cap_bytes=self._wal_cap, idle_seconds=self._idle,
                               name="outcome-log-checkpoint")
        except BaseException:
            conn.close()
            raise
        keeper.configure(conn)
        self._keeper = self._owner.upkeep = keeper
        return conn

    def _interrupt_started(self, conn: sqlite3.Connection) -> None:
        """Calls the last process started and never settled (it was killed, or could not
        record them) become `interrupted` outcomes: a retry answers that, never runs them
        again, and `GET /v1/calls/{id}` shows it. The starts are in the journal
        (`StartJournal`) and, in logs written before it, in the `started` table."""
        journaled, settled = StartJournal.read_all(self._starts_path)
        if settled:  # outcomes the last process journaled (committed since, or not yet)
            with conn:
                conn.execute("BEGIN")
                conn.executemany(_INSERT_UNLESS_EXPIRED, settled)
        rows = conn.execute(
            "SELECT location, call_id, tool, fingerprint, started_at FROM started").fetchall()
        rows += [tuple(start) for start in journaled]
        interrupted = 0
        for location, call_id, tool, fingerprint, started_at in rows:
            if conn.execute(  # settled, or settled and pruned since
                    "SELECT 1 FROM outcomes WHERE location=? AND call_id=? UNION ALL "
                    "SELECT 1 FROM expired WHERE location=? AND call_id=?",
                    (location, call_id, location, call_id)).fetchone() is not None:
                continue
            outcome = interrupted_outcome(str(call_id), str(tool), float(started_at),
                                          "the daemon stopped before it settled")
            body = json.dumps(outcome.to_json(include_output=False), ensure_ascii=False)
            interrupted += conn.execute(  # (a call in both places: once)
                _INSERT,
                (location, call_id, "", "", "", tool, "error", body, time.time(), fingerprint),
            ).rowcount
        conn.execute("DELETE FROM started")
        if interrupted:
            logger.warning("%d call(s) had started and not settled when the daemon stopped; "
                           "they are recorded as interrupted", interrupted)

    def _db(self) -> sqlite3.Connection:
        conn = self._owner.connection
        if conn is None:
            raise sqlite3.ProgrammingError("the outcome log is closed")
        return conn

    async def record(
        self, location: str, outcome: Outcome, context: ToolContext, fingerprint: str = ""
    ) -> Outcome:
        """The outcome, journaled (or, when the key may be known already or the journal
        failed, committed to SQLite first) before this returns; the outcome already stored
        under the key instead, replayed, when there is one."""
        value = outcome.to_json(include_output=False)
        encoded = compact(value)
        body = (encoded.decode() if encoded is not None
                else json.dumps(value, ensure_ascii=False))
        row = (
            location, outcome.call_id, context.session_id, context.agent, context.message_id,
            outcome.tool, outcome.status, body, time.time(), fingerprint,
        )
        key = (location, outcome.call_id)
        journal = None if self._closed else self._journal  # closed: `_record_now` says so
        if (found := self._unwritten.get(key)) is not None:
            return replayed_outcome(outcome.call_id, found, fingerprint)
        if journal is not None and not self._settled.may_contain(location, outcome.call_id):
            try:  # never settled here: the journal line is its record; SQLite's row follows
                journal.settle(row, encoded)
            except OSError as exc:
                logger.warning("journaling the outcome of call %r failed (%s); committing it "
                               "directly", outcome.call_id, exc)
            else:
                self._unwritten[key] = (body, fingerprint)
                self._settled.add(location, outcome.call_id)
                self._outcomes += 1
                self._owner.gather(row)
                return outcome
        return await self._record_now(row, outcome, fingerprint)

    async def _record_now(
        self, row: tuple[Any, ...], outcome: Outcome, fingerprint: str
    ) -> Outcome:
        """`record` as one committed statement (inline or on the writer thread)."""
        location = row[0]

        def write() -> tuple[str, str] | None:
            db = self._db()
            inserted = db.execute(_INSERT, row).rowcount  # its own commit (autocommit)
            self._settled.add(location, outcome.call_id)
            if inserted:
                self._outcomes += 1
                return None
            found = db.execute(
                "SELECT body, fingerprint FROM outcomes WHERE location=? AND call_id=?",
                (location, outcome.call_id),
            ).fetchone()
            return str(found[0]), str(found[1])

        try:
            existing = await self._run(write)
        except OutcomeLogError as exc:  # its start stays: a retry answers `interrupted`
            self._unrecorded[(location, outcome.call_id)] = (
                outcome.tool, fingerprint, f"its outcome could not be recorded ({exc})")
            raise
        if self._journal is not None:
            self._journal.settled(location, outcome.call_id)
        if existing is None:
            return outcome
        return replayed_outcome(outcome.call_id, existing, fingerprint)

    async def flush(self) -> None:
        """Return once the rows journaled before the call are committed to SQLite."""
        await self._run(lambda: None, inline=False)  # a job runs after the rows gathered

    def _write_settled(self, db: sqlite3.Connection, rows: list[tuple[Any, ...]]) -> None:
        """On the writer thread: journaled rows committed together; the loop then forgets
        them (`_written`). A row SQLite refuses stays journaled, and in memory: the next open
        inserts it."""
        try:
            with db:
                db.execute("BEGIN")
                db.executemany(_INSERT, rows)
        except sqlite3.Error:
            logger.exception("%s: committing %d settled outcome(s) failed; they stay in the "
                             "journal", self._path, len(rows))
            return
        keeper = self._keeper
        if keeper is not None:
            keeper.after_batch(db, len(rows))
        loop = self._loop
        if loop is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: nobody reads them
                loop.call_soon_threadsafe(self._written, [(r[0], r[1]) for r in rows])

    def _written(self, keys: list[tuple[str, str]]) -> None:
        journal = self._journal
        for key in keys:
            self._unwritten.pop(key, None)
            if journal is not None:
                journal.written(*key)

    async def claim(self, location: str, call_id: str, fingerprint: str = "",
                    tool: str = "") -> Outcome | None:
        """`get`, then the call's start is appended to the journal, before the call runs, so
        that a call the daemon was killed under is known at the next open
        (`_interrupt_started`). The seam's in-flight map is the claim between the callers of
        this process."""
        stored = await self.get(location, call_id, fingerprint)
        if stored is not None:
            return stored
        unrecorded = self._unrecorded.get((location, call_id))
        if unrecorded is not None:
            tool, recorded_print, reason = unrecorded
            if fingerprint and recorded_print and fingerprint != recorded_print:
                raise CallIdConflict(call_id)
            return interrupted_outcome(call_id, tool, time.time(), reason)
        if self._journal is not None:
            try:
                self._journal.start(location, call_id, tool, fingerprint, time.time())
            except OSError as exc:  # the call runs; only a kill meanwhile would go unnoticed
                logger.warning("recording the start of call %r failed: %s", call_id, exc)
        return None

    async def release(self, location: str, call_id: str) -> None:
        """Forget the call's start (cancelled before it settled: a duplicate may run it),
        unless its outcome could not be recorded (then it stays `interrupted`)."""
        if (location, call_id) not in self._unrecorded and self._journal is not None:
            try:
                self._journal.release(location, call_id)
            except OSError as exc:
                logger.warning("releasing call %r failed: %s", call_id, exc)

    async def holder(self, location: str, call_id: str) -> str | None:
        return None  # no claims (see `claim`)

    async def get(self, location: str, call_id: str, fingerprint: str = "") -> Outcome | None:
        """The stored outcome of `call_id`; for a call whose outcome was pruned, an `expired`
        error outcome (replayed) so that it is never run again; None if it never settled."""
        if self._owner.connection is not None and not self._settled.may_contain(location,
                                                                                  call_id):
            return None  # never settled here: no trip to SQLite
        if (unwritten := self._unwritten.get((location, call_id))) is not None:
            return replayed_outcome(call_id, unwritten, fingerprint)  # not in SQLite yet

        def read() -> Any:
            db = self._db()
            found = db.execute(
                "SELECT body, fingerprint FROM outcomes WHERE location=? AND call_id=?",
                (location, call_id),
            ).fetchone()
            if found is not None:
                return True, (str(found[0]), str(found[1]))
            return False, db.execute(
                "SELECT tool, settled_at FROM expired WHERE location=? AND call_id=?",
                (location, call_id),
            ).fetchone()

        stored, found = await self._run(read)
        if found is None:
            return None
        if stored:
            return replayed_outcome(call_id, found, fingerprint)
        tool, settled_at = found
        return expired_outcome(call_id, str(tool), float(settled_at), self.retention_seconds)

    # --- retention ---------------------------------------------------------------------

    async def prune(self, cutoff: float) -> int:
        """Prune every outcome settled before `cutoff` (a `time.time()`), leaving a tombstone
        per call id; returns how many. Each batch (at most `prune_batch` rows) is one job of
        the writer thread, so calls recorded meanwhile wait for one batch at most; batches
        shrink while one takes longer than `prune_batch_seconds` (large outcomes: 256 rows
        of 50 KB took 50-180 ms) and grow back when they are quick."""
        total = 0
        limit = min(self._prune_batch, 16)  # grows while batches are quick
        while True:
            pruned, took = await self._run(
                functools.partial(self._prune_batch_sync, cutoff, limit), inline=False)
            total += pruned
            if pruned < limit:
                return total
            if took > self._prune_batch_seconds:
                limit = max(1, limit // 2)
            elif took < self._prune_batch_seconds / 4:
                limit = min(self._prune_batch, limit * 2)

    def _prune_batch_sync(self, cutoff: float, limit: int) -> tuple[int, float]:
        """In the writer thread: prune at most `limit` outcomes; (how many, seconds taken)."""
        started = time.perf_counter()
        db = self._db()
        rows = db.execute(
            "SELECT location, call_id, tool, created_at FROM outcomes WHERE created_at < ? "
            "ORDER BY created_at LIMIT ?", (cutoff, limit),
        ).fetchall()
        if not rows:
            return 0, time.perf_counter() - started
        tombstones = db.executemany("INSERT OR IGNORE INTO expired VALUES (?,?,?,?)", rows)
        db.executemany("DELETE FROM outcomes WHERE location=? AND call_id=?",
                       [(location, call_id) for location, call_id, _, _ in rows])
        self._expired += tombstones.rowcount
        self._outcomes -= len(rows)
        self._pruned += len(rows)
        return len(rows), time.perf_counter() - started

    async def _prune_forever(self) -> None:
        assert self._prune_interval is not None and self.retention_seconds is not None
        while True:
            try:
                pruned = await self.prune(time.time() - self.retention_seconds)
            except OutcomeLogError as exc:
                if self._closed:
                    return
                logger.warning("pruning the outcome log failed (retrying in %ss): %s",
                               self._prune_interval, exc)
            else:
                if pruned:
                    logger.debug("outcome log: pruned %d outcomes", pruned)
            await asyncio.sleep(self._prune_interval)

    async def stats(self) -> OutcomeLogStats:
        """Counts kept in memory and file sizes (a `stat` each, in a thread)."""
        keeper = self._keeper
        wal = await asyncio.to_thread(
            keeper.stats if keeper is not None
            else lambda: WalStats(file_size(wal_path(self._path)), 0, 0))
        db_bytes = await asyncio.to_thread(file_size, self._path)
        return OutcomeLogStats(
            outcomes=self._outcomes, expired=self._expired, pruned=self._pruned,
            disk_bytes={"outcomes": db_bytes, "outcomes_wal": wal.wal_bytes},
            wal_checkpoints=wal.passive_checkpoints, wal_truncations=wal.truncations,
        )

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        pruner, self._pruner = self._pruner, None
        if pruner is not None:
            pruner.cancel()
            await asyncio.wait([pruner])
        await self._owner.close()
        if self._journal is not None:
            self._journal.close()

    def _stop_keeper(self) -> None:
        """On the owner thread, before the connection closes (which checkpoints the rest)."""
        keeper, self._keeper = self._keeper, None
        self._owner.upkeep = None
        if keeper is not None:
            keeper.stop()

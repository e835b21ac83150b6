"""The call history (audit trail): one row for every call the seam settled or replayed.

    seam settles a call ──► SettledCall ──► CallHistory.add (never waits) ──► writer thread
    GET /v1/calls, `sidecar calls`, the console ──► CallHistory.query (filters, cursor)

A row says who called what and how it ended: call id, tool, server, profile, session, agent,
status, error kind, start time and duration, the input's size and a copy of it as the audit
setting allows (`full`, `redacted` (default: secret-looking and configured keys masked, JSON
text redacted too, long strings cut; see `sidecar.model.audit_redaction`) or `none`), the content's
size, the refs retained for it, and whether the outcome was a replay of an earlier one.

The history is not the outcome log: the outcome log makes a call durable before it is answered
(one row per call id, exactly once); the history is written after the answer, off the call's
path, and keeps every settlement (a replay is a row of its own). Rows older than the retention
period are pruned in batches (`prune`).

`CallHistory` is the interface; `SqliteCallHistory` (one SQLite file, one writer thread that
owns the connection and also answers queries, in order) is the embedded implementation.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import queue
import sqlite3
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, NamedTuple, Protocol, TypeVar

from sidecar.model.audit_redaction import Redaction
from sidecar.model.content import TextContent
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.state_dir import PRIVATE_DIR_MODE, create_private_file

T = TypeVar("T")
AuditInputs = Literal["full", "redacted", "none"]

log = logging.getLogger("sidecar.stores.call_history")

MAX_STORED_INPUT = 64 * 1024
"""Bytes of input JSON kept per row, in any mode; a larger copy is replaced by a note."""
MAX_LIMIT = 1000
GATHER_SECONDS = 0.05
"""How long the history's writer gathers rows before writing them in one transaction: a
sequential caller's calls then cost one wake-up of the writer and one commit per ~50 ms
instead of one each (83-117 µs of daemon CPU a call for `sidecar stdio`, 2026-12-04)."""


class SettledCall(NamedTuple):
    """What the seam knows when a call has settled (or was replayed). A named tuple: the seam
    makes one per call, and a frozen dataclass took ~1 µs to build (2026-12-04)."""

    name: str
    raw_input: Any
    context: ToolContext
    outcome: Outcome
    started_at: float
    """Wall-clock seconds since the epoch."""
    duration: float
    replayed: bool
    profile: str | None = None


@dataclass(frozen=True, slots=True)
class CallRecord:
    call_id: str
    tool: str
    server: str | None
    profile: str | None
    session_id: str
    agent: str
    message_id: str
    status: str
    error_kind: str | None
    started_at: float
    duration_ms: float
    input_bytes: int
    input: Any
    """The input as the audit setting keeps it (None with `none`)."""
    content_bytes: int
    retained: tuple[str, ...]
    replayed: bool
    error: str | None = None
    """A failed call's error message as its caller saw it (cut to `MAX_STORED_ERROR`
    characters); None for a success."""
    seq: int = 0
    """Order of insertion; the cursor of a query."""
    input_json: str | None = field(default=None, compare=False, repr=False)
    """`input` already encoded as JSON when the record was made (the writer stores it as is;
    None: the writer encodes `input`)."""

    def to_json(self) -> dict[str, Any]:
        data = asdict(self)
        data["retained"] = list(self.retained)
        data["started_at"] = _iso(self.started_at)
        del data["seq"], data["input_json"]
        return data


@dataclass(frozen=True, slots=True)
class CallQuery:
    tool: str | None = None
    server: str | None = None
    status: str | None = None
    session: str | None = None
    agent: str | None = None
    profile: str | None = None
    since: float | None = None
    until: float | None = None
    limit: int = 100
    cursor: str | None = None
    """Opaque; from the previous page. Pages go from the newest call to the oldest."""

    @classmethod
    def from_params(cls, params: Mapping[str, str], *, limit: int = 100) -> CallQuery:
        """From query parameters (`/v1/calls`, the console): `tool`, `server`, `status`,
        `session`, `agent`, `profile`, `since`/`until` (ISO 8601, UTC unless an offset is
        given, or epoch seconds), `limit` (1-1000), `cursor`. Raises InvalidQuery."""
        def text(name: str) -> str | None:
            value = params.get(name) or None
            if value is not None and len(value) > MAX_FILTER_CHARS:
                raise InvalidQuery(name, f"longer than {MAX_FILTER_CHARS} characters")
            return value

        raw_limit = params.get("limit")
        if raw_limit:
            if not (raw_limit.isascii() and raw_limit.isdigit()) or not 1 <= int(raw_limit) \
                    <= MAX_LIMIT:
                raise InvalidQuery("limit", f"a whole number from 1 to {MAX_LIMIT}")
            limit = int(raw_limit)
        cursor = params.get("cursor")
        if cursor is not None:  # present but empty is an error too: the page is unknown
            _decode_cursor(cursor)
        return cls(
            tool=text("tool"), server=text("server"), status=text("status"),
            session=text("session"), agent=text("agent"), profile=text("profile"),
            since=parse_time(params.get("since"), "since"),
            until=parse_time(params.get("until"), "until"), limit=limit, cursor=cursor,
        )


def parse_time(value: str | None, name: str) -> float | None:
    """Epoch seconds from an ISO 8601 date or time (UTC unless it has an offset) or a number."""
    if not value:
        return None
    if len(value) > 64:
        raise InvalidQuery(name, "longer than 64 characters")
    try:
        number = float(value)
    except ValueError:
        pass
    else:
        if not (math.isfinite(number) and 0 <= number <= MAX_EPOCH):
            raise InvalidQuery(name, f"{value!r} is not epoch seconds from 0 to {MAX_EPOCH:g}")
        return number
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise InvalidQuery(name, f"{value[:40]!r} is not a date, a time or epoch seconds") \
            from None
    if parsed.tzinfo is None:
        parsed = parsed.replace(tzinfo=UTC)
    return parsed.timestamp()


class InvalidQuery(ValueError):
    """A filter or cursor that cannot be read; the message and `field` name it."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


MAX_FILTER_CHARS = 512
MAX_EPOCH = 1e11




class CallHistory(Protocol):
    def add(self, record: CallRecord) -> None:
        """Queue a row; never blocks and never fails the call (a write error is logged)."""
        ...

    async def query(self, query: CallQuery) -> tuple[list[CallRecord], str | None]:
        """Rows matching `query`, newest first, and the cursor of the next page (or None)."""
        ...

    async def prune(self, older_than: float, batch: int = 500) -> int:
        """Delete rows started before `older_than` (epoch seconds), in batches; how many."""
        ...

    async def aclose(self) -> None: ...


def _iso(ts: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ts)) + f".{int(ts % 1 * 1000):03d}Z"


_COMPACT = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"))
_COMPACT_ANY = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), default=str)
"""Built once: `json.dumps` with any argument builds an encoder per call (~1 µs each)."""
@dataclass(slots=True)
class AuditSettings:
    """Manifest `[audit]`: `inputs = "full" | "redacted" | "none"`, `mask = ["field", ...]`."""

    inputs: AuditInputs = "redacted"
    mask: frozenset[str] = field(default_factory=frozenset)
    _redaction: Redaction = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        self._redaction = Redaction(self.mask)

    def keep(self, raw_input: Any) -> tuple[int, Any]:
        """The input's size in bytes of JSON, and the copy the setting keeps of it."""
        size, kept, _ = self.keep_encoded(raw_input)
        return size, kept

    def keep_encoded(self, raw_input: Any) -> tuple[int, Any, str | None]:
        """As `keep`, plus the kept copy as JSON (None when nothing is kept): the input is
        encoded once, and that text is reused when the copy is the input itself."""
        try:
            encoded: str | None = _COMPACT.encode(raw_input)
        except (TypeError, ValueError):
            encoded = None
        text = repr(raw_input) if encoded is None else encoded
        size = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
        if self.inputs == "none":
            return size, None, None
        kept = raw_input if self.inputs == "full" else self._redaction.copy(raw_input)
        if kept is raw_input and encoded is not None:
            kept_json = encoded
        else:
            try:
                kept_json = _COMPACT_ANY.encode(kept)
            except (TypeError, ValueError):  # e.g. a circular structure: keep its size only
                kept_json = None
        if kept_json is None or len(kept_json) > MAX_STORED_INPUT:
            omitted = {"_omitted": f"input of {size} bytes is larger than the audit copy"}
            return size, omitted, _COMPACT.encode(omitted)
        return size, kept, kept_json


def record_of(
    call: SettledCall, settings: AuditSettings, server_of: Callable[[str], str | None]
) -> CallRecord:
    outcome = call.outcome
    size, kept, kept_json = settings.keep_encoded(call.raw_input)
    shown = sum(len(i.text.encode()) for i in outcome.content if isinstance(i, TextContent))
    return CallRecord(
        call_id=call.context.call_id, tool=outcome.tool or call.name,
        server=server_of(outcome.tool or call.name), profile=call.profile,
        session_id=call.context.session_id, agent=call.context.agent,
        message_id=call.context.message_id, status=outcome.status,
        error_kind=outcome.error.kind.value if outcome.error is not None else None,
        started_at=call.started_at, duration_ms=round(call.duration * 1000, 3),
        input_bytes=size, input=kept, content_bytes=shown,
        retained=tuple(m.ref for m in outcome.managed), replayed=call.replayed,
        error=_error_text(outcome), input_json=kept_json,
    )


MAX_STORED_ERROR = 4000
"""Characters of a failed call's error message the history keeps."""


def _error_text(outcome: Outcome) -> str | None:
    if outcome.error is None:
        return None
    message = outcome.error.message
    return message if len(message) <= MAX_STORED_ERROR else message[:MAX_STORED_ERROR] + "…"


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
_COLUMNS = ("seq", "call_id", "tool", "server", "profile", "session_id", "agent", "message_id",
            "status", "error_kind", "started_at", "duration_ms", "input_bytes", "input",
            "content_bytes", "retained", "replayed", "error")
_FILTERS = {"tool": "tool", "server": "server", "status": "status", "session": "session_id",
            "agent": "agent", "profile": "profile"}


def _encode_cursor(seq: int) -> str:
    return f"c{seq}"


def _decode_cursor(cursor: str) -> int:
    if not (cursor.startswith("c") and cursor[1:].isascii() and cursor[1:].isdigit()
            and len(cursor) <= 19):
        raise InvalidQuery("cursor", f"{cursor[:40]!r} is not a cursor this daemon gives out "
                           "(c followed by digits)")
    return int(cursor[1:])


def _row(row: tuple[Any, ...]) -> CallRecord:
    data = dict(zip(_COLUMNS, row, strict=True))
    data["input"] = json.loads(data["input"]) if data["input"] is not None else None
    data["retained"] = tuple(json.loads(data["retained"]))
    data["replayed"] = bool(data["replayed"])
    return CallRecord(**data)


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
                    f"INSERT INTO calls ({', '.join(_COLUMNS[1:])}) VALUES "
                    f"({', '.join('?' * (len(_COLUMNS) - 1))})", values,
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
        for attr, column in _FILTERS.items():
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
            args.append(_decode_cursor(query.cursor))
        limit = max(1, min(query.limit, MAX_LIMIT))
        sql = (f"SELECT {', '.join(_COLUMNS)} FROM calls"
               + (f" WHERE {' AND '.join(where)}" if where else "")
               + " ORDER BY seq DESC LIMIT ?")
        args.append(limit + 1)

        def read() -> list[tuple[Any, ...]]:
            assert self._db is not None
            return self._db.execute(sql, args).fetchall()

        rows = [_row(r) for r in await self._run(read)]
        more = len(rows) > limit
        rows = rows[:limit]
        return rows, (_encode_cursor(rows[-1].seq) if more else None)

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

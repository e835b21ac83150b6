"""The SQLite index: which objects exist, and where their lines start.

`Index` is synchronous and not thread-safe: the store creates it inside, and only ever calls it
from, one dedicated worker thread. Rows are the source of truth for visibility: a file in
`objects/` without a row is invisible (and removed at the next open).

Besides one row per object, the index keeps *line marks*: every `MARK_BYTES` bytes of an
object, the number of `\\n` bytes before that offset. Any line or byte position is then at most
`MARK_BYTES` of scanning away from a mark, so ranged reads cost O(MARK_BYTES), not O(object).
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from managed_store.errors import ManagedStoreError
from managed_store.layout import create_private_file
from managed_store.refs import ManagedRef

MARK_BYTES = 64 * 1024
WAL_LIMIT_BYTES = 4 * 1024 * 1024
"""`journal_size_limit`: the WAL file is cut back to this whenever SQLite starts it over."""
_SCHEMA_VERSION = 2
_SCHEMA = """
CREATE TABLE IF NOT EXISTS objects (
    id          TEXT PRIMARY KEY,
    namespace   TEXT NOT NULL,
    size_bytes  INTEGER NOT NULL,
    lines       INTEGER NOT NULL,
    created_at  REAL NOT NULL,
    owner       TEXT
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS objects_by_age ON objects (created_at, id);
CREATE TABLE IF NOT EXISTS line_marks (
    id          TEXT NOT NULL,
    byte_offset INTEGER NOT NULL,
    newlines    INTEGER NOT NULL,
    PRIMARY KEY (id, byte_offset)
) WITHOUT ROWID;
CREATE INDEX IF NOT EXISTS line_marks_by_newlines ON line_marks (id, newlines, byte_offset);
"""
_OWNER_INDEX = "CREATE INDEX IF NOT EXISTS objects_by_owner ON objects (owner, created_at, id)"
_ADD_OWNER = "ALTER TABLE objects ADD COLUMN owner TEXT"  # version 1 -> 2: owners unknown
_REF_COLUMNS = "id, size_bytes, lines, created_at, namespace"


@dataclass(frozen=True, slots=True)
class LineMark:
    """`newlines` is the number of `\\n` bytes in the object before `byte_offset`."""

    byte_offset: int
    newlines: int


ORIGIN = LineMark(0, 0)


@dataclass(frozen=True, slots=True)
class StagedStats:
    """Objects a write-behind store committed from its staging directory whose upload has not
    ended yet (`managed_store.s3.staging`): how many, their bytes, the seconds since the
    oldest of them was committed, how many failed an upload attempt (tried again with
    backoff) and the last such failure."""

    objects: int
    bytes: int
    oldest_seconds: float
    retrying: int = 0
    last_error: str | None = None


@dataclass(frozen=True, slots=True)
class StoreStats:
    """What the store holds right now: number of objects and their total UTF-8 bytes; what it
    evicted since it opened (by TTL, by quota); the bytes of its index files (database + WAL);
    for a store writing behind, what is staged here and not uploaded yet (None: the store
    does not stage)."""

    count: int
    bytes: int
    evicted_expired: int = field(default=0, compare=False)
    evicted_quota: int = field(default=0, compare=False)
    index_bytes: int = field(default=0, compare=False)
    staged: StagedStats | None = field(default=None, compare=False)


def _ref(row: tuple[str, int, int, float, str]) -> ManagedRef:
    return ManagedRef(
        id=row[0], size_bytes=row[1], lines=row[2], created_at=row[3], namespace=row[4]
    )


class Index:
    """One SQLite connection in WAL mode; every write is its own transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    @classmethod
    def open(cls, path: Path) -> Index:
        # Autocommit mode: transactions are explicit, so a failed insert can never leave a
        # half-open transaction behind for the next caller.
        create_private_file(path)
        conn = sqlite3.connect(path, isolation_level=None)
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            # FULL, because the object file was fsynced before its row: a ref handed out must
            # survive a power cut as well as the file does.
            conn.execute("PRAGMA synchronous=FULL")
            conn.execute(f"PRAGMA journal_size_limit={WAL_LIMIT_BYTES}")
            version = conn.execute("PRAGMA user_version").fetchone()[0]
            if version not in (0, 1, _SCHEMA_VERSION):
                raise ManagedStoreError(
                    f"index schema version {version} is not supported (expected {_SCHEMA_VERSION})"
                )
            conn.executescript(_SCHEMA)
            if version == 1:
                conn.execute(_ADD_OWNER)
            conn.execute(_OWNER_INDEX)
            conn.execute(f"PRAGMA user_version={_SCHEMA_VERSION}")
        except BaseException:
            conn.close()
            raise
        return cls(conn)

    def close(self) -> None:
        self._conn.close()

    def truncate_wal(self) -> None:
        """Checkpoint the WAL whole and empty its file (after a cleanup: the store is quiet)."""
        self._conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")

    def get(self, ref_id: str) -> ManagedRef | None:
        row = self._conn.execute(
            f"SELECT {_REF_COLUMNS} FROM objects WHERE id = ?", (ref_id,)
        ).fetchone()
        return None if row is None else _ref(row)

    def insert(
        self, ref: ManagedRef, marks: Sequence[LineMark], owner: str | None = None
    ) -> None:
        with self._transaction():
            self._conn.execute(
                f"INSERT INTO objects ({_REF_COLUMNS}, owner) VALUES (?, ?, ?, ?, ?, ?)",
                (ref.id, ref.size_bytes, ref.lines, ref.created_at, ref.namespace, owner),
            )
            self._conn.executemany(
                "INSERT INTO line_marks (id, byte_offset, newlines) VALUES (?, ?, ?)",
                ((ref.id, m.byte_offset, m.newlines) for m in marks),
            )

    def delete(self, ref_ids: Iterable[str]) -> None:
        ids = [(ref_id,) for ref_id in ref_ids]
        if not ids:
            return
        with self._transaction():
            self._conn.executemany("DELETE FROM objects WHERE id = ?", ids)
            self._conn.executemany("DELETE FROM line_marks WHERE id = ?", ids)

    def mark_for_line(self, ref_id: str, line: int) -> LineMark:
        """The last mark with fewer than `line - 1` newlines before it.

        Line `line` starts right after newline number `line - 1`, so it starts after this mark
        and, because the next mark already has `line - 1` newlines before it, at most
        `MARK_BYTES` after it.
        """
        row = self._conn.execute(
            "SELECT byte_offset, newlines FROM line_marks WHERE id = ? AND newlines < ?"
            " ORDER BY newlines DESC, byte_offset DESC LIMIT 1",
            (ref_id, line - 1),
        ).fetchone()
        return ORIGIN if row is None else LineMark(row[0], row[1])

    def mark_for_offset(self, ref_id: str, byte_offset: int) -> LineMark:
        """The last mark at or before `byte_offset`."""
        row = self._conn.execute(
            "SELECT byte_offset, newlines FROM line_marks WHERE id = ? AND byte_offset <= ?"
            " ORDER BY byte_offset DESC LIMIT 1",
            (ref_id, byte_offset),
        ).fetchone()
        return ORIGIN if row is None else LineMark(row[0], row[1])

    def oldest_covering(self, nbytes: int) -> list[ManagedRef]:
        """The oldest objects, as few as possible, whose sizes add up to at least `nbytes`."""
        victims: list[ManagedRef] = []
        freed = 0
        cursor = self._conn.execute(f"SELECT {_REF_COLUMNS} FROM objects ORDER BY created_at, id")
        try:
            for row in cursor:
                if freed >= nbytes:
                    break
                victims.append(_ref(row))
                freed += victims[-1].size_bytes
        finally:
            cursor.close()
        return victims

    def owner_bytes(self, owner: str) -> int:
        return int(self._conn.execute(
            "SELECT COALESCE(SUM(size_bytes), 0) FROM objects WHERE owner = ?", (owner,)
        ).fetchone()[0])

    def holdings(self) -> dict[str | None, tuple[int, float]]:
        """Per owner (None: objects stored without one): its bytes and its oldest object's
        `created_at`."""
        rows = self._conn.execute(
            "SELECT owner, SUM(size_bytes), MIN(created_at) FROM objects GROUP BY owner")
        return {owner: (total, oldest) for owner, total, oldest in rows}

    def oldest_of(self, owner: str | None, count: int, after: float = -1.0) -> list[ManagedRef]:
        """`owner`'s oldest objects created after `after`, at most `count`, oldest first."""
        rows = self._conn.execute(
            f"SELECT {_REF_COLUMNS} FROM objects WHERE owner IS ? AND created_at > ?"
            " ORDER BY created_at, id LIMIT ?", (owner, after, count))
        return [_ref(row) for row in rows]

    def created_before(self, cutoff: float) -> list[ManagedRef]:
        rows = self._conn.execute(
            f"SELECT {_REF_COLUMNS} FROM objects WHERE created_at < ? ORDER BY created_at, id",
            (cutoff,),
        )
        return [_ref(row) for row in rows]

    def newest_created_at(self) -> float:
        return float(
            self._conn.execute("SELECT COALESCE(MAX(created_at), 0) FROM objects").fetchone()[0]
        )

    def ids(self) -> set[str]:
        return {row[0] for row in self._conn.execute("SELECT id FROM objects")}

    def totals(self) -> StoreStats:
        count, total = self._conn.execute(
            "SELECT COUNT(*), COALESCE(SUM(size_bytes), 0) FROM objects"
        ).fetchone()
        return StoreStats(count=count, bytes=total)

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[None]:
        """`BEGIN IMMEDIATE` … `COMMIT`; on any failure, including of `COMMIT`, `ROLLBACK`."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
            self._conn.execute("COMMIT")
        except BaseException:
            # A failed COMMIT (disk full) can leave the transaction open; close it so the next
            # caller does not inherit it.
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise

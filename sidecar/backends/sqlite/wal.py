"""Keeping a SQLite write-ahead log small without a checkpoint on the commit path: `WalKeeper`
(its docstring says what runs when, and on which thread), for a writer that turns SQLite's
automatic checkpoint off. Why, and what it costs: this package's README.md and
`bench/RESULTS.md`.

Imports `sidecar.stores` and `sqlite3`. Exports `WalKeeper`, `WalStats`, `wal_path`,
`file_size` and `DEFAULT_IDLE_SECONDS`.
"""

from __future__ import annotations

import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from sidecar.stores.outcome_log import DEFAULT_WAL_CAP_BYTES

CHECKPOINT_EVERY = 500
"""Records between two PASSIVE checkpoints (about SQLite's default 1,000 WAL pages)."""

CATCH_UP_ROUNDS = 8
CATCH_UP_FRAMES = 256
"""Over the cap, PASSIVE rounds repeat (at most `CATCH_UP_ROUNDS`) until one copies at most
this many frames (1 MiB of 4 KiB pages) before the writer is asked to truncate."""

STAT_EVERY = 8
"""Records between two looks at the WAL file's size."""

DEFAULT_IDLE_SECONDS = 1.0

logger = logging.getLogger("sidecar.backends.sqlite.wal")


def wal_path(path: Path) -> Path:
    return path.with_name(path.name + "-wal")


def file_size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


@dataclass(frozen=True, slots=True)
class WalStats:
    wal_bytes: int
    passive_checkpoints: int
    truncations: int
    """TRUNCATE checkpoints that emptied the WAL file (over the cap, or idle)."""


class WalKeeper:
    """Keeps one database's WAL under `cap_bytes` for the thread that writes it: the writer
    calls `configure` once, then `after_batch`, `idle_wait` and `on_idle`; `stop` ends the
    checkpoint thread.

    - every `CHECKPOINT_EVERY` records, or as soon as the file is over `cap_bytes`, the
      checkpoint thread, with its own connection, runs a PASSIVE checkpoint: it copies the
      WAL into the database and never blocks the writer;
    - PASSIVE alone never shrinks the file, and under steady load never lets the WAL start
      over, so when the file is over `cap_bytes` the checkpoint thread repeats PASSIVE rounds
      until one has little left to copy, then the writer runs `wal_checkpoint(TRUNCATE)`
      between two batches: only the frames written during that last short round are left to
      copy, and the file goes back to zero bytes;
    - when the writer has had nothing to do for `idle_seconds` after a write, it does the
      same, so an idle daemon keeps no WAL at all.

    `journal_size_limit` (set to the cap on the writer's connection) also truncates the file
    whenever SQLite starts the WAL over by itself. Threads: `after_batch`, `idle_wait` and
    `on_idle` run on the writer thread; the checkpoint thread only runs PASSIVE checkpoints
    and sets a flag the writer reads. A negative cap is a `ValueError`."""

    def __init__(
        self, path: Path, *, cap_bytes: int = DEFAULT_WAL_CAP_BYTES,
        idle_seconds: float = DEFAULT_IDLE_SECONDS, name: str,
    ) -> None:
        if cap_bytes < 0:
            raise ValueError(f"the WAL cap must be >= 0 bytes, got {cap_bytes}")
        if not idle_seconds > 0:
            raise ValueError(f"idle_seconds must be > 0, got {idle_seconds}")
        self._path = path
        self._wal = wal_path(path)
        self.cap_bytes = cap_bytes
        self._idle = idle_seconds
        self._unchecked = 0
        self._unstatted = 0
        self._seen_changes = 0
        self._clean_changes = 0  # the writer's `total_changes` at its last truncation
        self._last_write = 0.0
        self._truncate_due = False
        self._passive = 0
        self._backfilled = 0  # frames the last PASSIVE checkpoint had copied (checkpoint thread)
        self._truncations = 0
        self._wake = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def configure(self, conn: sqlite3.Connection) -> None:
        """Set up the writer's connection (call once, on the writer thread)."""
        conn.execute("PRAGMA wal_autocheckpoint=0")  # this keeper does it, off the commit
        conn.execute(f"PRAGMA journal_size_limit={int(self.cap_bytes)}")
        self._seen_changes = self._clean_changes = conn.total_changes

    def stats(self) -> WalStats:
        return WalStats(file_size(self._wal), self._passive, self._truncations)

    # --- writer thread ---------------------------------------------------------------

    def after_batch(self, conn: sqlite3.Connection | None, records: int, *,
                    owner: bool = True) -> None:
        """After a batch of `records`; `owner=False` after a job run inline on another thread
        (`SqliteOwner.run_inline`), which never truncates: it asks the writer thread to."""
        if conn is None:
            return
        changes = conn.total_changes
        if changes != self._seen_changes:
            self._seen_changes = changes
            self._last_write = time.monotonic()
        self._unchecked += records
        if self._truncate_due:
            if owner:
                self._truncate(conn)
        elif self._unchecked >= CHECKPOINT_EVERY or self._over_cap(records):
            self._unchecked = 0
            self._wake.set()

    def _over_cap(self, records: int) -> bool:
        """Large records fill the cap long before `CHECKPOINT_EVERY` of them: a `stat` every
        `STAT_EVERY` records (each a few µs, as much as the rest of the upkeep) catches that."""
        self._unstatted += records
        if self._unstatted < STAT_EVERY:
            return False
        self._unstatted = 0
        return file_size(self._wal) > self.cap_bytes

    def inline_ok(self) -> bool:
        """False while a truncation is due: only the writer thread runs one."""
        return not self._truncate_due

    def idle_wait(self, conn: sqlite3.Connection | None) -> float | None:
        """How long the writer may wait for work before `on_idle` (None: as long as it likes)."""
        if conn is None or conn.total_changes == self._clean_changes:
            return None
        return max(0.0, self._last_write + self._idle - time.monotonic())

    def on_idle(self, conn: sqlite3.Connection | None) -> None:
        if conn is not None and conn.total_changes != self._clean_changes:
            self._truncate(conn)

    def _truncate(self, conn: sqlite3.Connection) -> None:
        self._truncate_due = False
        changes = conn.total_changes
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error as exc:  # the WAL only stays as it is until the next attempt
            logger.warning("%s: WAL checkpoint failed: %s", self._path, exc)
            self._clean_changes = changes  # retried after the next write, not in a loop
            return
        self._clean_changes = changes
        if not busy:
            self._truncations += 1

    # --- checkpoint thread -----------------------------------------------------------

    def stop(self) -> None:
        """End the checkpoint thread; the writer's close checkpoints what is left."""
        self._stopping = True
        self._wake.set()
        self._thread.join()

    def _serve(self) -> None:
        try:
            conn = sqlite3.connect(self._path, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as exc:
            logger.warning("%s: no checkpoint thread (%s); the WAL is checkpointed when the "
                           "writer idles and when it closes", self._path, exc)
            return
        try:
            while True:
                self._wake.wait()
                self._wake.clear()
                if self._stopping:
                    return
                if self._truncate_due:
                    continue  # the writer truncates next; a PASSIVE now would only delay it
                try:
                    copied = self._passive_checkpoint(conn)
                    if file_size(self._wal) > self.cap_bytes:
                        # Catch up first: each round copies what the writer added during the
                        # one before, so once a round is short, what is left for the writer's
                        # TRUNCATE (which the writer waits for) is short too.
                        for _ in range(CATCH_UP_ROUNDS):
                            if copied <= CATCH_UP_FRAMES:
                                break
                            copied = self._passive_checkpoint(conn)
                        self._truncate_due = True
                except sqlite3.Error as exc:
                    logger.warning("%s: WAL checkpoint failed: %s", self._path, exc)
        finally:
            conn.close()

    def _passive_checkpoint(self, conn: sqlite3.Connection) -> int:
        """One PASSIVE checkpoint; returns how many frames it copied."""
        before = self._backfilled
        backfilled = int(conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()[2])
        self._passive += 1
        self._backfilled = backfilled
        # After the WAL started over, `backfilled` counts from the new start.
        return backfilled - before if backfilled >= before else max(0, backfilled)

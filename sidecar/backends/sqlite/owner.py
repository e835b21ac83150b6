"""`SqliteOwner`: the one thread that owns one SQLite connection, for every embedded store.

Work is submitted from the event loop (`submit`, `run`) and answered on the loop; nothing
touches SQLite on the loop. The thread takes every job queued since it last looked as one
batch and answers the batch in one callback per loop. With `group_commit` a batch runs in one
transaction (N concurrent writers cost one commit), and when that transaction fails each job
of a batch of several runs again alone, so one bad job fails only its caller. Items
handed to `gather` (rows written behind, off the caller's path) are written by
`write_gathered` before the next batch runs, or `gather_seconds` after the first of them.
An `upkeep` (`WalKeeper`) is told after each batch and when the thread idles.

`run_inline` runs one job on the caller's thread instead, as its own transaction, when the
thread has nothing queued or running and the upkeep has nothing due: a sequential writer then
pays no thread hand-off (two wake-ups and a GIL hand-over each way, ~300 µs of CPU per call on
a loaded 2-core machine, more than the commit itself). The connection is shared under a lock
the thread holds for each batch, so the two never touch SQLite at once, and jobs keep their
submission order (a job runs inline only when every job submitted before it has finished).

Imports nothing of the sidecar. Exports `SqliteOwner` and `Upkeep`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar

__all__ = ["SqliteOwner", "Upkeep"]

T = TypeVar("T")
G = TypeVar("G")

log = logging.getLogger("sidecar.backends.sqlite.owner")


class Upkeep(Protocol):
    """Work on the owner thread between batches, never inside one (`wal.WalKeeper`)."""

    def after_batch(self, conn: sqlite3.Connection | None, records: int, *,
                    owner: bool = True) -> None:
        """`owner=False`: after an inline job, on the caller's thread: never truncate."""
        ...

    def idle_wait(self, conn: sqlite3.Connection | None) -> float | None:
        """How long the thread may wait for work before `on_idle` (None: no limit)."""
        ...

    def on_idle(self, conn: sqlite3.Connection | None) -> None: ...

    def inline_ok(self) -> bool:
        """False while work is due that only the owner thread may do (a truncation)."""
        ...


class _Job:
    __slots__ = ("fn", "future", "loop", "stop")

    def __init__(self, fn: Callable[[], Any] | None, future: asyncio.Future[Any] | None,
                 loop: asyncio.AbstractEventLoop | None, *, stop: bool = False) -> None:
        self.fn = fn
        """None: a wake-up (`_WAKE`) or the stop."""
        self.future = future
        self.loop = loop
        self.stop = stop


_WAKE = _Job(None, None, None)
"""Queued with the first gathered item: the thread then waits `gather_seconds` for more."""


class SqliteOwner(Generic[G]):
    """One thread, one connection. `open` connects on the thread; `close` writes what was
    gathered, runs what was queued before it, closes the connection on the thread and ends
    it. A job submitted after `close` fails with `closed()`."""

    def __init__(
        self, name: str, *, closed: Callable[[], Exception], group_commit: bool = False,
        write_gathered: Callable[[sqlite3.Connection, list[G]], None] | None = None,
        gather_seconds: float = 0.0,
    ) -> None:
        self.connection: sqlite3.Connection | None = None
        self.upkeep: Upkeep | None = None
        """Set once connected (by the job that connects, on the thread)."""
        self.on_close: Callable[[], None] = lambda: None
        """Run on the thread before the connection closes (e.g. stop a checkpoint thread)."""
        self._closed_error = closed
        self._group_commit = group_commit
        self._write_gathered = write_gathered
        self._gather_seconds = gather_seconds
        self._gathered: list[G] = []
        self._gathered_at = 0.0
        self._gather_lock = threading.Lock()
        self._closing = False
        self._jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
        self._lock = threading.Lock()
        """Held by whichever thread uses the connection: the owner for a batch or its
        upkeep, a caller for `run_inline`."""
        self._count_lock = threading.Lock()
        self._submitted = 0
        self._finished = 0  # jobs the owner thread has run (written by it alone)
        self._waiting_forever = False
        """The owner thread waits for a job with no timeout: an inline write wakes it, so
        that its upkeep sees the write (the idle truncation)."""
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    # --- on the event loop -------------------------------------------------------------

    async def open(self, connect: Callable[[], sqlite3.Connection]) -> None:
        """Connect on the owner thread (`connect` may set `upkeep`); when that fails the
        thread is ended before the error is raised."""
        def opened() -> None:
            self.connection = connect()

        try:
            await self.submit(opened)
        except BaseException:
            await self.close()
            raise

    def submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """Run `fn` on the owner thread (with the batch it lands in); its result or error."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        if self._closing:
            future.set_exception(self._closed_error())
        else:
            with self._count_lock:
                self._submitted += 1
            self._jobs.put(_Job(fn, future, loop))
        return future

    def run_inline(self, fn: Callable[[], T]) -> tuple[bool, Any] | None:
        """Run `fn` now on the caller's thread, outside any batch (autocommit: a job of
        several statements opens its own transaction): `(True, result)` or
        `(False, error)`; None when it cannot run inline (work queued or running, the upkeep
        busy, gathered items, closed): then `submit` it. Only for short jobs."""
        if (self._closing or self._gathered or self._submitted != self._finished
                or self.connection is None):
            return None
        keeper = self.upkeep
        if keeper is not None and not keeper.inline_ok():
            return None
        if not self._lock.acquire(blocking=False):
            return None
        try:
            if self._submitted != self._finished or self.connection is None:
                return None
            result = _attempt(fn)  # the job opens a transaction itself if it needs one
            if keeper is not None:
                keeper.after_batch(self.connection, 1, owner=False)
            wake = self._waiting_forever or (keeper is not None and not keeper.inline_ok())
            self._waiting_forever = False
        finally:
            self._lock.release()
        if wake:
            self._jobs.put(_WAKE)
        return result

    async def run(self, fn: Callable[[], T]) -> T:
        return await self.submit(fn)

    def gather(self, item: G) -> None:
        """Hand `item` to `write_gathered`, off the caller's path; never blocks."""
        with self._gather_lock:
            self._gathered.append(item)
            first = len(self._gathered) == 1
            if first:
                self._gathered_at = time.monotonic()
        if first:
            self._jobs.put(_WAKE)

    async def close(self) -> None:
        if self._closing:
            return
        self._closing = True
        loop = asyncio.get_running_loop()
        future: asyncio.Future[None] = loop.create_future()
        self._jobs.put(_Job(None, future, loop, stop=True))
        await future

    # --- on the owner thread -------------------------------------------------------------

    def _serve(self) -> None:
        jobs = self._jobs
        while True:
            keeper = self.upkeep
            if self._gathered:
                wait: float | None = max(
                    0.0, self._gathered_at + self._gather_seconds - time.monotonic())
            else:  # between batches, never inside one: the WAL's upkeep
                with self._lock:
                    wait = None if keeper is None else keeper.idle_wait(self.connection)
                    self._waiting_forever = wait is None
            try:
                first = jobs.get(timeout=wait)
            except queue.Empty:
                with self._lock:
                    if self._gathered:
                        self._write_gathered_now()
                    elif keeper is not None and not keeper.idle_wait(self.connection):
                        keeper.on_idle(self.connection)  # (inline jobs may have written since)
                continue
            batch = [first]
            with contextlib.suppress(queue.Empty):
                while not batch[-1].stop:
                    batch.append(jobs.get_nowait())
            stop = batch[-1].stop  # nothing is queued after the stop
            work = [job for job in batch if job.fn is not None]
            if not work and not stop:
                if keeper is not None and not keeper.inline_ok():
                    with self._lock:  # a truncation an inline job found due
                        keeper.after_batch(self.connection, 0)
                continue  # only wake-ups: keep gathering
            with self._lock:
                self._waiting_forever = False
                if self._gathered:  # a job sees every item gathered before it
                    self._write_gathered_now()
                if work:
                    results = self._run(work)
                    if keeper is not None:
                        keeper.after_batch(self.connection, len(work))
                    with self._count_lock:
                        self._finished += len(work)
            if work:
                _deliver(work, results)
            if stop:
                with self._lock:
                    shut = _attempt(self._shut)
                _deliver(batch[-1:], [shut])
                return

    def _run(self, jobs: list[_Job]) -> list[tuple[bool, Any]]:
        db = self.connection
        if self._group_commit and db is not None:
            try:  # one commit for the batch, and for the statements of one job
                db.execute("BEGIN IMMEDIATE")
                results = [(True, job.fn()) for job in jobs if job.fn is not None]
                db.execute("COMMIT")
                return results
            except BaseException as exc:
                if db.in_transaction:
                    with contextlib.suppress(sqlite3.Error):
                        db.execute("ROLLBACK")
                if len(jobs) == 1:  # alone already: its own error, not a second run
                    return [(False, exc)]
        return [_attempt(job.fn) for job in jobs if job.fn is not None]

    def _write_gathered_now(self) -> None:
        with self._gather_lock:
            items, self._gathered = self._gathered, []
        db = self.connection
        if not items or db is None or self._write_gathered is None:
            return
        try:
            self._write_gathered(db, items)
        except Exception:  # one bad write must not end the thread
            log.exception("%s: writing %d gathered items failed", self._thread.name, len(items))

    def _shut(self) -> None:
        try:
            self.on_close()
        finally:
            conn, self.connection = self.connection, None
            if conn is not None:
                conn.close()


def _attempt(fn: Callable[[], Any]) -> tuple[bool, Any]:
    try:
        return True, fn()
    except BaseException as exc:  # handed to the caller, who re-raises it
        return False, exc


def _deliver(jobs: list[_Job], results: list[tuple[bool, Any]]) -> None:
    by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Job, tuple[bool, Any]]]] = {}
    for job, result in zip(jobs, results, strict=True):
        if job.loop is not None:
            by_loop.setdefault(job.loop, []).append((job, result))
    for loop, pairs in by_loop.items():
        with contextlib.suppress(RuntimeError):  # the loop is already closed: nobody waits
            loop.call_soon_threadsafe(_settle, pairs)


def _settle(pairs: list[tuple[_Job, tuple[bool, Any]]]) -> None:
    for job, (ok, value) in pairs:
        future = job.future
        if future is None or future.done():  # the caller was cancelled; the work still happened
            continue
        if ok:
            future.set_result(value)
        else:
            future.set_exception(value)

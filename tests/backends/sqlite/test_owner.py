"""`SqliteOwner`, the one thread owning one SQLite connection of every embedded store: jobs
queued together run as one batch (one transaction with group commit, and a failing job fails
only its caller), gathered items are written before any later job and at close, and a job
submitted after close fails with the store's own error."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
from pathlib import Path
from typing import Any

import pytest

from sidecar.backends.sqlite.owner import SqliteOwner

pytestmark = pytest.mark.anyio


class Closed(Exception):
    pass


def connect(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    conn.execute("CREATE TABLE IF NOT EXISTS t (v INTEGER)")
    return conn


def rows(path: Path) -> list[int]:
    with contextlib.closing(sqlite3.connect(path)) as conn, conn:
        return [v for (v,) in conn.execute("SELECT v FROM t ORDER BY rowid")]


@pytest.mark.parametrize("group_commit", [True, False])
async def test_a_failing_job_of_a_batch_fails_only_its_caller(
    tmp_path: Path, group_commit: bool, anyio_backend: str
) -> None:
    path = tmp_path / "t.sqlite"
    owner: SqliteOwner[None] = SqliteOwner("t", closed=Closed, group_commit=group_commit)
    await owner.open(lambda: connect(path))
    db = owner.connection
    assert db is not None
    gate = threading.Event()
    busy = owner.submit(gate.wait)  # holds the thread: the next jobs queue up as one batch
    first = owner.submit(lambda: db.execute("INSERT INTO t VALUES (1)").rowcount)
    broken = owner.submit(lambda: db.execute("INSERT INTO missing VALUES (1)"))
    last = owner.submit(lambda: db.execute("INSERT INTO t VALUES (2)").rowcount)
    gate.set()
    assert await busy is True
    assert await first == 1 and await last == 1
    with pytest.raises(sqlite3.OperationalError, match="no such table"):
        await broken
    assert rows(path) == [1, 2]
    await owner.close()


async def test_gathered_items_are_written_before_a_later_job_and_at_close(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "t.sqlite"
    written: list[list[int]] = []

    def write(db: sqlite3.Connection, items: list[int]) -> None:
        written.append(items)
        db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in items])

    owner: SqliteOwner[int] = SqliteOwner("t", closed=Closed, write_gathered=write,
                                          gather_seconds=3600)
    await owner.open(lambda: connect(path))
    owner.gather(1)
    owner.gather(2)
    await asyncio.sleep(0.05)
    assert written == []  # still gathering: nothing asked for them yet
    db = owner.connection
    assert db is not None
    assert await owner.run(lambda: db.execute("SELECT count(*) FROM t").fetchone()[0]) == 2
    owner.gather(3)
    await owner.close()
    assert written == [[1, 2], [3]]
    assert rows(path) == [1, 2, 3]


async def test_gathered_items_are_written_after_gather_seconds(
    tmp_path: Path, anyio_backend: str
) -> None:
    path = tmp_path / "t.sqlite"
    done = threading.Event()

    def write(db: sqlite3.Connection, items: list[int]) -> None:
        db.executemany("INSERT INTO t VALUES (?)", [(i,) for i in items])
        done.set()

    owner: SqliteOwner[int] = SqliteOwner("t", closed=Closed, write_gathered=write,
                                          gather_seconds=0.05)
    await owner.open(lambda: connect(path))
    owner.gather(7)
    assert await asyncio.to_thread(done.wait, 5)
    assert rows(path) == [7]
    await owner.close()


async def test_after_close_a_job_fails_with_the_stores_error(
    tmp_path: Path, anyio_backend: str
) -> None:
    owner: SqliteOwner[None] = SqliteOwner(
        "t", closed=lambda: Closed("the t store is closed"))
    await owner.open(lambda: connect(tmp_path / "t.sqlite"))
    await owner.close()
    await owner.close()  # again: nothing happens
    assert owner.connection is None
    with pytest.raises(Closed, match="the t store is closed"):
        await owner.run(lambda: 1)


async def test_an_idle_owner_runs_a_job_inline_and_a_busy_one_keeps_the_order(
    tmp_path: Path, anyio_backend: str
) -> None:
    """`run_inline` runs on the caller's thread only when nothing submitted before it is
    queued or running; otherwise it declines and the job is submitted behind the others."""
    path = tmp_path / "t.sqlite"
    owner: SqliteOwner[None] = SqliteOwner("t", closed=Closed, group_commit=True)
    await owner.open(lambda: connect(path))
    db = owner.connection
    assert db is not None
    here = threading.get_ident()
    done = await inline(owner, lambda: (threading.get_ident(), db.execute(
        "INSERT INTO t VALUES (1)").rowcount))
    assert done == (True, (here, 1))
    failed = await inline(owner, lambda: db.execute("INSERT INTO missing VALUES (1)"))
    assert failed[0] is False
    assert isinstance(failed[1], sqlite3.OperationalError)

    gate = threading.Event()
    busy = owner.submit(gate.wait)
    queued = owner.submit(lambda: db.execute("INSERT INTO t VALUES (2)").rowcount)
    assert owner.run_inline(lambda: db.execute("INSERT INTO t VALUES (3)")) is None
    later = owner.submit(lambda: db.execute("INSERT INTO t VALUES (3)").rowcount)
    gate.set()
    assert await busy is True and await queued == 1 and await later == 1
    assert rows(path) == [1, 2, 3]  # the declined job ran after the ones before it
    assert await inline(owner, threading.get_ident) == (True, here)  # answered: inline again
    await owner.close()
    assert owner.run_inline(lambda: 1) is None


async def inline(owner: SqliteOwner[None], fn: Any) -> tuple[bool, Any]:
    """`run_inline` once the thread is idle: it declines while the thread holds its lock, as
    it does for a moment after each wake-up (then a caller submits instead)."""
    for _ in range(500):
        if (done := owner.run_inline(fn)) is not None:
            return done
        await asyncio.sleep(0.01)
    raise AssertionError("run_inline declined for 5 s with nothing queued")

"""The outcome log's settled-call filter: never a false negative, also after a restart."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import pytest

from sidecar.backends.sqlite.outcome_log import (
    CHECKPOINT_EVERY,
    SETTLE_GATHER_SECONDS,
    SettledFilter,
    SqliteOutcomeLog,
)
from sidecar.model.content import TextContent
from sidecar.model.errors import CallIdConflict
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.outcome_log import OutcomeLogError

pytestmark = pytest.mark.anyio


def test_filter_has_no_false_negatives_and_few_false_positives():
    f = SettledFilter(bits=1 << 16)
    added = [f"call-{i}" for i in range(2000)]
    for call_id in added:
        f.add("loc", call_id)
    assert all(f.may_contain("loc", c) for c in added)
    false_positives = sum(f.may_contain("loc", f"other-{i}") for i in range(5000))
    assert false_positives < 250  # about 0.2 % expected at this load; a broken hash gives ~all


async def test_settled_calls_are_found_after_reopening(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    outcome = Outcome(call_id="c1", tool="t", status="completed", content=(TextContent("x"),))
    await log.record("loc", outcome, ToolContext("s", "a", "m", "c1"))
    assert (await log.get("loc", "c1")).content == (TextContent("x"),)
    assert await log.get("loc", "never") is None
    await log.aclose()
    reopened = await SqliteOutcomeLog.open(path)
    try:
        again = await reopened.get("loc", "c1")
        assert again is not None and again.replayed
        assert await reopened.get("other-location", "c1") is None
    finally:
        await reopened.aclose()


async def test_concurrent_records_commit_together_and_all_persist(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    try:
        outcomes = [
            Outcome(call_id=f"c{i}", tool="t", status="completed", content=(TextContent(f"{i}"),))
            for i in range(64)
        ]
        stored = await asyncio.gather(*(
            log.record("loc", o, ToolContext("s", "a", "m", o.call_id)) for o in outcomes
        ))
        assert [s.call_id for s in stored] == [o.call_id for o in outcomes]
        assert not any(s.replayed for s in stored)
    finally:
        await log.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        assert db.execute("SELECT count(*) FROM outcomes").fetchone()[0] == 64


async def test_one_failing_job_in_a_batch_fails_only_its_caller(tmp_path):
    """Jobs queued while the worker is busy share a transaction; when one of them fails, the
    transaction is rolled back and the others are run again on their own."""
    log = await SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite")
    gate = threading.Event()
    try:
        busy = log._run(gate.wait, inline=False)  # holds the worker: the next jobs batch up
        first = asyncio.ensure_future(log.record(
            "loc", Outcome(call_id="ok-1", tool="t", status="completed"),
            ToolContext("s", "a", "m", "ok-1")))

        def broken() -> None:
            log._db().execute("INSERT INTO no_such_table VALUES (1)")

        failing = asyncio.ensure_future(log._run(broken))
        second = asyncio.ensure_future(log.record(
            "loc", Outcome(call_id="ok-2", tool="t", status="completed"),
            ToolContext("s", "a", "m", "ok-2")))
        await asyncio.sleep(0.05)
        gate.set()
        await busy
        assert (await first).call_id == "ok-1"
        assert (await second).call_id == "ok-2"
        with pytest.raises(OutcomeLogError, match="no_such_table"):
            await failing
        assert await log.get("loc", "ok-1") is not None
        assert await log.get("loc", "ok-2") is not None
    finally:
        gate.set()
        await log.aclose()


async def test_a_closed_log_refuses_work_with_a_clear_error(tmp_path):
    log = await SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite")
    await log.aclose()
    await log.aclose()  # idempotent
    with pytest.raises(OutcomeLogError, match="closed"):
        await log.get("loc", "c1")


async def test_the_wal_is_checkpointed_off_the_commit_path_and_on_close(tmp_path):
    # The writer's own automatic checkpoint is off (it made a whole commit batch wait), so
    # only the checkpoint thread moves records into the database file while the log is open.
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    try:
        assert await log._run(
            lambda: log._db().execute("PRAGMA wal_autocheckpoint").fetchone()[0]
        ) == 0
        empty = path.stat().st_size
        body = "x" * 2000
        for start in range(0, CHECKPOINT_EVERY + 100, 50):
            await asyncio.gather(*(
                log.record("loc", Outcome(call_id=f"c{i}", tool="t", status="completed",
                                          content=(TextContent(body),)),
                           ToolContext("s", "a", "m", f"c{i}"))
                for i in range(start, start + 50)
            ))
        for _ in range(500):
            if path.stat().st_size > empty + CHECKPOINT_EVERY * 2000:
                break
            await asyncio.sleep(0.01)
        assert path.stat().st_size > empty + CHECKPOINT_EVERY * 2000
    finally:
        await log.aclose()
    assert not path.with_name(path.name + "-wal").exists()  # the close checkpointed the rest
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        assert db.execute("SELECT count(*) FROM outcomes").fetchone()[0] == CHECKPOINT_EVERY + 100


async def test_a_log_from_before_fingerprints_is_migrated_and_still_replays(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    old = sqlite3.connect(path)
    old.executescript("""
        CREATE TABLE outcomes (location TEXT NOT NULL, call_id TEXT NOT NULL,
            session_id TEXT NOT NULL, agent TEXT NOT NULL, message_id TEXT NOT NULL,
            tool TEXT NOT NULL, status TEXT NOT NULL, body TEXT NOT NULL,
            created_at REAL NOT NULL, PRIMARY KEY (location, call_id)) WITHOUT ROWID;
    """)
    body = '{"call_id": "old", "tool": "t", "status": "completed", ' \
           '"content": [{"type": "text", "text": "kept"}]}'
    old.execute("INSERT INTO outcomes VALUES ('loc','old','s','a','m','t','completed',?,0)",
                (body,))
    old.commit()
    old.close()
    log = await SqliteOutcomeLog.open(path)
    try:
        replayed = await log.get("loc", "old", "any-fingerprint")  # unknown: replays as before
        assert replayed is not None and replayed.content == (TextContent("kept"),)
        new = Outcome(call_id="new", tool="t", status="completed", content=(TextContent("n"),))
        await log.record("loc", new, ToolContext("s", "a", "m", "new"), "fp-1")
        assert (await log.get("loc", "new", "fp-1")) is not None
        with pytest.raises(CallIdConflict):
            await log.get("loc", "new", "fp-2")
        other = Outcome(call_id="new", tool="u", status="completed", content=(TextContent("o"),))
        with pytest.raises(CallIdConflict):
            await log.record("loc", other, ToolContext("s", "a", "m", "new"), "fp-2")
    finally:
        await log.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db:
        columns = [row[1] for row in db.execute("PRAGMA table_info(outcomes)")]
    assert columns[-1] == "fingerprint"


async def refuse_inserts(log: SqliteOutcomeLog, call_id: str) -> None:
    """SQLite refuses the outcome row of `call_id` ("disk says no") until `DROP TRIGGER
    refuse`."""
    await log._run(lambda: log._db().execute(
        f"CREATE TRIGGER refuse BEFORE INSERT ON outcomes WHEN NEW.call_id = '{call_id}' "
        "BEGIN SELECT RAISE(ABORT, 'disk says no'); END"))


async def test_a_call_whose_outcome_could_not_be_recorded_is_interrupted_not_run_again(
    tmp_path: Path,
) -> None:
    """Neither the journal nor SQLite took it. Its start stays: a retry in this process and
    after a reopen answers `interrupted` (naming the tool and why), never None, which would
    run the tool again."""
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    try:
        await refuse_inserts(log, "doomed")
        assert log._journal is not None

        def full(row: object, body: object = None) -> None:
            raise OSError(28, "No space left on device")

        log._journal.settle = full  # type: ignore[method-assign]
        assert await log.claim("loc", "doomed", "print", "deploy") is None
        ran = Outcome(call_id="doomed", tool="deploy", status="completed",
                      content=(TextContent("deployed"),))
        with pytest.raises(OutcomeLogError, match="disk says no"):
            await log.record("loc", ran, ToolContext("s", "a", "m", "doomed"), "print")
        await log.release("loc", "doomed")  # what the seam does next: the start stays
        retry = await log.claim("loc", "doomed", "print", "deploy")
        assert retry is not None and retry.error is not None
        assert retry.error.kind == "interrupted" and "could not be recorded" in \
            retry.error.message and "(deploy)" in retry.error.message
        with pytest.raises(CallIdConflict):
            await log.claim("loc", "doomed", "another call", "deploy")
        await log._run(lambda: log._db().execute("DROP TRIGGER refuse"))
    finally:
        await log.aclose()
    reopened = await SqliteOutcomeLog.open(path)
    try:
        stored = await reopened.claim("loc", "doomed", "print", "deploy")
        assert stored is not None and stored.error is not None
        assert stored.error.kind == "interrupted" and stored.replayed
        assert await reopened.claim("loc", "fresh", "p", "t") is None
    finally:
        await reopened.aclose()


async def test_a_journaled_outcome_sqlite_refuses_is_still_answered_and_kept(
    tmp_path: Path,
) -> None:
    """The journal line is the record: when the commit behind it fails, the outcome is still
    answered from memory, and the next open puts it in SQLite."""
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path)
    try:
        await refuse_inserts(log, "late")
        assert await log.claim("loc", "late", "print", "deploy") is None
        ran = Outcome(call_id="late", tool="deploy", status="completed",
                      content=(TextContent("deployed"),))
        assert await log.record("loc", ran, ToolContext("s", "a", "m", "late"), "print") is ran
        await asyncio.sleep(SETTLE_GATHER_SECONDS * 5)  # the commit behind it has failed
        stored = await log.claim("loc", "late", "print", "deploy")
        assert stored is not None and stored.replayed and stored.content == ran.content
        await log._run(lambda: log._db().execute("DROP TRIGGER refuse"))
    finally:
        await log.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        assert db.execute("SELECT count(*) FROM outcomes WHERE call_id='late'").fetchone() \
            == (0,)
    reopened = await SqliteOutcomeLog.open(path)
    try:
        again = await reopened.get("loc", "late", "print")
        assert again is not None and again.content == ran.content
        assert await reopened._run(lambda: reopened._db().execute(
            "SELECT count(*) FROM outcomes WHERE call_id='late'").fetchone()) == (1,)
    finally:
        await reopened.aclose()


async def test_outcomes_of_a_killed_process_are_in_sqlite_at_the_next_open(
    tmp_path: Path,
) -> None:
    """A process killed after journaling outcomes and before committing them behind: the next
    open inserts them, once, and answers them as replays."""
    path = tmp_path / "outcomes.sqlite"
    first = await SqliteOutcomeLog.open(path, idle_seconds=60)
    ran = Outcome(call_id="k1", tool="t", status="completed", content=(TextContent("x"),))
    assert await first.claim("loc", "k1", "fp", "t") is None
    assert first._journal is not None
    first._owner.gather = lambda row: None  # type: ignore[method-assign]  # the kill: no commit
    await first.record("loc", ran, ToolContext("s", "a", "m", "k1"), "fp")
    journal = path.with_name(path.name + "-starts").read_bytes()
    await first.aclose()
    path.with_name(path.name + "-starts").write_bytes(journal)  # as the kill left it
    for _ in range(2):  # once: the second open finds it in SQLite and the journal empty
        reopened = await SqliteOutcomeLog.open(path)
        try:
            again = await reopened.claim("loc", "k1", "fp", "t")
            assert again is not None and again.replayed and again.content == ran.content
            assert await reopened._run(lambda: reopened._db().execute(  # noqa: B023
                "SELECT count(*) FROM outcomes WHERE call_id='k1'").fetchone()) == (1,)
        finally:
            await reopened.aclose()


async def test_starts_left_by_a_killed_process_become_interrupted_once(tmp_path: Path) -> None:
    """The journal's starts and, from logs written before it, rows of the `started` table:
    those without an outcome become `interrupted` at the next open; a start whose outcome was
    recorded, or recorded and pruned since, changes nothing."""
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path, retention_seconds=3600)
    try:
        assert await log.claim("loc", "pruned", "fp", "echo") is None
        await log.record("loc", Outcome(call_id="pruned", tool="echo", status="completed"),
                         ToolContext("s", "a", "m", "pruned"), "fp")
        assert await log.prune(time.time() + 1) == 1
        assert await log.claim("loc", "settled", "fp", "echo") is None
        await log.record("loc", Outcome(call_id="settled", tool="echo", status="completed"),
                         ToolContext("s", "a", "m", "settled"), "fp")
        assert await log.claim("loc", "running", "fp", "deploy") is None
        await log._run(lambda: log._db().execute(
            "INSERT INTO started VALUES ('loc', 'legacy', 'migrate', 'fp', 1.0)"))
    finally:  # "running" never settles nor is released: as after a kill
        await log.aclose()
    reopened = await SqliteOutcomeLog.open(path, retention_seconds=3600)
    try:
        for call_id, tool in (("running", "deploy"), ("legacy", "migrate")):
            stored = await reopened.get("loc", call_id, "fp")
            assert stored is not None and stored.error is not None, call_id
            assert stored.error.kind == "interrupted" and f"({tool})" in stored.error.message
        settled = await reopened.get("loc", "settled", "fp")
        assert settled is not None and settled.status == "completed"
        pruned = await reopened.get("loc", "pruned", "fp")
        assert pruned is not None and pruned.error is not None
        assert pruned.error.kind == "expired"
        assert await reopened._run(lambda: reopened._db().execute(
            "SELECT count(*) FROM started").fetchone()[0]) == 0
    finally:
        await reopened.aclose()
    again = await SqliteOutcomeLog.open(path, retention_seconds=3600)
    try:  # the journal was emptied: nothing is turned into an outcome twice
        assert (await again.stats()).outcomes == 3
    finally:
        await again.aclose()

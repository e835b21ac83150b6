"""The outcome log stays small on disk: its WAL goes back under the cap, old outcomes are
pruned in batches off the event loop, and a pruned call id replays as `expired`."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import threading
import time
from pathlib import Path

import pytest
from pydantic import BaseModel

from sidecar import Location, TextContent, Tool, ToolContext
from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog
from sidecar.backends.sqlite.wal import file_size, wal_path
from sidecar.model.errors import ErrorKind
from sidecar.model.outcome import Outcome

pytestmark = pytest.mark.anyio

BODY = "x" * 2000


def ctx(call_id: str) -> ToolContext:
    return ToolContext("s", "a", "m", call_id)


def outcome(call_id: str, body: str = BODY) -> Outcome:
    return Outcome(call_id=call_id, tool="t", status="completed", content=(TextContent(body),))


async def record_many(log: SqliteOutcomeLog, ids: list[str]) -> None:
    await asyncio.gather(*(log.record("loc", outcome(i), ctx(i)) for i in ids))


async def test_after_a_burst_the_wal_is_truncated_under_its_cap_once_the_writer_idles(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    cap = 64 * 1024
    log = await SqliteOutcomeLog.open(path, wal_cap_bytes=cap, idle_seconds=2)
    gate = threading.Event()
    try:
        busy = asyncio.ensure_future(log._run(gate.wait, inline=False))
        await asyncio.sleep(0.05)  # the writer waits at the gate; the burst queues up behind it
        burst = asyncio.ensure_future(record_many(log, [f"c{i}" for i in range(200)]))
        await asyncio.sleep(0.05)
        gate.set()
        await busy
        await burst
        # read by the writer thread itself, right after the burst's commit
        after_burst = await log._run(lambda: file_size(wal_path(path)))
        assert after_burst > 200 * len(BODY) > cap
        deadline = time.monotonic() + 60
        while (stats := await log.stats()).wal_truncations < 1:
            assert time.monotonic() < deadline, "the WAL was never truncated"
            await asyncio.sleep(0.02)
        assert stats.disk_bytes["outcomes_wal"] <= cap
        assert stats.outcomes == 200
        assert (await log.get("loc", "c199")).content == (TextContent(BODY),)
    finally:
        gate.set()
        await log.aclose()
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        assert db.execute("SELECT count(*) FROM outcomes").fetchone()[0] == 200


async def test_under_steady_load_the_wal_is_truncated_between_batches_when_over_its_cap(tmp_path):
    """No idle moment at all (idle_seconds is an hour): the cap still holds, because a WAL over
    the cap gets a PASSIVE checkpoint (well before `CHECKPOINT_EVERY` records), after which the
    writer truncates it between two batches."""
    path = tmp_path / "outcomes.sqlite"
    cap = 64 * 1024
    log = await SqliteOutcomeLog.open(path, wal_cap_bytes=cap, idle_seconds=3600)
    written = batch = 0
    # Batches back to back for up to 30 s: rows commit 100 ms of them at a time, so a run
    # must span several commits (10,000 records once took longer only because the start
    # journal rewrote itself at every line, until 2026-12-07).
    deadline = time.monotonic() + 30
    try:
        while time.monotonic() < deadline:
            await record_many(log, [f"c{batch}-{i}" for i in range(50)])
            written += 50 * len(BODY)
            batch += 1
            if (await log.stats()).wal_truncations:
                break
        stats = await log.stats()
        assert stats.wal_truncations >= 1, f"no truncation after {batch * 50:,} records"
        assert stats.wal_checkpoints >= 1
        assert stats.disk_bytes["outcomes_wal"] < written
    finally:
        await log.aclose()


async def test_a_pruned_call_id_replays_as_expired_also_after_reopening(tmp_path):
    path = tmp_path / "outcomes.sqlite"
    log = await SqliteOutcomeLog.open(path, retention_seconds=7 * 86400)
    try:
        await record_many(log, ["old-1", "old-2"])
        cutoff = time.time() + 1
        await log.record("loc", outcome("young"), ctx("young"))
        await log._run(lambda: log._db().execute(
            "UPDATE outcomes SET created_at = ? WHERE call_id = 'young'", (cutoff + 60,)))
        assert await log.prune(cutoff) == 2
        expired = await log.get("loc", "old-1")
        assert expired is not None and expired.replayed and expired.status == "error"
        assert expired.error is not None and expired.error.kind is ErrorKind.EXPIRED
        assert expired.error.kind.model_visible
        assert "pruned after the retention period (7 d)" in expired.error.message
        assert "was not run again" in expired.error.message
        assert expired.tool == "t" and expired.call_id == "old-1"
        assert (await log.get("loc", "young")).content == (TextContent(BODY),)
        assert await log.get("loc", "never") is None
        stats = await log.stats()
        assert (stats.outcomes, stats.expired, stats.pruned) == (1, 2, 2)
    finally:
        await log.aclose()
    reopened = await SqliteOutcomeLog.open(path)
    try:
        again = await reopened.get("loc", "old-2")
        assert again is not None and again.error is not None
        assert again.error.kind is ErrorKind.EXPIRED
        assert await reopened.get("other-location", "old-2") is None
        assert ((await reopened.stats()).outcomes, (await reopened.stats()).expired) == (1, 2)
    finally:
        await reopened.aclose()


async def test_pruning_runs_in_batches_on_the_writer_thread_and_never_blocks_the_loop(tmp_path):
    # a batch time target this generous keeps every batch at `prune_batch` rows
    log = await SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite", prune_batch=10,
                                      prune_batch_seconds=3600)
    batches: list[tuple[str, int, int]] = []  # thread, rows pruned, "new" committed yet
    original = log._prune_batch_sync

    def counted(cutoff: float, limit: int) -> tuple[int, float]:
        pruned, took = original(cutoff, limit)
        new = log._db().execute("SELECT count(*) FROM outcomes WHERE call_id='new'").fetchone()
        batches.append((threading.current_thread().name, pruned, new[0]))
        return pruned, took

    log._prune_batch_sync = counted  # type: ignore[method-assign]
    gate = threading.Event()
    ticks = 0
    stop = asyncio.Event()

    async def ticker() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            await asyncio.sleep(0)

    try:
        await record_many(log, [f"old-{i}" for i in range(55)])
        cutoff = time.time()
        busy = asyncio.ensure_future(log._run(gate.wait, inline=False))
        await asyncio.sleep(0.05)  # the writer waits at the gate
        pruning = asyncio.ensure_future(log.prune(cutoff))
        await asyncio.sleep(0.05)  # the first batch is queued behind the gate...
        newer = asyncio.ensure_future(log.record("loc", outcome("new"), ctx("new")))
        await asyncio.sleep(0.05)  # ...and this call right behind it
        assert newer.done()  # journaled: it waited for neither the batch nor the prune
        tick_task = asyncio.ensure_future(ticker())
        gate.set()
        await busy
        await newer
        assert await pruning == 55
        stop.set()
        await tick_task
    finally:
        gate.set()
        await log.aclose()
    assert [n for _, n, _ in batches] == [10, 10, 10, 10, 10, 5]
    # the call's row, gathered behind the gate, was committed before the first batch ran
    assert [new for _, _, new in batches] == [1, 1, 1, 1, 1, 1]
    assert {name for name, _, _ in batches} == {"outcome-log"}  # the writer thread, not the loop
    assert ticks > len(batches)  # the loop kept running between the batches


async def test_the_log_prunes_on_its_own_with_a_short_retention(tmp_path):
    log = await SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite", retention_seconds=0.2,
                                      prune_interval=0.05)
    try:
        await log.record("loc", outcome("c1"), ctx("c1"))
        expired: list[Outcome | None] = [None]

        async def poll() -> None:
            deadline = time.monotonic() + 60
            while True:
                found = await log.get("loc", "c1")
                if found is not None and found.error is not None:
                    expired[0] = found
                    return
                assert time.monotonic() < deadline, "never pruned"
                await asyncio.sleep(0.05)

        await poll()
        assert expired[0] is not None and expired[0].error is not None
        assert expired[0].error.kind is ErrorKind.EXPIRED
        assert (await log.stats()).pruned == 1
    finally:
        await log.aclose()


class EchoIn(BaseModel):
    text: str


async def test_the_seam_answers_a_pruned_call_id_with_expired_and_does_not_run_it(tmp_path: Path):
    runs = 0

    async def run(args: EchoIn, context: ToolContext) -> str:
        nonlocal runs
        runs += 1
        return args.text

    echo = Tool(description="Echo", input=EchoIn, output={"type": "string"}, execute=run)
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        async with location.tools.register({"echo": echo}):
            snapshot = location.snapshot()
            first = await snapshot.execute("echo", {"text": "hi"}, ToolContext("s", "a", "m", "c1"))
            assert first.status == "completed" and runs == 1
            assert location.seam.outcomes is not None
            assert await location.seam.outcomes.prune(time.time() + 1) == 1
            again = await snapshot.execute("echo", {"text": "hi"}, ToolContext("s", "a", "m", "c1"))
            assert runs == 1  # never run again silently
            assert again.status == "error" and again.replayed
            assert again.error is not None and again.error.kind is ErrorKind.EXPIRED
            stored = await location.outcome("c1")
            assert stored is not None and stored.error is not None
            assert stored.error.kind is ErrorKind.EXPIRED


async def test_pruning_batches_shrink_while_they_take_longer_than_their_target(tmp_path):
    """A target of zero seconds: every full batch is too long, so the next one is half as big,
    down to one row, and the prune still removes everything."""
    log = await SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite", prune_batch=16,
                                      prune_batch_seconds=0.0)
    sizes: list[int] = []
    original = log._prune_batch_sync

    def recorded(cutoff: float, limit: int) -> tuple[int, float]:
        sizes.append(limit)
        return original(cutoff, limit)

    log._prune_batch_sync = recorded  # type: ignore[method-assign]
    try:
        await record_many(log, [f"old-{i}" for i in range(40)])
        assert await log.prune(time.time() + 1) == 40
        assert (await log.stats()).outcomes == 0
    finally:
        await log.aclose()
    assert sizes[:5] == [16, 8, 4, 2, 1]
    assert set(sizes[5:]) == {1}

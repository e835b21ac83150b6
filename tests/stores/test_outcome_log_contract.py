"""`OutcomeLog` contract: one durable outcome per (Location, call id), idempotent, fingerprinted,
surviving a restart, pruned to tombstones that replay as `expired`; `claim` before a call runs
answers the stored outcome or lets this process run it (`release` gives the claim back)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.backends.postgres.outcome_log import PostgresOutcomeLog
from sidecar.backends.sqlite.outcome_log import SqliteOutcomeLog
from sidecar.model.content import TextContent
from sidecar.model.errors import CallError, CallIdConflict, ErrorKind
from sidecar.model.outcome import Outcome
from sidecar.model.replica import replica_id
from sidecar.model.tool import ToolContext
from sidecar.stores.outcome_log import OutcomeLog
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenLog = Callable[[], Awaitable[OutcomeLog]]


async def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> OpenLog:
    return lambda: SqliteOutcomeLog.open(tmp_path / "outcomes.sqlite")


async def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> OpenLog:
    """A fresh database on the session's real PostgreSQL server (tests/fleet/postgres.py)."""
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()
    return lambda: PostgresOutcomeLog.open(dsn)


IMPLEMENTATIONS = [pytest.param(_sqlite, id="sqlite"), pytest.param(_postgres, id="postgres")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_log(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenLog]:
    """Opens the same log anew on each call; every log opened is closed at the end."""
    make = await request.param(tmp_path, request)
    opened: list[OutcomeLog] = []

    async def open_one() -> OutcomeLog:
        log = await make()
        opened.append(log)
        return log

    yield open_one
    for log in opened:
        await log.aclose()


def completed(call_id: str, text: str, tool: str = "echo") -> Outcome:
    return Outcome(call_id=call_id, tool=tool, status="completed", content=(TextContent(text),))


def context(call_id: str, session: str = "s1") -> ToolContext:
    return ToolContext(session_id=session, agent="a", message_id="m", call_id=call_id)


async def test_record_then_get_returns_the_stored_representation(open_log: OpenLog) -> None:
    log = await open_log()
    stored = await log.record("loc", completed("c1", "hello"), context("c1"))
    assert stored.content == (TextContent("hello"),) and stored.status == "completed"
    got = await log.get("loc", "c1")
    assert got is not None
    assert (got.call_id, got.tool, got.status, got.content) == ("c1", "echo", "completed",
                                                                 (TextContent("hello"),))
    assert got.replayed


async def test_an_unknown_call_id_is_none(open_log: OpenLog) -> None:
    log = await open_log()
    assert await log.get("loc", "never-ran") is None


async def test_recording_a_settled_call_again_keeps_the_first_outcome(open_log: OpenLog) -> None:
    log = await open_log()
    await log.record("loc", completed("c1", "first"), context("c1"), "fp")
    second = await log.record("loc", completed("c1", "second"), context("c1"), "fp")
    assert second.content == (TextContent("first"),)
    got = await log.get("loc", "c1", "fp")
    assert got is not None and got.content == (TextContent("first"),)


async def test_another_call_under_a_used_id_conflicts(open_log: OpenLog) -> None:
    log = await open_log()
    await log.record("loc", completed("c1", "first"), context("c1"), "fingerprint-a")
    with pytest.raises(CallIdConflict):
        await log.get("loc", "c1", "fingerprint-b")
    with pytest.raises(CallIdConflict):
        await log.record("loc", completed("c1", "other"), context("c1"), "fingerprint-b")
    got = await log.get("loc", "c1", "fingerprint-a")
    assert got is not None and got.content == (TextContent("first"),)


async def test_locations_do_not_share_call_ids(open_log: OpenLog) -> None:
    log = await open_log()
    await log.record("loc-a", completed("c1", "in a"), context("c1"))
    assert await log.get("loc-b", "c1") is None
    await log.record("loc-b", completed("c1", "in b"), context("c1"))
    a, b = await log.get("loc-a", "c1"), await log.get("loc-b", "c1")
    assert a is not None and b is not None
    assert (a.content, b.content) == ((TextContent("in a"),), (TextContent("in b"),))


async def test_an_error_outcome_keeps_its_error_and_partial(open_log: OpenLog) -> None:
    log = await open_log()
    failed = Outcome.failed("c9", "echo", CallError(ErrorKind.TOOL_FAILURE, "it broke"),
                            {"text": "half", "omitted_bytes": 10})
    await log.record("loc", failed, context("c9"))
    got = await log.get("loc", "c9")
    assert got is not None and got.status == "error" and got.error is not None
    assert (got.error.kind, got.error.message) == (ErrorKind.TOOL_FAILURE, "it broke")
    assert got.partial == {"text": "half", "omitted_bytes": 10}


async def test_outcomes_survive_a_restart(open_log: OpenLog) -> None:
    log = await open_log()
    for i in range(20):
        await log.record("loc", completed(f"c{i}", f"text {i}"), context(f"c{i}"))
    await log.aclose()
    reopened = await open_log()
    for i in range(20):
        got = await reopened.get("loc", f"c{i}")
        assert got is not None and got.content == (TextContent(f"text {i}"),)


async def test_pruned_outcomes_replay_as_expired_and_never_run_again(
    open_log: OpenLog,
) -> None:
    log = await open_log()
    await log.record("loc", completed("old", "x"), context("old"))
    assert await log.prune(time.time() + 1) == 1
    got = await log.get("loc", "old")
    assert got is not None and got.status == "error" and got.error is not None
    assert got.error.kind is ErrorKind.EXPIRED
    stats = await log.stats()
    assert (stats.outcomes, stats.expired) == (0, 1)
    assert await log.prune(time.time() + 1) == 0


async def test_stats_count_what_is_stored(open_log: OpenLog) -> None:
    log = await open_log()
    assert (await log.stats()).outcomes == 0
    for i in range(3):
        await log.record("loc", completed(f"c{i}", "x"), context(f"c{i}"))
    await log.record("loc", completed("c0", "again"), context("c0"))  # no second row
    assert (await log.stats()).outcomes == 3


async def test_pruning_keeps_what_settled_after_the_cutoff(open_log: OpenLog) -> None:
    log = await open_log()
    await log.record("loc", completed("old", "x"), context("old"))
    cutoff = time.time()
    await asyncio.sleep(0.01)  # the next record settles after the cutoff
    await log.record("loc", completed("young", "y"), context("young"))
    assert await log.prune(cutoff) == 1
    young = await log.get("loc", "young")
    assert young is not None and young.content == (TextContent("y"),)
    assert (await log.stats()).pruned == 1


async def test_a_pruned_call_id_still_replays_as_expired_after_a_restart(
    open_log: OpenLog,
) -> None:
    log = await open_log()
    await log.record("loc", completed("old", "x", tool="t"), context("old"))
    assert await log.prune(time.time() + 1) == 1
    await log.aclose()
    reopened = await open_log()
    got = await reopened.get("loc", "old")
    assert got is not None and got.error is not None and got.error.kind is ErrorKind.EXPIRED
    assert got.tool == "t" and got.replayed
    assert await reopened.get("other-location", "old") is None
    assert (await reopened.stats()).expired == 1


async def test_claim_lets_a_new_call_run_and_replays_a_settled_one(open_log: OpenLog) -> None:
    log = await open_log()
    assert await log.claim("loc", "c1", "fp") is None  # nothing stored: this process runs it
    await log.record("loc", completed("c1", "ran once"), context("c1"), "fp")
    replay = await log.claim("loc", "c1", "fp")
    assert replay is not None and replay.replayed
    assert replay.content == (TextContent("ran once"),)
    with pytest.raises(CallIdConflict):
        await log.claim("loc", "c1", "another call")


async def test_holder_names_the_replica_running_a_call(open_log: OpenLog) -> None:
    """A log with claims names the claiming replica until the call settles or is released;
    a log one process owns keeps no claims and names none."""
    log = await open_log()
    claims = not isinstance(log, SqliteOutcomeLog)
    assert await log.holder("loc", "c1") is None
    assert await log.claim("loc", "c1", "fp") is None
    assert await log.holder("loc", "c1") == (replica_id() if claims else None)
    await log.record("loc", completed("c1", "done"), context("c1"), "fp")
    assert await log.holder("loc", "c1") is None
    assert await log.claim("loc", "c2", "fp") is None
    await log.release("loc", "c2")
    assert await log.holder("loc", "c2") is None


async def test_a_released_claim_can_be_claimed_again(open_log: OpenLog) -> None:
    log = await open_log()
    assert await log.claim("loc", "c1", "fp") is None
    await log.release("loc", "c1")  # the call was cancelled before it settled
    assert await log.claim("loc", "c1", "fp") is None
    await log.record("loc", completed("c1", "second attempt"), context("c1"), "fp")
    got = await log.get("loc", "c1", "fp")
    assert got is not None and got.content == (TextContent("second attempt"),)


async def test_claim_replays_a_pruned_call_as_expired(open_log: OpenLog) -> None:
    log = await open_log()
    assert await log.claim("loc", "old", "fp") is None
    await log.record("loc", completed("old", "x"), context("old"), "fp")
    assert await log.prune(time.time() + 1) == 1
    got = await log.claim("loc", "old", "fp")
    assert got is not None and got.error is not None and got.error.kind is ErrorKind.EXPIRED

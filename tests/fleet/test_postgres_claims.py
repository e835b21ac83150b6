"""In-flight claims on PostgreSQL (`sidecar.backends.postgres.claims`): two outcome logs on one real
database stand for two replicas (tests/fleet/postgres.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from sidecar import Location, Tool, ToolFailure, ToolResponse
from sidecar.backends.postgres.claims import CHANNEL, claim_key
from sidecar.backends.postgres.outcome_log import PostgresOutcomeLog
from sidecar.execution.seam import Seam
from sidecar.model.content import TextContent
from sidecar.model.errors import CallIdConflict, ErrorKind
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.outcome_log import OutcomeLogError
from tests.fleet.postgres import INTERNAL_CLIENT_ERROR, FailsOnce, PostgresServer

pytestmark = pytest.mark.anyio


def completed(call_id: str, text: str) -> Outcome:
    return Outcome(call_id=call_id, tool="echo", status="completed", content=(TextContent(text),))


def ctx(call_id: str) -> ToolContext:
    return ToolContext(session_id="s", agent="a", message_id="m", call_id=call_id)


@pytest.fixture
async def dsn(postgres_server: PostgresServer) -> str:
    return await postgres_server.new_database()


@pytest.fixture
async def replicas(dsn: str) -> AsyncIterator[tuple[PostgresOutcomeLog, PostgresOutcomeLog]]:
    """Replicas "a" and "b"; a claim lives 60 s, so only a notification, a poll or an
    expiry the test makes can end a wait."""
    a = await PostgresOutcomeLog.open(dsn, replica="a", claim_ttl=60)
    b = await PostgresOutcomeLog.open(dsn, replica="b", claim_ttl=60)
    yield a, b
    await a.aclose()
    await b.aclose()


async def claim_rows(dsn: str) -> list[dict[str, Any]]:
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch("SELECT location, call_id, fingerprint, replica, claimed_at, "
                                "expires_at FROM sidecar_claims ORDER BY call_id")
    finally:
        await conn.close()
    return [dict(r) for r in rows]


async def waiting(log: PostgresOutcomeLog, task: asyncio.Task[Any]) -> None:
    """Until `task` (a duplicate's `claim` on `log`) waits for a notification."""
    while not log.claims._waiting and not task.done():  # noqa: ASYNC110
        await asyncio.sleep(0.01)
    assert not task.done(), task


async def test_a_duplicate_on_another_replica_waits_and_replays(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    assert await a.claim("loc", "c1", "fp") is None  # a runs the call
    assert [(r["replica"], r["fingerprint"]) for r in await claim_rows(dsn)] == [("a", "fp")]
    duplicate = asyncio.create_task(b.claim("loc", "c1", "fp"))
    await waiting(b, duplicate)
    await a.record("loc", completed("c1", "ran on a"), ctx("c1"), "fp")
    replayed = await duplicate
    assert replayed is not None and replayed.replayed
    assert replayed.content == (TextContent("ran on a"),)
    assert await claim_rows(dsn) == []  # deleted with the outcome
    assert a.claims.live == frozenset() and b.claims.live == frozenset()


async def test_another_call_under_a_claimed_id_conflicts_at_once(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog],
) -> None:
    a, b = replicas
    assert await a.claim("loc", "c1", "fingerprint-a") is None
    with pytest.raises(CallIdConflict):
        await b.claim("loc", "c1", "fingerprint-b")
    assert await b.claim("other-location", "c1", "fingerprint-b") is None


async def test_a_released_claim_lets_the_waiting_duplicate_run_the_call(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    assert await a.claim("loc", "c1", "fp") is None
    duplicate = asyncio.create_task(b.claim("loc", "c1", "fp"))
    await waiting(b, duplicate)
    await a.release("loc", "c1")  # a's call was cancelled before it settled
    assert await duplicate is None  # b runs it now
    assert [r["replica"] for r in await claim_rows(dsn)] == ["b"]


async def test_a_waiting_duplicate_can_be_cancelled(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    assert await a.claim("loc", "c1", "fp") is None
    duplicate = asyncio.create_task(b.claim("loc", "c1", "fp"))
    await waiting(b, duplicate)
    duplicate.cancel()
    with pytest.raises(asyncio.CancelledError):
        await duplicate
    assert b.claims._waiting == {}
    assert [r["replica"] for r in await claim_rows(dsn)] == ["a"]  # a's claim untouched


async def test_the_expired_claim_of_a_dead_replica_is_taken_over(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    _, b = replicas
    conn = await asyncpg.connect(dsn)
    try:  # what a replica killed mid-call leaves: a claim nobody renews
        await conn.execute(
            "INSERT INTO sidecar_claims VALUES ('loc', 'c1', 'fp', 'dead', now(), "
            "now() + interval '300 milliseconds')")
    finally:
        await conn.close()
    assert await b.claim("loc", "c1", "fp") is None  # after the expiry, b runs it
    assert b.claims.taken_over == 1
    assert [r["replica"] for r in await claim_rows(dsn)] == ["b"]
    await b.record("loc", completed("c1", "ran on b"), ctx("c1"), "fp")
    assert await claim_rows(dsn) == []


async def test_claims_left_expired_by_dead_replicas_are_swept(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    a = await PostgresOutcomeLog.open(dsn, replica="a", claim_ttl=0.6)
    try:
        await conn.execute(  # a dead replica's call that nobody retried
            "INSERT INTO sidecar_claims VALUES ('loc', 'c1', 'fp', 'dead', now(), "
            "now() - interval '1 hour')")
        assert await a.claim("loc", "c2", "fp") is None  # a live claim stays
        while len(await claim_rows(dsn)) == 2:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # the sweep runs every 3 TTLs
        assert [(r["call_id"], r["replica"]) for r in await claim_rows(dsn)] == [("c2", "a")]
    finally:
        await a.aclose()
        await conn.close()


async def test_live_claims_are_renewed(dsn: str) -> None:
    a = await PostgresOutcomeLog.open(dsn, replica="a", claim_ttl=0.6)
    try:
        assert await a.claim("loc", "c1", "fp") is None
        [first] = await claim_rows(dsn)
        while (await claim_rows(dsn))[0]["expires_at"] == first["expires_at"]:  # noqa: ASYNC110
            await asyncio.sleep(0.05)  # the renewal runs every TTL/3
        [renewed] = await claim_rows(dsn)
        assert renewed["replica"] == "a" and renewed["claimed_at"] == first["claimed_at"]
        assert renewed["expires_at"] > first["expires_at"]
    finally:
        await a.aclose()
    assert await claim_rows(dsn) == []  # closing releases the claims of calls still running


@pytest.mark.parametrize("error", [INTERNAL_CLIENT_ERROR, RuntimeError("unforeseen")],
                         ids=["InternalClientError", "RuntimeError"])
async def test_the_renewal_outlives_an_error_of_its_statement(
    dsn: str, error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    """A renewal that dies stops renewing every running call's claim, silently, and another
    replica would run those calls again once they expire: it logs the error and goes on."""
    a = await PostgresOutcomeLog.open(dsn, replica="a", claim_ttl=0.6)
    try:
        assert await a.claim("loc", "c1", "fp") is None
        a.claims._pool = failing = FailsOnce(a.claims._pool, error)
        deadline = time.monotonic() + 30
        while not failing.spent:
            assert time.monotonic() < deadline, "the renewal never ran"
            await asyncio.sleep(0.02)
        [after_error] = await claim_rows(dsn)
        while (await claim_rows(dsn))[0]["expires_at"] == after_error["expires_at"]:
            assert time.monotonic() < deadline, "no renewal after the error"
            await asyncio.sleep(0.05)
        assert "renewing this replica's claims failed" in caplog.text
    finally:
        await a.aclose()


async def test_the_same_call_on_both_replicas_runs_once(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    runs: dict[str, list[str]] = {}

    async def call(log: PostgresOutcomeLog, name: str, call_id: str) -> Outcome:
        stored = await log.claim("loc", call_id, "fp")
        if stored is not None:
            return stored
        runs.setdefault(call_id, []).append(name)
        await asyncio.sleep(0)
        return await log.record("loc", completed(call_id, f"ran on {name}"), ctx(call_id), "fp")

    for i in range(30):
        first, second = await asyncio.gather(call(a, "a", f"c{i}"), call(b, "b", f"c{i}"))
        assert first.content == second.content
        assert sorted((first.replayed, second.replayed)) == [False, True]
    assert all(len(ran) == 1 for ran in runs.values()) and len(runs) == 30
    assert await claim_rows(dsn) == []


# --- through the seam: two seams on one database, each with its replica's log -------------


async def test_a_cancelled_call_lets_the_other_replica_run_it_at_once(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str, tmp_path: Path,
) -> None:
    a, b = replicas
    started: list[str] = []
    proceed = asyncio.Event()

    async def run(args: dict[str, Any], context: Any) -> ToolResponse:
        started.append(context.call_id)
        await proceed.wait()
        return ToolResponse(content=[{"type": "text", "text": args["text"]}])

    tool = Tool(description="Wait, then echo", execute=run, input={
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]})
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        seam_a = Seam(store=location.seam.store, outcomes=a)
        seam_b = Seam(store=location.seam.store, outcomes=b)
        async with location.tools.register({"wait": tool}):
            snapshot = location.snapshot()
            on_a = asyncio.create_task(seam_a.execute(snapshot, "wait", {"text": "t"}, ctx("c1")))
            while not started:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            on_b = asyncio.create_task(seam_b.execute(snapshot, "wait", {"text": "t"}, ctx("c1")))
            await waiting(b, on_b)
            assert started == ["c1"]  # b waits for a's run
            on_a.cancel()  # a's client went away: its claim is released, b runs the call
            with pytest.raises(asyncio.CancelledError):
                await on_a
            while len(started) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            proceed.set()
            outcome = await on_b
    assert outcome.status == "completed" and not outcome.replayed
    assert outcome.content == (TextContent("t"),)
    assert await claim_rows(dsn) == []


async def test_a_duplicate_waits_no_longer_than_the_first_run_and_its_timeout(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], tmp_path: Path,
) -> None:
    a, b = replicas
    started: list[str] = []
    deadline = asyncio.Event()

    async def run(args: dict[str, Any], context: Any) -> ToolResponse:
        started.append(context.call_id)
        await deadline.wait()  # the tool's own timeout, as a bridge reports it
        raise ToolFailure("no answer within 600 s (timeouts.call)", kind=ErrorKind.TIMEOUT)

    tool = Tool(description="Time out", execute=run, input={"type": "object"})
    async with Location.open(tmp_path, state_dir=tmp_path / "state") as location:
        seam_a = Seam(store=location.seam.store, outcomes=a)
        seam_b = Seam(store=location.seam.store, outcomes=b)
        async with location.tools.register({"slow": tool}):
            snapshot = location.snapshot()
            on_a = asyncio.create_task(seam_a.execute(snapshot, "slow", {}, ctx("c1")))
            while not started:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
            on_b = asyncio.create_task(seam_b.execute(snapshot, "slow", {}, ctx("c1")))
            await waiting(b, on_b)
            deadline.set()
            first, duplicate = await on_a, await on_b
    assert started == ["c1"]
    assert first.error is not None and first.error.kind is ErrorKind.TIMEOUT
    assert duplicate.replayed and duplicate.error == first.error


# --- what a call sends PostgreSQL: group commit, and NOTIFY only for a waiting duplicate ---


async def test_a_settle_notifies_only_when_a_duplicate_waits(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    heard: list[str] = []
    marker = asyncio.Event()

    def notified(_conn: Any, _pid: int, _channel: str, payload: str) -> None:
        heard.append(payload)
        if payload == "marker":
            marker.set()

    listener = await asyncpg.connect(dsn)
    try:
        await listener.add_listener(CHANNEL, notified)
        assert await a.claim("loc", "alone", "fp") is None  # nobody waits for these two
        await a.record("loc", completed("alone", "ran"), ctx("alone"), "fp")
        assert await a.claim("loc", "given-back", "fp") is None
        await a.release("loc", "given-back")
        assert await a.claim("loc", "awaited", "fp") is None
        duplicate = asyncio.create_task(b.claim("loc", "awaited", "fp"))
        while not await listener.fetchval(  # noqa: ASYNC110
                "SELECT waited FROM sidecar_claims WHERE call_id = 'awaited'"):
            await asyncio.sleep(0.01)  # b listens, then marks the claim it waits for
        await a.record("loc", completed("awaited", "ran on a"), ctx("awaited"), "fp")
        replayed = await duplicate
        assert replayed is not None and replayed.replayed
        # Notifications arrive in commit order: had the first settle or the release
        # notified, their payloads would come before this one.
        await listener.execute("SELECT pg_notify($1, 'marker')", CHANNEL)
        await marker.wait()
        assert heard == [claim_key("loc", "awaited"), "marker"]
    finally:
        await listener.close()


async def test_calls_claimed_and_recorded_at_once_share_one_statement(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, b = replicas
    ids = [f"c{i:02}" for i in range(16)]
    assert await asyncio.gather(*(a.claim("loc", i, "fp") for i in ids)) == [None] * 16
    assert (a.claims._batcher.batches, a.claims._batcher.requests) == (1, 16)
    assert [(r["call_id"], r["replica"]) for r in await claim_rows(dsn)] == [
        (i, "a") for i in ids]
    recorded = await asyncio.gather(
        *(a.record("loc", completed(i, f"ran {i}"), ctx(i), "fp") for i in ids))
    assert [o.content for o in recorded] == [(TextContent(f"ran {i}"),) for i in ids]
    assert (a._settles.batches, a._settles.requests) == (1, 16)
    assert await claim_rows(dsn) == []
    replays = await asyncio.gather(*(b.claim("loc", i, "fp") for i in ids))
    assert [(o.replayed, o.content) for o in replays if o is not None] == [
        (True, (TextContent(f"ran {i}"),)) for i in ids]


async def test_a_call_the_database_refuses_fails_alone_in_its_batch(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, _ = replicas
    ids = ["c1", "c2", "nul\x00byte", "c4"]  # PostgreSQL text cannot hold a NUL
    claimed = await asyncio.gather(*(a.claim("loc", i, "fp") for i in ids),
                                   return_exceptions=True)
    assert claimed[:2] == [None, None] and claimed[3] is None
    assert isinstance(claimed[2], OutcomeLogError) and "nul" in str(claimed[2])
    assert a.claims._batcher.batches == 1 + 4  # the batch, then each claim alone
    assert [r["call_id"] for r in await claim_rows(dsn)] == ["c1", "c2", "c4"]
    recorded = await asyncio.gather(
        *(a.record("loc", completed(i, "ran"), ctx(i), "fp") for i in ids),
        return_exceptions=True)
    assert isinstance(recorded[2], OutcomeLogError)
    assert all(isinstance(o, Outcome) and not o.replayed
               for n, o in enumerate(recorded) if n != 2)
    assert await claim_rows(dsn) == []


async def test_a_claim_cancelled_while_its_statement_runs_is_given_back(
    replicas: tuple[PostgresOutcomeLog, PostgresOutcomeLog], dsn: str,
) -> None:
    a, _ = replicas
    blocker = await asyncpg.connect(dsn)
    try:
        lock = blocker.transaction()
        await lock.start()
        await blocker.execute("LOCK TABLE sidecar_claims IN EXCLUSIVE MODE")
        claim = asyncio.create_task(a.claim("loc", "c1", "fp"))
        while not await blocker.fetchval(  # noqa: ASYNC110
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND wait_event_type = 'Lock'"):
            await asyncio.sleep(0.01)  # the claim's statement waits for the table
        claim.cancel()
        with pytest.raises(asyncio.CancelledError):
            await claim
        await lock.rollback()  # the statement now takes the claim, for a caller that left
        while await claim_rows(dsn):  # noqa: ASYNC110
            await asyncio.sleep(0.01)  # ... and it is given back
        assert a.claims.live == frozenset()
    finally:
        await blocker.close()

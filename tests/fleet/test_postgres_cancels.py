"""Cancel requests between two replicas (two `PostgresCancels` on one real PostgreSQL
database, replica ids "a" and "b"): a request reaches the addressed replica and brings its
answer back, through LISTEN/NOTIFY and, when notifications are lost, through polling; a
request nobody answers ends after its wait and leaves no row; Locations stay apart."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import asyncpg
import pytest

from sidecar.backends.postgres.cancels import PostgresCancels
from sidecar.backends.postgres.pool import open_pool
from tests.fleet.postgres import FailsOnce, PostgresServer

pytestmark = pytest.mark.anyio


@dataclass
class Replica:
    cancels: PostgresCancels
    asked: list[str] = field(default_factory=list)
    running: set[str] = field(default_factory=set)

    async def cancel_here(self, call_id: str) -> str:
        self.asked.append(call_id)
        return "cancelling" if call_id in self.running else "not_running"


@dataclass
class Fleet:
    pool: asyncpg.Pool
    opened: list[PostgresCancels] = field(default_factory=list)

    async def replica(self, name: str, location: str = "default") -> Replica:
        cancels = await PostgresCancels.on_pool(self.pool, location, poll_interval=0.2,
                                                replica=name)
        self.opened.append(cancels)
        replica = Replica(cancels)
        await cancels.start(replica.cancel_here)
        return replica

    async def rows(self) -> int:
        return int(await self.pool.fetchval("SELECT count(*) FROM sidecar_cancels"))


@pytest.fixture
async def fleet(postgres_server: PostgresServer) -> AsyncIterator[Fleet]:
    pool = await open_pool(await postgres_server.new_database(), max_size=8)
    fleet = Fleet(pool)
    try:
        yield fleet
    finally:
        for cancels in fleet.opened:
            await cancels.aclose()
        await pool.close()


async def test_a_request_reaches_the_replica_it_names_and_brings_its_answer(
    fleet: Fleet,
) -> None:
    a, b = await fleet.replica("a"), await fleet.replica("b")
    a.running.add("c1")
    assert await b.cancels.request("c1", "a", wait=30) == "cancelling"
    assert await b.cancels.request("c2", "a", wait=30) == "not_running"
    assert a.asked == ["c1", "c2"] and b.asked == []
    assert await fleet.rows() == 0


async def test_lost_notifications_are_made_up_for_by_polling(fleet: Fleet) -> None:
    a, b = await fleet.replica("a"), await fleet.replica("b")
    a.running.add("c1")
    await a.cancels._listening.stop()  # a hears no NOTIFY: it finds the request by polling
    assert await b.cancels.request("c1", "a", wait=30) == "cancelling"
    assert a.asked == ["c1"]


async def test_the_poll_outlives_an_error_of_its_statement(
    fleet: Fleet, caplog: pytest.LogCaptureFixture
) -> None:
    """A's loop reading its cancel requests meets an unforeseen error: it logs it and goes
    on, and B's request is answered (a dead loop would leave every request to A unanswered)."""
    a, b = await fleet.replica("a"), await fleet.replica("b")
    a.running.add("c1")
    a.cancels._pool = FailsOnce(a.cancels._pool, RuntimeError("unforeseen"))
    assert await b.cancels.request("c1", "a", wait=30) == "cancelling"
    assert a.cancels._pool.spent and a.asked == ["c1"]
    assert "reading the cancel requests for this replica failed" in caplog.text


async def test_a_request_nobody_answers_ends_after_its_wait(fleet: Fleet) -> None:
    b = await fleet.replica("b")
    assert await b.cancels.request("c1", "gone", wait=0.5) is None
    assert await fleet.rows() == 0
    assert b.asked == []


async def test_a_cancelled_request_withdraws_its_row(fleet: Fleet) -> None:
    b = await fleet.replica("b")
    waiting = asyncio.create_task(b.cancels.request("c1", "gone", wait=60))
    for _ in range(1000):  # a hang guard: the row is written at once
        if await fleet.rows():
            break
        await asyncio.sleep(0.02)
    waiting.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiting
    assert await fleet.rows() == 0


async def test_a_request_cancelled_while_its_row_is_written_leaves_no_row(
        fleet: Fleet) -> None:
    """The row is committed, but the client is cancelled before the INSERT's answer reaches
    it (CI saw this window): the row is withdrawn once it has landed."""
    b = await fleet.replica("b")
    async with fleet.pool.acquire() as holder:
        locked = holder.transaction()
        await locked.start()
        await holder.execute("LOCK TABLE sidecar_cancels IN EXCLUSIVE MODE")  # holds the INSERT
        waiting = asyncio.create_task(b.cancels.request("c1", "gone", wait=60))
        blocked = 0
        for _ in range(500):  # a hang guard: the INSERT waits for the lock at once
            blocked = await fleet.pool.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock'")
            if blocked:
                break
            await asyncio.sleep(0.02)
        assert blocked == 1
        waiting.cancel()
        await asyncio.sleep(0.2)
        assert not waiting.done()  # it waits for its row, to withdraw it
        await locked.rollback()  # the INSERT goes through now
    with pytest.raises(asyncio.CancelledError):
        await asyncio.wait_for(waiting, 30)
    assert await fleet.rows() == 0
    assert b.cancels._carried._running == set()


async def test_locations_on_one_database_stay_apart(fleet: Fleet) -> None:
    a_other = await fleet.replica("a", location="other")
    a, b = await fleet.replica("a"), await fleet.replica("b")
    a.running.add("c1")
    a_other.running.add("c1")
    assert await b.cancels.request("c1", "a", wait=30) == "cancelling"
    assert a.asked == ["c1"] and a_other.asked == []


async def test_restarts_racing_for_a_lost_listen_hold_one_connection(fleet: Fleet) -> None:
    """A replica's poll and a request can both find the LISTEN connection lost and restart
    it at once (`sidecar.backends.postgres.pool.Listening`): one connection listens, none is kept
    beside
    it (two restarts at once used to hold two, one never given back)."""
    import logging

    from sidecar.backends.postgres.pool import Listening

    listening = Listening(fleet.pool, "sidecar_test_restart", lambda *_: None, what="tests",
                          poll_interval=1.0, log=logging.getLogger("tests"))
    assert listening.lost  # not started
    await asyncio.gather(*(listening.restart() for _ in range(3)))
    assert not listening.lost
    assert fleet.pool.get_size() - fleet.pool.get_idle_size() == 1
    await listening.stop()
    assert fleet.pool.get_size() - fleet.pool.get_idle_size() == 0

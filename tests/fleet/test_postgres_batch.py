"""Group commit (`sidecar.backends.postgres.batch.Batcher`) on a real PostgreSQL: what each caller
gets,
cancellation, error isolation. The statement doubles integers given as text; a gate held by
the test keeps a batch in flight while the test acts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from sidecar.backends.postgres.batch import Batcher
from sidecar.backends.postgres.pool import open_pool
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

DOUBLE = """
SELECT x::int * 2 AS v FROM unnest($1::text[]) WITH ORDINALITY AS k(x, n) ORDER BY n
"""


class Doubler:
    """A batcher whose statements the test sees (`sent`) and holds (`gate`)."""

    def __init__(self, pool: Any) -> None:
        self.sent: list[list[str]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.abandoned: list[tuple[str, int]] = []
        self.batcher: Batcher[str, int] = Batcher(
            pool, self.send, key=lambda item: item.partition(":")[0], name="doubler",
            abandoned=lambda item, result: self.abandoned.append((item, result)))

    async def send(self, conn: Any, items: list[str]) -> list[int]:
        self.sent.append(list(items))
        await self.gate.wait()
        rows = await conn.fetch(DOUBLE, [item.partition(":")[2] or item for item in items])
        return [row["v"] for row in rows]

    async def in_flight(self, count: int) -> None:
        """Until `count` statements were sent."""
        while len(self.sent) < count:  # noqa: ASYNC110
            await asyncio.sleep(0.001)


@pytest.fixture
async def pool(postgres_server: PostgresServer) -> AsyncIterator[Any]:
    pool = await open_pool(await postgres_server.new_database(), min_size=1, max_size=3)
    yield pool
    await pool.close()


async def test_requests_made_at_once_go_together_and_each_gets_its_own(pool: Any) -> None:
    doubler = Doubler(pool)
    assert await doubler.batcher.submit("1") == 2  # alone: sent at once
    assert await asyncio.gather(*(doubler.batcher.submit(str(n)) for n in range(10))) == [
        2 * n for n in range(10)]
    assert doubler.sent == [["1"], [str(n) for n in range(10)]]
    await doubler.batcher.aclose()


async def test_requests_queued_during_a_batch_go_in_the_next(pool: Any) -> None:
    doubler = Doubler(pool)
    doubler.gate.clear()
    first = asyncio.create_task(doubler.batcher.submit("1"))
    await doubler.in_flight(1)
    later = [asyncio.create_task(doubler.batcher.submit(str(n))) for n in (2, 3, 4)]
    await asyncio.sleep(0)
    doubler.gate.set()
    assert [await first, *[await task for task in later]] == [2, 4, 6, 8]
    assert doubler.sent == [["1"], ["2", "3", "4"]]
    await doubler.batcher.aclose()


async def test_a_request_the_database_refuses_fails_alone(pool: Any) -> None:
    doubler = Doubler(pool)
    results = await asyncio.gather(*(doubler.batcher.submit(x) for x in ("1", "two", "3")),
                                   return_exceptions=True)
    assert results[0] == 2 and results[2] == 6
    assert isinstance(results[1], asyncpg.InvalidTextRepresentationError)
    assert doubler.sent == [["1", "two", "3"], ["1"], ["two"], ["3"]]
    await doubler.batcher.aclose()


async def test_a_caller_cancelled_in_flight_leaves_the_others_their_results(
        pool: Any) -> None:
    doubler = Doubler(pool)
    doubler.gate.clear()
    kept, cancelled = (asyncio.create_task(doubler.batcher.submit(x)) for x in ("5", "6"))
    await doubler.in_flight(1)
    cancelled.cancel()
    with pytest.raises(asyncio.CancelledError):
        await cancelled  # at once, while the statement still runs
    doubler.gate.set()
    assert await kept == 10
    assert doubler.abandoned == [("6", 12)]  # what the cancelled caller would have got
    await doubler.batcher.aclose()


async def test_a_caller_cancelled_as_its_answer_arrives_hands_the_answer_over(
        pool: Any) -> None:
    doubler = Doubler(pool)

    async def send(conn: Any, items: list[str]) -> list[int]:
        answers = await doubler.send(conn, items)
        # runs after the answer is set and before the caller runs again
        asyncio.get_running_loop().call_soon(caller.cancel)
        return answers

    doubler.batcher._send = send
    caller = asyncio.create_task(doubler.batcher.submit("7"))
    with pytest.raises(asyncio.CancelledError):
        await caller
    assert doubler.abandoned == [("7", 14)]
    await doubler.batcher.aclose()


async def test_a_caller_cancelled_while_queued_is_never_sent(pool: Any) -> None:
    doubler = Doubler(pool)
    doubler.gate.clear()
    first = asyncio.create_task(doubler.batcher.submit("1"))
    await doubler.in_flight(1)
    dropped, kept = (asyncio.create_task(doubler.batcher.submit(x)) for x in ("2", "3"))
    await asyncio.sleep(0)
    dropped.cancel()
    with pytest.raises(asyncio.CancelledError):
        await dropped
    doubler.gate.set()
    assert (await first, await kept) == (2, 6)
    assert doubler.sent == [["1"], ["3"]] and doubler.abandoned == []
    await doubler.batcher.aclose()


async def test_requests_for_one_row_never_share_a_statement(pool: Any) -> None:
    doubler = Doubler(pool)
    results = await asyncio.gather(
        *(doubler.batcher.submit(x) for x in ("a:1", "b:2", "a:3", "c:4", "a:5")))
    assert results == [2, 4, 6, 8, 10]
    assert doubler.sent == [["a:1", "b:2", "c:4"], ["a:3"], ["a:5"]]
    await doubler.batcher.aclose()


async def test_closing_lets_queued_requests_finish_then_refuses(pool: Any) -> None:
    doubler = Doubler(pool)
    doubler.gate.clear()
    running = [asyncio.create_task(doubler.batcher.submit(x)) for x in ("1", "2")]
    await doubler.in_flight(1)
    closing = asyncio.create_task(doubler.batcher.aclose())
    await asyncio.sleep(0)
    doubler.gate.set()
    await closing
    assert [await task for task in running] == [2, 4]
    with pytest.raises(asyncpg.InterfaceError, match="closed"):
        await doubler.batcher.submit("3")
    assert pool.get_idle_size() == pool.get_size()  # its connection went back

"""Two `PostgresEventLog`s on one real PostgreSQL database, as two replicas of one Location:
one numbering for the fleet, each replica's readers see both replicas' events in that order,
and a replica started later resumes where the fleet is."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import asyncpg
import pytest

from sidecar.backends.postgres.event_log import PostgresEventLog
from sidecar.backends.postgres.pool import open_pool
from sidecar.model.events import EventBus, RegistryChanged
from sidecar.stores.event_log import NumberedEvent
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio


@pytest.fixture
async def pool(postgres_server: PostgresServer) -> AsyncIterator[asyncpg.Pool]:
    pool = await open_pool(await postgres_server.new_database(), max_size=6)
    try:
        yield pool
    finally:
        await pool.close()


async def _until(log: PostgresEventLog, last_id: int) -> list[NumberedEvent]:
    """Everything the log holds once it holds `last_id` (the timeout is a hang guard)."""
    reader = log.follow(0)
    try:
        async with asyncio.timeout(10):
            async for event in reader:
                if event.id >= last_id:
                    break
    finally:
        await reader.aclose()  # type: ignore[attr-defined]
    events, _ = log.after(0)
    return list(events)


async def test_two_replicas_number_their_events_in_one_sequence(pool: asyncpg.Pool) -> None:
    bus_a, bus_b = EventBus(), EventBus()
    a = PostgresEventLog(bus_a, pool=pool, location="default")
    b = PostgresEventLog(bus_b, pool=pool, location="default")
    other = PostgresEventLog(EventBus(), pool=pool, location="elsewhere")
    await a.start()
    await b.start()
    await other.start()
    try:
        for version in range(1, 21):  # interleaved publishing on both replicas
            (bus_a if version % 2 else bus_b).publish(RegistryChanged(version))
            if version % 5 == 0:
                await asyncio.sleep(0)
        seen_a = await _until(a, 20)
        seen_b = await _until(b, 20)
        assert [e.id for e in seen_a] == list(range(1, 21))
        # the same events with the same ids, in the same order, on both replicas
        assert [(e.id, e.data) for e in seen_a] == [(e.id, e.data) for e in seen_b]
        assert sorted(json.loads(e.data)["version"] for e in seen_a) == list(range(1, 21))
        assert other.last_id == 0 and other.after(0) == ([], 0)  # another Location's log
    finally:
        for log in (a, b, other):
            await log.aclose()


async def test_a_reader_on_one_replica_follows_events_published_on_the_other(
    pool: asyncpg.Pool,
) -> None:
    bus_a, bus_b = EventBus(), EventBus()
    a = PostgresEventLog(bus_a, pool=pool, location="default")
    b = PostgresEventLog(bus_b, pool=pool, location="default", poll_interval=60)
    await a.start()
    await b.start()
    live = b.follow(None)
    try:
        waiter = asyncio.ensure_future(anext(live))
        await asyncio.sleep(0)
        bus_a.publish(RegistryChanged(7))
        # with a 60 s poll interval, only the NOTIFY can wake B in time (hang guard only)
        async with asyncio.timeout(10):
            event = await waiter
        assert (event.id, event.name, json.loads(event.data)) == (
            1, "registry.changed", {"version": 7})
    finally:
        await live.aclose()  # type: ignore[attr-defined]
        await a.aclose()
        await b.aclose()


async def test_a_replica_started_later_resumes_the_fleet_numbering(pool: asyncpg.Pool) -> None:
    bus = EventBus()
    first = PostgresEventLog(bus, pool=pool, location="default", capacity=8)
    await first.start()
    for version in range(1, 31):
        bus.publish(RegistryChanged(version))
    await _until(first, 30)
    for _ in range(500):  # pruned to `capacity` after the batch (the bound is a hang guard)
        if await pool.fetchval("SELECT count(*) FROM sidecar_events") <= 8:
            break
        await asyncio.sleep(0.02)
    assert await pool.fetchval("SELECT count(*) FROM sidecar_events") == 8
    await first.aclose()

    bus = EventBus()
    later = PostgresEventLog(bus, pool=pool, location="default", capacity=8)
    await later.start()
    try:
        assert later.last_id == 30
        events, missed = later.after(0)
        assert [e.id for e in events] == list(range(23, 31)) and missed == 22
        bus.publish(RegistryChanged(31))
        assert [e.id for e in await _until(later, 31)][-1] == 31
        reader = later.follow(20)  # resuming before the kept events: told what it missed
        reset = await anext(reader)
        assert reset.name == "stream.reset" and json.loads(reset.data)["missed"] == 3
        await reader.aclose()  # type: ignore[attr-defined]
    finally:
        await later.aclose()


async def test_without_notifications_a_replica_still_follows_by_polling(
    pool: asyncpg.Pool,
) -> None:
    """An event committed with no NOTIFY (a lost notification) reaches the reader at the next
    poll."""
    log = PostgresEventLog(EventBus(), pool=pool, location="default", poll_interval=0.1)
    await log.start()
    live = log.follow(None)
    try:
        waiter = asyncio.ensure_future(anext(live))
        async with pool.acquire() as conn, conn.transaction():
            await conn.execute("INSERT INTO sidecar_event_counters VALUES ('default', 1)")
            await conn.execute("INSERT INTO sidecar_events VALUES ('default', 1, "
                               "'registry.changed', '{\"version\": 9}')")
        async with asyncio.timeout(10):  # hang guard
            event = await waiter
        assert (event.id, json.loads(event.data)) == (1, {"version": 9})
    finally:
        await live.aclose()  # type: ignore[attr-defined]
        await log.aclose()

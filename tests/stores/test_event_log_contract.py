"""`EventLog` contract: a Location's events numbered in publish order, readable after an id,
followed live, and a `stream.reset` first when a reader's events are no longer kept."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable

import pytest

from sidecar.backends.local.event_log import MemoryEventLog
from sidecar.backends.postgres.event_log import PostgresEventLog
from sidecar.backends.postgres.pool import open_pool
from sidecar.model.events import CallSettled, EventBus, RegistryChanged
from sidecar.stores.event_log import EventLog, NumberedEvent
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

# (bus, how many events it must keep at least) -> an event log, not started
MakeLog = Callable[[EventBus, int], EventLog]


@pytest.fixture(params=["memory", "postgres"])
async def make_log(request: pytest.FixtureRequest) -> AsyncIterator[MakeLog]:
    if request.param == "memory":
        yield lambda bus, keep: MemoryEventLog(bus, capacity=keep)
        return
    # a fresh database on the session's real PostgreSQL server (tests/fleet/postgres.py)
    server: PostgresServer = request.getfixturevalue("postgres_server")
    pool = await open_pool(await server.new_database(), max_size=4)
    try:
        yield lambda bus, keep: PostgresEventLog(bus, pool=pool, location="default",
                                                 capacity=keep)
    finally:
        await pool.close()


@pytest.fixture
async def bus_and_log(make_log: MakeLog) -> AsyncIterator[tuple[EventBus, EventLog]]:
    bus = EventBus()
    log = make_log(bus, 64)
    await log.start()
    try:
        yield bus, log
    finally:
        await log.aclose()


async def _logged(log: EventLog, last_id: int) -> None:
    """Wait until the log holds event `last_id` (the timeout is a hang guard only)."""
    reader = log.follow(0)
    try:
        async with asyncio.timeout(10):
            async for event in reader:
                if event.id >= last_id:
                    return
    finally:
        await reader.aclose()  # type: ignore[attr-defined]


async def _take(events: AsyncIterator[NumberedEvent], n: int) -> list[NumberedEvent]:
    async with asyncio.timeout(10):
        return [await anext(events) for _ in range(n)]


async def test_events_are_numbered_in_publish_order(
    bus_and_log: tuple[EventBus, EventLog],
) -> None:
    bus, log = bus_and_log
    assert log.last_id == 0
    for version in range(1, 6):
        bus.publish(RegistryChanged(version))
    await _logged(log, 5)
    events, missed = log.after(0)
    assert missed == 0
    assert [e.id for e in events] == [1, 2, 3, 4, 5]
    assert [json.loads(e.data)["version"] for e in events] == [1, 2, 3, 4, 5]
    assert {e.name for e in events} == {"registry.changed"}
    later, missed = log.after(3)
    assert [e.id for e in later] == [4, 5] and missed == 0


async def test_sse_carries_id_name_and_data(bus_and_log: tuple[EventBus, EventLog]) -> None:
    bus, log = bus_and_log
    bus.publish(CallSettled("c1", "echo", "completed", None))
    await _logged(log, 1)
    (event,), _ = log.after(0)
    assert event.sse() == f"id: 1\nevent: call.settled\ndata: {event.data}\n\n"
    assert json.loads(event.data) == {"call_id": "c1", "tool": "echo", "status": "completed",
                                      "error_kind": None}


async def test_follow_resumes_after_an_id_then_goes_live(
    bus_and_log: tuple[EventBus, EventLog],
) -> None:
    bus, log = bus_and_log
    for version in (1, 2, 3):
        bus.publish(RegistryChanged(version))
    await _logged(log, 3)
    resumed = log.follow(1)
    assert [e.id for e in await _take(resumed, 2)] == [2, 3]
    live = log.follow(None)  # only what comes next
    waiter = asyncio.ensure_future(_take(live, 1))
    await asyncio.sleep(0)
    bus.publish(RegistryChanged(4))
    (event,) = await waiter
    assert event.id == 4 and [e.id for e in await _take(resumed, 1)] == [4]
    await resumed.aclose()  # type: ignore[attr-defined]
    await live.aclose()  # type: ignore[attr-defined]


async def test_a_reader_too_far_behind_is_told_how_much_it_missed(make_log: MakeLog) -> None:
    bus = EventBus()
    log = make_log(bus, 4)
    await log.start()
    try:
        for version in range(1, 11):
            bus.publish(RegistryChanged(version))
        await _logged(log, 10)
        events, missed = log.after(2)
        assert missed > 0 and events[-1].id == 10
        assert [e.id for e in events] == list(range(events[0].id, 11))
        assert events[0].id == 3 + missed  # nothing in between is lost silently
        reader = log.follow(2)
        first = (await _take(reader, 1))[0]
        assert first.name == "stream.reset"
        assert json.loads(first.data)["missed"] == missed
        assert [e.id for e in await _take(reader, len(events))] == [e.id for e in events]
        await reader.aclose()  # type: ignore[attr-defined]
    finally:
        await log.aclose()

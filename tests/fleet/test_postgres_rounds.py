"""Paused calls shared by two replicas (two `PostgresRounds` on one real PostgreSQL database,
each its own holder): a call held by A is resumed through B with B's responses and B gets A's
answer; unknown, used, mismatched and expired states are refused; a silent or stopped holder
is an error naming it; a cancelled resume cancels the continued call on the holder."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from sidecar.backends.postgres.pool import open_pool
from sidecar.backends.postgres.rounds import PostgresRounds
from sidecar.model.replica import replica_id
from sidecar.stores.shared_rounds import Relay, RoundHolderGone, RoundUnknown
from tests.fleet.postgres import FailsOnce, PostgresServer

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]


@dataclass
class Pair:
    pool: asyncpg.Pool
    a: PostgresRounds
    b: PostgresRounds

    async def rows(self) -> int:
        return int(await self.pool.fetchval("SELECT count(*) FROM sidecar_rounds"))


@pytest.fixture
async def pair(postgres_server: PostgresServer) -> AsyncIterator[Pair]:
    pool = await open_pool(await postgres_server.new_database(), max_size=8)
    a = await PostgresRounds.on_pool(pool, "default", silent_after=1.5, poll_interval=0.2)
    b = await PostgresRounds.on_pool(pool, "default", silent_after=1.5, poll_interval=0.2)
    try:
        yield Pair(pool, a, b)
    finally:
        await b.aclose()
        await a.aclose()
        await pool.close()


async def test_a_call_held_by_one_is_resumed_through_the_other(pair: Pair) -> None:
    seen: list[Any] = []

    async def resume(responses: Any, relay: Relay) -> Any:
        seen.append(responses)
        return {"result": {"text": f"continued with {responses['q']['text']}"}}

    await pair.a.held("k1", "req", resume, 60)
    answer = await pair.b.resume("k1", "req", {"q": {"text": "yes"}})
    assert answer == {"result": {"text": "continued with yes"}}
    assert seen == [{"q": {"text": "yes"}}]  # run once, on the holder
    assert await pair.rows() == 0  # the reply was read and its row deleted
    with pytest.raises(RoundUnknown):  # used once
        await pair.b.resume("k1", "req", {})


async def test_unknown_mismatched_and_no_longer_held_states_are_refused(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        return "done"

    await pair.a.held("k2", "req", resume, 60)
    with pytest.raises(RoundUnknown):
        await pair.b.resume("never-held", "req", {})
    with pytest.raises(RoundUnknown):  # other arguments: refused, and the state stays usable
        await pair.b.resume("k2", "other", {})
    assert await pair.b.resume("k2", "req", {}) == "done"

    async def gone(responses: Any, relay: Relay) -> Any:
        return None  # resumed on the holder meanwhile

    await pair.a.held("k3", "req", gone, 60)
    with pytest.raises(RoundUnknown):
        await pair.b.resume("k3", "req", {})
    await pair.a.held("k4", "req", resume, 0.01)
    await asyncio.sleep(0.05)
    with pytest.raises(RoundUnknown):  # past its ttl
        await pair.b.resume("k4", "req", {})


async def test_a_state_dropped_by_its_holder_is_refused(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        raise AssertionError("dropped: resumed on the holder itself")

    await pair.a.held("k10", "req", resume, 60)
    pair.a.dropped("k10")  # its row goes in the background
    for _ in range(300):
        if await pair.rows() == 0:
            break
        await asyncio.sleep(0.02)
    assert await pair.rows() == 0
    with pytest.raises(RoundUnknown):
        await pair.b.resume("k10", "req", {})


async def test_a_silent_holder_is_named_before_anything_is_handed_over(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        raise AssertionError("a silent holder's call must not be resumed")

    await pair.a.held("k5", "req", resume, 60)
    await pair.pool.execute(  # as if the holder had stopped refreshing long ago
        "UPDATE sidecar_rounds SET seen_at = now() - interval '1 hour' WHERE key = 'k5'")
    with pytest.raises(RoundHolderGone, match=f"paused on replica '{replica_id()}'") as gone:
        await pair.b.resume("k5", "req", {})
    assert gone.value.before


async def test_a_holder_that_shut_down_is_named_at_once(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        raise AssertionError("a stopped holder's call must not be resumed")

    await pair.a.held("k11", "req", resume, 60)
    await pair.a.aclose()
    await pair.b._refresh(prune=True)  # kept until it expires, to say why
    with pytest.raises(RoundHolderGone, match="shut down") as gone:
        await pair.b.resume("k11", "req", {})
    assert gone.value.before


async def test_a_holder_stopping_while_it_continues_ends_the_wait(pair: Pair) -> None:
    started = asyncio.Event()

    async def resume(responses: Any, relay: Relay) -> Any:
        started.set()
        await asyncio.Event().wait()  # continues until the holder stops

    await pair.a.held("k6", "req", resume, 60)
    waiting = asyncio.create_task(pair.b.resume("k6", "req", {}))
    await asyncio.wait_for(started.wait(), 30)  # a hang guard
    await pair.a.aclose()  # its rows go with it
    with pytest.raises(RoundHolderGone, match="stopped while it continued") as gone:
        await asyncio.wait_for(waiting, 30)
    assert not gone.value.before


async def test_a_cancelled_resume_cancels_the_continued_call(pair: Pair) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()

    async def resume(responses: Any, relay: Relay) -> Any:
        started.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    await pair.a.held("k7", "req", resume, 60)
    waiting = asyncio.create_task(pair.b.resume("k7", "req", {}))
    await asyncio.wait_for(started.wait(), 30)
    waiting.cancel()
    await asyncio.wait_for(cancelled.wait(), 30)
    for _ in range(300):  # the holder deletes the row once its call is cancelled
        if await pair.rows() == 0:
            break
        await asyncio.sleep(0.02)
    assert await pair.rows() == 0


async def test_a_failing_continuation_is_an_error_on_the_resuming_replica(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        raise ValueError("boom")

    await pair.a.held("k8", "req", resume, 60)
    with pytest.raises(RuntimeError, match="ValueError: boom"):
        await pair.b.resume("k8", "req", {})


@pytest.mark.parametrize("fault", [None, RuntimeError("unforeseen")],
                         ids=["as-is", "an-error-in-the-poll"])
async def test_answers_are_found_by_polling_when_notifications_are_lost(
    pair: Pair, fault: Exception | None, caplog: pytest.LogCaptureFixture
) -> None:
    """Neither replica listens: the holder's poll takes the responses, the resumer's poll
    reads the reply. The holder's poll also outlives an unforeseen error of one round: it
    logs it and goes on (a dead poll would leave the resume waiting)."""
    for rounds in (pair.a, pair.b):
        await rounds._start()
        await rounds._listening.stop()

    async def resume(responses: Any, relay: Relay) -> Any:
        return "polled"

    await pair.a.held("k9", "req", resume, 60)
    if fault is not None:
        pair.a._pool = failing = FailsOnce(pair.a._pool, fault)
    assert await asyncio.wait_for(pair.b.resume("k9", "req", {}), 30) == "polled"
    if fault is not None:
        assert failing.spent
        assert "refreshing this replica's paused calls failed" in caplog.text


async def notes_rows(pair: Pair) -> int:
    return int(await pair.pool.fetchval("SELECT count(*) FROM sidecar_round_notes"))


async def test_notes_of_the_continued_call_reach_the_resumer_in_order_before_the_answer(
    pair: Pair,
) -> None:
    wanted: list[Any] = []

    async def resume(responses: Any, relay: Relay) -> Any:
        wanted.append(relay.wants)
        for n in range(1, 6):
            relay.put({"log": n})
        await asyncio.sleep(0)  # a batch may be on its way meanwhile
        relay.put({"log": 6})
        return "answer"

    got: list[Any] = []

    async def on_note(note: Any) -> None:
        got.append(note)

    await pair.a.held("n1", "req", resume, 60)
    answer = await pair.b.resume("n1", "req", {}, wants={"progress": True}, on_note=on_note)
    assert answer == "answer"
    assert wanted == [{"progress": True}]
    assert got == [{"log": n} for n in range(1, 7)]
    assert await notes_rows(pair) == 0 and await pair.rows() == 0  # deleted with the round


async def test_a_slot_keeps_only_the_latest_unread_note(pair: Pair) -> None:
    """While the resumer is busy with a first note, the holder reports progress twice, the
    first written to the table before the second: only the second arrives, and the table
    never held more than one row for the slot."""
    got: list[Any] = []
    busy, release = asyncio.Event(), asyncio.Event()
    slot_rows: list[int] = []

    async def written(body: str) -> None:
        for _ in range(1500):  # a hang guard
            if await pair.pool.fetchval(
                    "SELECT count(*) FROM sidecar_round_notes WHERE body = $1", body):
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{body} never written")

    async def resume(responses: Any, relay: Relay) -> Any:
        relay.put("first")
        await asyncio.wait_for(busy.wait(), 30)
        for step in range(1, 4):  # coalesced in memory: only 3 is written
            relay.put({"progress": step}, slot="progress")
        await written('{"progress": 3}')
        relay.put({"progress": 4}, slot="progress")  # replaces the written, unread row
        await written('{"progress": 4}')
        slot_rows.append(int(await pair.pool.fetchval(
            "SELECT count(*) FROM sidecar_round_notes WHERE slot = 'progress'")))
        release.set()
        return "done"

    async def on_note(note: Any) -> None:
        got.append(note)
        if note == "first":
            busy.set()
            await asyncio.wait_for(release.wait(), 30)

    await pair.a.held("n2", "req", resume, 60)
    assert await pair.b.resume("n2", "req", {}, wants=True, on_note=on_note) == "done"
    assert got == ["first", {"progress": 4}]
    assert slot_rows == [1]


async def test_nothing_is_written_when_the_resumer_wants_nothing(pair: Pair) -> None:
    async def resume(responses: Any, relay: Relay) -> Any:
        assert relay.wants is None
        relay.put("unwanted")
        return await pair.pool.fetchval("SELECT count(*) FROM sidecar_round_notes")

    got: list[Any] = []

    async def on_note(note: Any) -> None:
        got.append(note)

    await pair.a.held("n3", "req", resume, 60)
    assert await pair.b.resume("n3", "req", {}, on_note=on_note) == 0
    assert got == []

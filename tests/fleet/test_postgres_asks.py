"""Pending permission asks shared by two replicas (two `PermissionService`s, each with its own
`PostgresAsks`, on one real PostgreSQL database): an ask raised on A is listed on B, answered
on B, and A's waiting call goes on; `reject`, `always`, timeouts and a dead replica's asks
keep their meaning across replicas."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass

import asyncpg
import pytest

from sidecar.backends.postgres.asks import PostgresAsks
from sidecar.backends.postgres.permissions import PostgresPermissionStore
from sidecar.backends.postgres.pool import open_pool
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.permissions import PendingAsk, PermissionRequest, PermissionRule
from sidecar.policy.permission_service import PermissionService, UnknownAsk
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

ASK_EVERYTHING = [PermissionRule("*", "ask")]


@dataclass
class Fleet:
    pool: asyncpg.Pool
    opened: list[PostgresAsks]

    async def replica(self, **options: object) -> PermissionService:
        asks = await PostgresAsks.on_pool(self.pool, "default", poll_interval=0.2)
        self.opened.append(asks)
        store = await PostgresPermissionStore.on_pool(self.pool)
        return await PermissionService.open(store, defaults=ASK_EVERYTHING, shared=asks,
                                            **options)


@pytest.fixture
async def fleet(postgres_server: PostgresServer) -> AsyncIterator[Fleet]:
    pool = await open_pool(await postgres_server.new_database(), max_size=8)
    fleet = Fleet(pool, [])
    try:
        yield fleet
    finally:
        for asks in fleet.opened:
            await asks.aclose()
        await pool.close()


def req(action: str, session: str = "s1") -> PermissionRequest:
    return PermissionRequest(session_id=session, agent="a", action=action, call_id="c")


async def listed_on(service: PermissionService, action: str, session: str = "s1") -> PendingAsk:
    """The ask for `action`, once `service` lists it (the bound is a hang guard)."""
    for _ in range(500):
        found = [a for a in await service.listed(session) if a.request.action == action]
        if found:
            return found[0]
        await asyncio.sleep(0.02)
    raise AssertionError(f"{action} was never listed")


async def listed_for_the_fleet(fleet: Fleet, n: int) -> None:
    """Until the database lists `n` asks (a replica lists its own before they are stored);
    the bound is a hang guard."""
    for _ in range(500):
        if await fleet.pool.fetchval("SELECT count(*) FROM sidecar_asks") == n:
            return
        await asyncio.sleep(0.02)
    raise AssertionError(f"the database never listed {n} asks")


async def test_an_ask_raised_on_a_is_answered_on_b_and_the_call_on_a_proceeds(
    fleet: Fleet,
) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    try:
        call = asyncio.ensure_future(a.ask(req("deploy")))
        on_b = await listed_on(b, "deploy")
        assert b.pending() == []  # not raised on B: only listed there
        assert on_b.request.call_id == "c" and on_b.id == a.pending()[0].id
        await b.reply(on_b.id, "once")
        async with asyncio.timeout(10):  # hang guard: the answer reaches A by NOTIFY
            await call
        assert await a.listed() == [] and await b.listed() == []
        with pytest.raises(UnknownAsk):  # answered: not answerable again, on either
            await b.reply(on_b.id, "once")
        with pytest.raises(UnknownAsk):
            await a.reply(on_b.id, "once")
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_rejection_on_b_fails_the_call_on_a_and_the_sessions_other_asks(
    fleet: Fleet,
) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    try:
        on_a = asyncio.ensure_future(a.ask(req("deploy")))
        on_b_too = asyncio.ensure_future(b.ask(req("migrate")))  # same session, on B
        other = asyncio.ensure_future(b.ask(req("migrate", session="s2")))
        ask = await listed_on(b, "deploy")
        await listed_on(a, "migrate")
        await b.reply(ask.id, "reject", feedback="use staging")
        async with asyncio.timeout(10):
            with pytest.raises(ToolFailure) as err:
                await on_a
            assert err.value.kind is ErrorKind.TOOL_FAILURE
            assert "use staging" in err.value.message  # the feedback reaches A
            with pytest.raises(ToolFailure) as err:
                await on_b_too
            assert err.value.kind is ErrorKind.DECLINED
        assert not other.done()  # another session is not affected
        await a.reply((await listed_on(a, "migrate", "s2")).id, "once")  # B's ask, on A
        async with asyncio.timeout(10):
            await other
    finally:
        await a.aclose()
        await b.aclose()


async def test_always_on_b_allows_the_session_on_every_replica(fleet: Fleet) -> None:
    a, b = await fleet.replica(), await fleet.replica()
    try:
        on_a = asyncio.ensure_future(a.ask(req("deploy")))
        waiting_on_b = asyncio.ensure_future(b.ask(req("deploy")))
        await listed_for_the_fleet(fleet, 2)
        assert len(await a.listed()) == 2 and len(await b.listed()) == 2
        await b.reply(a.pending()[0].id, "always")
        async with asyncio.timeout(10):
            await on_a
            await waiting_on_b  # released on B by the rule the answer made
        # from now on neither replica asks for deploy in this session, but does in another
        await a.ask(req("deploy"))
        await b.ask(req("deploy"))
        assert a.decision("s2", "deploy") == "ask"
        rules = await PostgresPermissionStore.on_pool(fleet.pool)
        for _ in range(500):  # A stores the rule after its call went on (a hang guard)
            stored = await rules.rules("default")
            if stored:
                break
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.1)  # time enough for a second row, were one written
        assert [(r.session_id, r.rule) for r in await rules.rules("default")] == [
            ("s1", PermissionRule("deploy", "allow"))]  # stored once, by A
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_timed_out_ask_is_no_longer_listed_or_answerable(fleet: Fleet) -> None:
    a, b = await fleet.replica(ask_timeout=0.3), await fleet.replica()
    try:
        call = asyncio.ensure_future(a.ask(req("slow")))
        ask = await listed_on(b, "slow")
        with pytest.raises(ToolFailure) as err:
            await call
        assert err.value.kind is ErrorKind.DECLINED and "within" in err.value.message
        assert await b.listed() == []
        with pytest.raises(UnknownAsk):
            await b.reply(ask.id, "once")
    finally:
        await a.aclose()
        await b.aclose()


async def test_the_asks_of_a_replica_that_stopped_refreshing_them_expire(fleet: Fleet) -> None:
    """A replica killed mid-ask leaves its row: once it is older than `stale_after` without
    a refresh, no replica lists or answers it."""
    dead = await PostgresAsks.on_pool(fleet.pool, "default", stale_after=0.3)
    fleet.opened.append(dead)
    pending = PendingAsk("perm_dead", req("deploy"), 0.0)
    await dead.raised(pending, None)  # never started: nothing refreshes the row
    live = await PostgresAsks.on_pool(fleet.pool, "default", stale_after=0.3)
    fleet.opened.append(live)
    assert [a.id for a in await live.pending()] == ["perm_dead"]
    await asyncio.sleep(0.4)
    assert await live.pending() == []
    assert await live.answer("perm_dead", "once", scope="session", feedback=None) is None


async def test_an_answer_whose_notification_was_lost_reaches_the_caller_by_polling(
    fleet: Fleet,
) -> None:
    a = await fleet.replica()
    try:
        call = asyncio.ensure_future(a.ask(req("deploy")))
        ask = await listed_on(a, "deploy")
        await listed_for_the_fleet(fleet, 1)
        # answered as another replica would, but no NOTIFY reaches anyone
        await fleet.pool.execute("UPDATE sidecar_asks SET reply = 'once', scope = 'session' "
                                 "WHERE id = $1", ask.id)
        async with asyncio.timeout(10):  # hang guard: A polls every 0.2 s here
            await call
        assert await a.listed() == []
    finally:
        await a.aclose()


async def test_an_answer_reaches_the_caller_after_its_replicas_connections_were_ended(
    postgres_server: PostgresServer,
) -> None:
    """2026-12-05: ending A's server processes (as a database stop or restart does) while
    A's poll runs once made asyncpg raise `InternalClientError` from a pooled connection
    whose end it had not read yet; it escaped the poll, which stopped for good: A then
    neither re-listened nor read its answered asks, and its call waited forever without a
    warning. Here A's connections (its LISTEN one too) are ended again and again while it
    polls, then B answers: the answer reaches A's call (by NOTIFY or by the poll)."""
    dsn = await postgres_server.new_database()
    pool_a, pool_b = await open_pool(dsn), await open_pool(dsn)
    ender = await asyncpg.connect(dsn)
    asks_a = await PostgresAsks.on_pool(pool_a, "default", poll_interval=0.002)
    asks_b = await PostgresAsks.on_pool(pool_b, "default", poll_interval=0.2)
    a = await PermissionService.open(None, defaults=ASK_EVERYTHING, shared=asks_a)
    b = await PermissionService.open(None, defaults=ASK_EVERYTHING, shared=asks_b)
    try:
        call = asyncio.ensure_future(a.ask(req("deploy")))
        ask = await listed_on(b, "deploy")
        a_pids = ("SELECT pid FROM pg_stat_activity WHERE application_name = $1 "
                  "AND datname = current_database() AND pid <> pg_backend_pid()")
        name = await pool_a.fetchval("SELECT current_setting('application_name')")
        for round_ in range(200):  # the window is about a millisecond: hit it many times
            pids = [r["pid"] for r in await ender.fetch(a_pids, name)]
            await ender.execute("SELECT pg_terminate_backend(p) FROM unnest($1::int[]) p",
                                pids)
            await asyncio.sleep((round_ % 7) * 0.0005)
        # (B's connections were ended too, sharing the process's application_name: each
        # ended one is seen closed, and replaced, once its end is read)
        await asyncio.sleep(0.05)
        # A's poll still runs: its connections back, B's answer reaches A's call
        await b.reply(ask.id, "once")
        async with asyncio.timeout(10):  # hang guard: A polls every 2 ms here
            await call
        assert await a.listed() == []
    finally:
        call.cancel()
        await ender.close()
        for service in (a, b):
            await service.aclose()
        for asks in (asks_a, asks_b):
            await asks.aclose()
        await pool_a.close()
        await pool_b.close()

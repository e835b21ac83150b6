"""The replica's pool (`sidecar.backends.postgres.pool.open_pool`) resets a connection going back
to it only
when the connection may carry session state: whatever a store did on it, the next borrower
finds no LISTEN, no advisory lock, no open transaction and no changed setting. Checked on a
real PostgreSQL (tests/fleet/postgres.py) with a pool of one connection, so the borrower
after a release gets the very same connection (same backend pid)."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from managed_store.s3 import S3Settings, S3TextStore
from sidecar.backends.postgres.claims import CHANNEL
from sidecar.backends.postgres.outcome_log import PostgresOutcomeLog
from sidecar.backends.postgres.pool import open_pool
from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server

pytestmark = pytest.mark.anyio


@pytest.fixture
async def dsn(postgres_server: PostgresServer) -> str:
    return await postgres_server.new_database()


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[Any]:
    pool = await open_pool(dsn, min_size=1, max_size=1)
    yield pool
    await pool.close()


async def session_state(pool: Any, dsn: str) -> dict[str, Any]:
    """What the pool's (one) connection carries, seen from the connection itself and from
    another session."""
    async with pool.acquire() as conn:
        pid = conn.get_server_pid()
        mine = await conn.fetchrow(
            "SELECT array(SELECT pg_listening_channels()) AS channels, "
            "current_setting('work_mem') AS work_mem, "
            "current_setting('synchronous_commit') AS synchronous_commit")
    observer = await asyncpg.connect(dsn)
    try:
        locks = await observer.fetchval(
            "SELECT count(*) FROM pg_locks WHERE pid = $1 AND locktype = 'advisory'", pid)
        activity = await observer.fetchrow(
            "SELECT state, query FROM pg_stat_activity WHERE pid = $1", pid)
    finally:
        await observer.close()
    return {"pid": pid, "channels": list(mine["channels"]), "work_mem": mine["work_mem"],
            "synchronous_commit": mine["synchronous_commit"], "advisory_locks": locks,
            "state": activity["state"], "last_query": activity["query"]}


async def test_a_connection_that_listened_comes_back_without_its_listen(
        pool: Any, dsn: str) -> None:
    before = await session_state(pool, dsn)
    conn = await pool.acquire()
    await conn.add_listener("sidecar_reset_test", lambda *_: None)
    await conn.execute("SELECT pg_advisory_lock(42)")  # what only a full reset undoes
    with pytest.warns(asyncpg.InterfaceWarning, match="active notification listener"):
        await pool.release(conn)  # still listening (the stores remove theirs first)
    after = await session_state(pool, dsn)
    assert after["pid"] == before["pid"]  # the same connection, reset on its release
    assert after["channels"] == []
    assert after["advisory_locks"] == 0


async def test_transaction_state_ends_with_the_transaction_and_clean_releases_send_nothing(
        pool: Any, dsn: str) -> None:
    default = await session_state(pool, dsn)
    async with pool.acquire() as conn, conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(7)")
        await conn.execute("SET LOCAL work_mem = '7MB'")
        await conn.fetchval("SELECT set_config('synchronous_commit', 'off', true)")
        assert await conn.fetchval("SELECT current_setting('work_mem')") == "7MB"
    after = await session_state(pool, dsn)
    assert after["pid"] == default["pid"]
    assert (after["work_mem"], after["synchronous_commit"]) == (
        default["work_mem"], default["synchronous_commit"])
    assert after["advisory_locks"] == 0
    assert after["channels"] == []
    # No reset query went out when the clean connection was released: the server's last
    # statement of that session is still the one `session_state` sent on it.
    assert after["state"] == "idle"
    assert after["last_query"].startswith("SELECT array(SELECT pg_listening_channels())")


async def test_the_claims_connection_comes_back_with_synchronous_commit_reset(
        pool: Any, dsn: str) -> None:
    default = await session_state(pool, dsn)
    log = await PostgresOutcomeLog.on_pool(pool, replica="a", claim_ttl=60)
    try:
        assert await log.claim("loc", "c1", "fp") is None
        held = log.claims._batcher._conn  # the claims keep it for the next ones a while
        assert held is not None and held.get_server_pid() == default["pid"]
        assert held.keeps_session_state  # its session has synchronous_commit=off
        after = await session_state(pool, dsn)  # once it went back (idle), the same backend
        assert (after["pid"], after["synchronous_commit"]) == (
            default["pid"], default["synchronous_commit"])
    finally:
        await log.aclose()


async def test_the_claims_listener_goes_back_to_the_pool_unlistened(dsn: str) -> None:
    pool = await open_pool(dsn, min_size=1, max_size=2)
    try:
        log = await PostgresOutcomeLog.on_pool(pool, replica="a", claim_ttl=60)
        await log.claims._listen()  # what a duplicate waiting for another replica does
        observer = await asyncpg.connect(dsn)
        try:
            assert await observer.fetchval(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND query LIKE $1", f"LISTEN %{CHANNEL}%") == 1
        finally:
            await observer.close()
        await log.aclose()
        conns = [await pool.acquire() for _ in range(2)]  # every connection of the pool
        try:
            for conn in conns:
                assert await conn.fetchval(
                    "SELECT array(SELECT pg_listening_channels())") == []
        finally:
            for conn in conns:
                await pool.release(conn)
    finally:
        await pool.close()


async def test_the_s3_cleanup_lock_is_not_left_on_a_pooled_connection(
        pool: Any, dsn: str, s3_server: S3Server) -> None:
    settings = S3Settings.from_url(s3_server.new_location(), s3_server.env(""))
    store = await S3TextStore.open(pool, settings, cleanup_interval=math.inf)
    try:
        await store.put("kept\n")
        assert await store.cleanup() == 0  # it held the cleanup lock (nothing to evict)
        state = await session_state(pool, dsn)
        assert state["advisory_locks"] == 0
        # ... so the next cleanup, on any connection, gets the lock and runs
        other = await asyncpg.connect(dsn)
        try:
            assert await other.fetchval("SELECT pg_try_advisory_lock($1)", 0x51DECA2_0004)
        finally:
            await other.close()
    finally:
        await store.aclose()

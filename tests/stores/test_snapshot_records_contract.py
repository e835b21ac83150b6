"""`SnapshotRecords` contract: recipes by (Location, id), with a TTL, a cap per session and a
cap in all (the session holding the most loses its oldest); a second handle on the same
storage (another replica) sees every recipe."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import pytest

from sidecar.backends.local.snapshot_records import MemorySnapshotRecords
from sidecar.backends.postgres.pool import open_pool
from sidecar.backends.postgres.snapshots import PostgresSnapshotRecords
from sidecar.stores.snapshot_records import (
    SnapshotLimits,
    SnapshotRecipe,
    SnapshotRecords,
    SnapshotRecordsError,
)
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenRecords = Callable[[], Awaitable[SnapshotRecords]]
LIMITS = SnapshotLimits(ttl_seconds=3600, max_count=100, max_per_session=10)


def recipe(session: str | None = "s", names: tuple[str, ...] = ("echo",),
           owner: str | None = None) -> SnapshotRecipe:
    return SnapshotRecipe(session_id=session, profile="default", mode="direct",
                          final_step=False, strict=False, names=names, removed=("gone",),
                          owner=owner)


@pytest.fixture(params=["memory", "postgres"])
async def open_records(request: pytest.FixtureRequest) -> AsyncIterator[OpenRecords]:
    """Opens another handle on the same storage on each call."""
    closers: list[Callable[[], Awaitable[None]]] = []
    if request.param == "memory":
        shared = MemorySnapshotRecords()

        async def open_memory() -> SnapshotRecords:
            return shared

        yield open_memory
        await shared.aclose()
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()

    async def open_postgres() -> SnapshotRecords:
        pool = await open_pool(dsn, max_size=2)
        closers.append(pool.close)
        return await PostgresSnapshotRecords.on_pool(pool)

    yield open_postgres
    for close in closers:
        await close()


async def test_a_recipe_is_read_back_whole(open_records: OpenRecords) -> None:
    records = await open_records()
    kept = SnapshotRecipe(session_id=None, profile="ops", mode="codemode", final_step=True,
                          strict=True, names=("a", "b\u00e9"), removed=("c",),
                          owner="token:t1")
    await records.put("default", "snap_1", kept, "digest-1", LIMITS)
    stored = await records.get("default", "snap_1")
    assert stored is not None
    assert (stored.id, stored.recipe, stored.digest) == ("snap_1", kept, "digest-1")
    assert 0 < stored.expires_in <= LIMITS.ttl_seconds


async def test_unknown_ids_and_other_locations_are_none(open_records: OpenRecords) -> None:
    records = await open_records()
    await records.put("default", "snap_1", recipe(), "d", LIMITS)
    assert await records.get("default", "snap_2") is None
    assert await records.get("other", "snap_1") is None


async def test_another_handle_sees_the_recipe(open_records: OpenRecords) -> None:
    first, second = await open_records(), await open_records()
    await first.put("default", "snap_1", recipe(), "d", LIMITS)
    stored = await second.get("default", "snap_1")
    assert stored is not None and stored.recipe == recipe()


async def test_an_expired_recipe_is_gone(open_records: OpenRecords) -> None:
    records = await open_records()
    await records.put("default", "snap_1", recipe(), "d",
                      SnapshotLimits(ttl_seconds=0, max_count=100, max_per_session=10))
    assert await records.get("default", "snap_1") is None


async def test_a_session_keeps_its_newest_up_to_its_cap(open_records: OpenRecords) -> None:
    records = await open_records()
    limits = SnapshotLimits(ttl_seconds=3600, max_count=100, max_per_session=3)
    await records.put("default", "other", recipe("t"), "d", limits)
    for i in range(5):
        await records.put("default", f"snap_{i}", recipe("s"), "d", limits)
    kept = [i for i in range(5) if await records.get("default", f"snap_{i}") is not None]
    assert kept == [2, 3, 4]
    assert await records.get("default", "other") is not None
    # None and "" are two sessions, as in the local store
    await records.put("default", "none", recipe(None), "d", limits)
    await records.put("default", "empty", recipe(""), "d", limits)
    assert await records.get("default", "none") is not None


async def test_an_owner_keeps_its_newest_over_all_its_sessions(
    open_records: OpenRecords,
) -> None:
    """A scoped token inventing a session per snapshot still expires its own."""
    records = await open_records()
    limits = SnapshotLimits(ttl_seconds=3600, max_count=100, max_per_session=10,
                            max_per_owner=3)
    await records.put("default", "someone", recipe("s0", owner="token:other"), "d", limits)
    await records.put("default", "all-access", recipe("s0"), "d", limits)
    for i in range(5):
        await records.put("default", f"mine_{i}", recipe(f"s{i}", owner="token:me"), "d",
                          limits)
    kept = [i for i in range(5) if await records.get("default", f"mine_{i}") is not None]
    assert kept == [2, 3, 4]
    for other in ("someone", "all-access"):
        assert await records.get("default", other) is not None


async def test_past_the_total_cap_the_largest_session_loses_its_oldest(
    open_records: OpenRecords,
) -> None:
    records = await open_records()
    limits = SnapshotLimits(ttl_seconds=3600, max_count=4, max_per_session=10)
    await records.put("default", "quiet", recipe("quiet"), "d", limits)
    for i in range(5):
        await records.put("default", f"loud_{i}", recipe("loud"), "d", limits)
    assert await records.get("default", "quiet") is not None  # the loop expired its own
    kept = [i for i in range(5) if await records.get("default", f"loud_{i}") is not None]
    assert kept == [2, 3, 4]
    # another Location's rows do not count
    await records.put("elsewhere", "x", recipe("x"), "d", limits)
    assert await records.get("default", "loud_2") is not None


async def test_a_database_gone_is_a_records_error(postgres_server: PostgresServer) -> None:
    """PostgreSQL only: `/v1` answers 503 `unavailable` for this error."""
    import asyncpg

    dsn = await postgres_server.new_database()
    pool = await open_pool(dsn, max_size=1)
    try:
        records = await PostgresSnapshotRecords.on_pool(pool)
        admin = await asyncpg.connect(postgres_server.dsn())
        try:
            await admin.execute(f'DROP DATABASE "{dsn.rsplit("/", 1)[1]}" WITH (FORCE)')
        finally:
            await admin.close()
        with pytest.raises(SnapshotRecordsError, match="snap_1"):
            await records.put("default", "snap_1", recipe(), "d", LIMITS)
        with pytest.raises(SnapshotRecordsError, match="snap_1"):
            await records.get("default", "snap_1")
    finally:
        pool.terminate()


async def test_a_version_1_table_is_migrated(postgres_server: PostgresServer) -> None:
    """PostgreSQL only: a database made by the first layout (no owner column) gets it at
    open, keeping its rows."""
    from sidecar.backends.postgres import snapshots as postgres_snapshots
    from sidecar.backends.postgres.pool import migrate

    dsn = await postgres_server.new_database()
    pool = await open_pool(dsn, max_size=1)
    try:
        async with pool.acquire() as conn:
            await migrate(conn, "snapshots", postgres_snapshots.MIGRATIONS, 1)
            await conn.execute(
                "INSERT INTO sidecar_snapshots (location, id, session_key, recipe, digest, "
                "expires_at) VALUES ('default', 'old', 'null', $1, 'd', now() + interval '1h')",
                '{"session_id": null, "profile": "default", "mode": "direct", '
                '"final_step": false, "strict": false, "names": ["echo"], "removed": []}')
        records = await PostgresSnapshotRecords.on_pool(pool)
        old = await records.get("default", "old")
        assert old is not None and old.recipe.owner is None and old.recipe.names == ("echo",)
        await records.put("default", "new", recipe(owner="token:t"), "d", LIMITS)
        new = await records.get("default", "new")
        assert new is not None and new.recipe.owner == "token:t"
    finally:
        await pool.close()

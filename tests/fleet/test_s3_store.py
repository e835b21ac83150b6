"""`S3TextStore` beyond the shared contract: a multipart upload read back exactly as the local
store reads the same text, two stores (replicas) on one location, nothing left behind by an
aborted or failed spool, evicted objects deleted with their rows, one cleanup at a time (the
advisory lock), crashed uploads swept, a newer schema refused, settings checked."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import obstore
import pytest

from managed_store import (
    ManagedNotFound,
    ManagedStore,
    ManagedStoreError,
    OwnerLimitExceeded,
    OwnerLimits,
    OwnerShareExceeded,
    RetentionError,
    StoreStats,
)
from managed_store.s3 import LOCK_MANAGED_CLEANUP, S3Settings, S3TextStore
from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server

pytestmark = pytest.mark.anyio

PART = 5 * 1024 * 1024


@dataclass
class Place:
    pool: asyncpg.Pool
    settings: S3Settings
    s3: S3Server
    dsn: str

    async def open(self, **options: Any) -> S3TextStore:
        options.setdefault("cleanup_interval", math.inf)
        return await S3TextStore.open(self.pool, self.settings, **options)

    def keys(self) -> list[str]:
        return sorted(o["path"] for batch in obstore.list(self.s3.client(),  # type: ignore[arg-type]
                                                           prefix=self.settings.prefix)
                      for o in batch)

    def uploads(self) -> list[str]:
        return self.s3.uploads_in_progress(self.settings.prefix)

    async def rows(self) -> tuple[int, int, int]:
        return tuple(await self.pool.fetchrow(  # type: ignore[return-value]
            "SELECT (SELECT count(*) FROM sidecar_managed_objects),"
            " (SELECT count(*) FROM sidecar_managed_marks),"
            " (SELECT count(*) FROM sidecar_managed_pending)"))


@pytest.fixture
async def place(postgres_server: PostgresServer, s3_server: S3Server) -> AsyncIterator[Place]:
    settings = S3Settings.from_url(s3_server.new_location(), s3_server.env(""))
    dsn = await postgres_server.new_database()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        yield Place(pool, settings, s3_server, dsn)
    finally:
        await pool.close()


def _text() -> str:
    """About 6 MiB: numbered lines of mixed widths and scripts, one 300 KiB line, no final
    newline."""
    rows = [f"{i:06d} {'naïve café 日本語 🙂 ' * (i % 7)}{'x' * (i % 300)}" for i in range(60_000)]
    rows[31_337] = "é" * 150_000  # 300 KiB of two-byte characters in one line
    return "\n".join(rows)


async def test_a_multipart_upload_reads_back_as_the_local_store_reads_it(
        place: Place, tmp_path: Path) -> None:
    text = _text()
    data = text.encode()
    assert len(data) > PART
    local = await ManagedStore.open(tmp_path / "local", cleanup_interval=math.inf)
    s3 = await place.open(part_bytes=PART)
    try:
        async with s3.open_spool() as spool:  # 1 MiB chunks, a character cut between two
            for start in range(0, len(data), 1 << 20):
                await spool.write(data[start:start + (1 << 20)])
            ref = await spool.commit()
        mine = await local.put(text)
        assert (ref.size_bytes, ref.lines) == (mine.size_bytes, mine.lines) == (len(data), 60_000)
        etag = obstore.head(place.s3.client(), place.settings.key(ref.id))["e_tag"]  # type: ignore[arg-type]
        assert etag is not None and int(etag.strip('"').rsplit("-", 1)[1]) > 1  # parts

        def same(a: Any, b: Any) -> None:
            assert a.__class__ is b.__class__
            assert {k: v for k, v in _fields(a).items() if k != "ref"} == \
                {k: v for k, v in _fields(b).items() if k != "ref"}

        for offset, limit in ((1, 3), (31_336, 3), (45_000, 2000), (59_999, 5), (60_001, 1)):
            same(await s3.read_lines(ref.id, offset, limit),
                 await local.read_lines(mine.id, offset, limit))
        for offset, limit in ((0, 100), (len(data) // 2 + 1, 4099), (len(data) - 10, 100)):
            same(await s3.read_bytes(ref.id, offset, limit),
                 await local.read_bytes(mine.id, offset, limit))
        for line, start, length in ((31_338, 149_990, 20), (31_338, 0, 5), (7, 3, 1000)):
            same(await s3.read_chars(ref.id, line, start, length),
                 await local.read_chars(mine.id, line, start, length))
        for pattern, context in ((r"^05999\d ", 1), ("🙂 x{299}$", 0), ("é{3}$", 0)):
            found = await s3.grep(ref.id, pattern, max_matches=5, context=context)
            assert found.matches == (await local.grep(mine.id, pattern, max_matches=5,
                                                      context=context)).matches
            assert found.matches
    finally:
        await s3.aclose()
        await local.aclose()


def _fields(value: Any) -> dict[str, Any]:
    return {name: getattr(value, name) for name in value.__slots__}


async def test_a_ref_put_through_one_store_is_read_through_another(place: Place) -> None:
    a = await place.open()
    other_pool = await asyncpg.create_pool(place.dsn, min_size=1, max_size=2)
    try:
        b = await S3TextStore.open(other_pool, place.settings, cleanup_interval=math.inf)
        ref = await a.put("first\nsecond\nthird\n", namespace="loc")
        assert await b.stat(ref.id) == ref
        assert (await b.read_lines(ref.id, 2, 1)).text == "second\n"
        assert [m.line for m in (await b.grep(ref.id, "ir")).matches] == [1, 3]
        await b.aclose()
    finally:
        await a.aclose()
        await other_pool.close()


async def test_aborted_and_failed_spools_leave_no_object_and_no_row(place: Place) -> None:
    store = await place.open(part_bytes=PART)
    try:
        async with store.open_spool() as spool:
            await spool.write(b"x" * (PART + 1024))
            assert len(place.uploads()) == 1  # a multipart upload is under way
            await spool.abort()
        with pytest.raises(RetentionError):
            async with store.open_spool() as spool:
                await spool.write("fine so far\n")
                await spool.write(b"\xff not UTF-8")
        with pytest.raises(RetentionError):
            async with store.open_spool() as spool:
                await spool.write("ends inside a character: ")
                await spool.write("é".encode()[:1])
                await spool.commit()
        assert await place.rows() == (0, 0, 0)
        assert place.keys() == [] and place.uploads() == []
    finally:
        await store.aclose()


async def test_a_cancelled_spool_aborts_its_upload_and_leaves_nothing(place: Place) -> None:
    import anyio

    store = await place.open(part_bytes=PART)
    written = 0
    under_way = anyio.Event()

    async def produce() -> None:
        nonlocal written
        async with store.open_spool() as spool:
            while True:
                await spool.write(b"y" * (1 << 20))
                written += 1
                if written == 7:  # past the first part: a multipart upload is under way
                    pending = await place.pool.fetchval("SELECT id FROM sidecar_managed_pending")
                    assert place.uploads() == [place.settings.key(pending)]
                    under_way.set()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(produce)
            await under_way.wait()
            tasks.cancel_scope.cancel()
        assert await place.rows() == (0, 0, 0)
        assert place.keys() == [] and place.uploads() == []
    finally:
        await store.aclose()


async def test_evicted_objects_go_with_their_rows(place: Place) -> None:
    store = await place.open(quota_bytes=200_000)
    try:
        old = await store.put("a\n" * 60_000)  # 120 kB, with marks
        new = await store.put("b\n" * 60_000)  # over the quota: `old` goes
        with pytest.raises(ManagedNotFound):
            await store.read_lines(old.id)
        assert place.keys() == [place.settings.key(new.id)]
        objects, marks, pending = await place.rows()
        assert (objects, pending) == (1, 0) and marks == 120_000 // (64 * 1024)
        assert (await store.stats()).evicted_quota == 1
    finally:
        await store.aclose()


async def test_one_cleanup_at_a_time(place: Place) -> None:
    store = await place.open(ttl_seconds=0.2)
    try:
        ref = await store.put("short-lived\n")
        await _sleep(0.3)
        async with place.pool.acquire() as other:  # another replica is cleaning up
            await other.execute("SELECT pg_advisory_lock($1)", LOCK_MANAGED_CLEANUP)
            assert await store.cleanup() == 0
            assert await store.stat(ref.id) == ref
            await other.execute("SELECT pg_advisory_unlock($1)", LOCK_MANAGED_CLEANUP)
        assert await store.cleanup() == 1
        assert place.keys() == [] and await place.rows() == (0, 0, 0)
    finally:
        await store.aclose()


async def test_an_upload_left_by_a_crash_is_swept(place: Place) -> None:
    store = await place.open(spool_grace_seconds=60)
    try:
        key = place.settings.key("m_" + "c" * 26)
        obstore.put(place.s3.client(), key, b"half an object")  # type: ignore[arg-type]
        await place.pool.execute(
            "INSERT INTO sidecar_managed_pending VALUES ($1, $2, extract(epoch from now()) "
            "- 61)", "m_" + "c" * 26, place.settings.location)
        fresh = place.settings.key("m_" + "d" * 26)  # a spool still running elsewhere
        obstore.put(place.s3.client(), fresh, b"in progress")  # type: ignore[arg-type]
        await place.pool.execute(
            "INSERT INTO sidecar_managed_pending VALUES ($1, $2, extract(epoch from now()))",
            "m_" + "d" * 26, place.settings.location)
        assert await store.cleanup() == 0
        assert place.keys() == [fresh]
        assert (await place.rows())[2] == 1
    finally:
        await store.aclose()


async def test_a_newer_schema_is_refused(place: Place) -> None:
    await (await place.open()).aclose()
    await place.pool.execute(
        "UPDATE sidecar_schema SET version = 99 WHERE component = 'managed_store'")
    with pytest.raises(ManagedStoreError, match="schema is version 99"):
        await place.open()


async def test_an_unreachable_object_store_is_a_clear_error(place: Place) -> None:
    settings = S3Settings.from_url("s3://nowhere/x", {"AWS_ENDPOINT_URL": "http://127.0.0.1:9",
                                                      "AWS_ACCESS_KEY_ID": "k",
                                                      "AWS_SECRET_ACCESS_KEY": "s"})
    with pytest.raises(ManagedStoreError, match=r"cannot reach the object store s3://nowhere/x"):
        await S3TextStore.open(place.pool, settings, cleanup_interval=math.inf)


def test_settings_come_from_the_url_and_the_usual_variables() -> None:
    env = {"AWS_ENDPOINT_URL": "http://127.0.0.1:8333", "AWS_ACCESS_KEY_ID": "key",
           "AWS_SECRET_ACCESS_KEY": "very-secret"}
    settings = S3Settings.from_url("s3://bucket/a/b/", env)
    assert (settings.bucket, settings.prefix, settings.region) == ("bucket", "a/b", "us-east-1")
    assert settings.key("m_x") == "a/b/m_x" and settings.location == "bucket/a/b"
    assert "very-secret" not in repr(settings)
    assert S3Settings.from_url("s3://bucket", {"AWS_REGION": "eu-west-1"}).region == "eu-west-1"
    assert S3Settings.from_url("s3://sidecar-tests", {}).prefix == ""
    for bad in ("bucket/prefix", "http://bucket/x", "s3:///x", "s3://bb/a//c", "s3://bb/../c",
                "s3://bucket/x?y=1", "s3://b/x", "s3://bucket:9000/x", "s3://bu cket/x"):
        with pytest.raises(ValueError):
            S3Settings.from_url(bad, env)
    with pytest.raises(ValueError, match="must not carry credentials") as refused:
        S3Settings.from_url("s3://key:hunter2@bucket/x", env)
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL"):
        S3Settings.from_url("s3://bucket", {"AWS_ENDPOINT_URL": "ftp://x"})


async def _sleep(seconds: float) -> None:
    import anyio

    await anyio.sleep(seconds)


async def test_the_daemon_keeps_managed_texts_on_s3_only_with_the_database(
        place: Place, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from sidecar.daemon.daemon import open_local_stores
    from sidecar.location.ports import StoreOptions
    from sidecar.stores.errors import DatabaseError

    location = f"s3://{place.settings.location}"
    for name, value in place.s3.env(location).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SIDECAR_DATABASE_URL", raising=False)
    options = StoreOptions(state_dir=tmp_path / "state", location="default", durable=True,
                           retention_seconds=3600, store_quota_bytes=1 << 30,
                           wal_cap_bytes=1 << 20)
    (tmp_path / "state").mkdir(mode=0o700)
    with pytest.raises(DatabaseError, match="SIDECAR_OBJECT_STORE needs SIDECAR_DATABASE_URL"):
        async with open_local_stores(options):
            pass
    monkeypatch.setenv("SIDECAR_DATABASE_URL", place.dsn)
    monkeypatch.setenv("SIDECAR_OBJECT_STORE", "s3:/bucket")
    with pytest.raises(DatabaseError, match="SIDECAR_OBJECT_STORE: object store 's3:/bucket'"):
        async with open_local_stores(options):
            pass
    monkeypatch.setenv("SIDECAR_OBJECT_STORE", location)
    async with open_local_stores(options) as stores:
        ref = await stores.managed.put("kept in the bucket\n")
        assert not (tmp_path / "state" / "managed").exists()
    # Written behind (the default): the upload may still run after `put`; closing waits for it.
    assert place.keys() == [place.settings.key(ref.id)]


def test_the_ranged_reader_reads_as_a_file_does(s3_server: S3Server) -> None:
    """Seeks, reads, readlines and iteration on a 6 MiB object (past the bytes a reader keeps
    behind it) give what the same calls give on the bytes in memory."""
    import io
    import random

    from managed_store.s3.objects import RangedReader

    rng = random.Random(31)
    data = b"".join(b"%d %s\n" % (i, b"w" * rng.randrange(0, 3000)) for i in range(4000))
    assert len(data) > 5 * 1024 * 1024
    client = s3_server.client()
    key = f"{s3_server.new_location().split('/', 3)[3]}/reader"
    obstore.put(client, key, data)  # type: ignore[arg-type]
    reader = RangedReader(client, key, len(data))  # type: ignore[arg-type]
    memory = io.BytesIO(data)
    for step in range(300):
        action = rng.choice(("seek", "read", "readline", "prefetch", "big"))
        if action == "seek":
            position = rng.randrange(0, len(data) + 10)
            assert reader.seek(position) == memory.seek(position)
        elif action == "read":
            size = rng.randrange(0, 200_000)
            assert reader.read(size) == memory.read(size), step
        elif action == "readline":
            assert reader.readline() == memory.readline(), step
        elif action == "prefetch":
            start = rng.randrange(0, len(data))
            reader.prefetch(start, start + rng.randrange(1, 300_000))
        else:
            assert reader.read(5_000_000) == memory.read(5_000_000), step
        assert reader.tell() == memory.tell()
    for start in (0, 1_234_567, len(data) - 3000):
        lines = RangedReader(client, key, len(data))  # type: ignore[arg-type]
        lines.seek(start)
        assert list(lines) == list(io.BytesIO(data[start:]))
    obstore.put(client, key + "-unended", data[:-1])  # type: ignore[arg-type]
    unended = RangedReader(client, key + "-unended", len(data) - 1)  # type: ignore[arg-type]
    assert list(unended) == list(io.BytesIO(data[:-1]))  # the last line has no newline


async def _alive(store: S3TextStore, *refs: str) -> list[bool]:
    alive = []
    for ref in refs:
        try:
            await store.stat(ref)
            alive.append(True)
        except ManagedNotFound:
            alive.append(False)
    return alive


async def test_owner_shares_hold_for_the_fleet(place: Place) -> None:
    """The local store's per-owner rules (tests/managed_store/test_store_owners.py) on S3, with two
    stores (replicas) writing for the owners."""
    a = await place.open(quota_bytes=100)  # share: 50 bytes
    other_pool = await asyncpg.create_pool(place.dsn, min_size=1, max_size=2)
    b = await S3TextStore.open(other_pool, place.settings, quota_bytes=100,
                               cleanup_interval=math.inf)
    try:
        victim = (await a.put("v" * 30, owner="session:a")).id
        flood = [(await (a, b)[i % 2].put(str(i) * 20, owner="session:b")).id
                 for i in range(8)]
        # b may hold 50 bytes: its two newest stay, each new one evicted its own oldest
        assert await _alive(a, victim, *flood) == [True, *[False] * 6, True, True]
        assert await a.stats() == StoreStats(count=3, bytes=70)
        async with b.open_spool(owner="session:b") as spool:
            await spool.write("s" * 25)
            flood.append((await spool.commit()).id)
        assert await _alive(b, victim, *flood[-3:]) == [True, False, True, True]
        with pytest.raises(OwnerShareExceeded, match=r"over the per-owner share"):
            await a.put("x" * 51, owner="session:c")
        with pytest.raises(OwnerShareExceeded):
            async with b.open_spool(owner="session:c") as spool:
                await spool.write("y" * 51)
                await spool.commit()
        assert await place.rows() == (3, 0, 0)
        assert len(place.keys()) == 3  # the evicted and the refused left no bytes
    finally:
        await b.aclose()
        await a.aclose()
        await other_pool.close()


async def test_owner_limits_hold_for_the_fleet(place: Place) -> None:
    """Owners' own limits in place of the share (the per-user `store_bytes` quota), set on
    each replica's store, over the location's holdings in PostgreSQL."""
    limits = OwnerLimits()
    limits.set({"user:alice": 30}, {"user:": 60})
    a = await place.open(quota_bytes=200, owner_share=0.25, owner_limits=limits)  # share: 50
    b = await place.open(quota_bytes=200, owner_share=0.25)
    b.owner_limits.set({"user:alice": 30}, {"user:": 60})
    try:
        other = (await a.put("s" * 40, owner="session:x")).id
        bob = (await b.put("b" * 55, owner="user:bob")).id  # the prefix's 60, over the share
        alice = [(await (a, b)[i % 2].put(str(i) * 12, owner="user:alice")).id
                 for i in range(4)]
        assert await _alive(a, other, bob, *alice) == [True, True, False, False, True, True]
        with pytest.raises(OwnerLimitExceeded, match=r"limit of user:alice in the store "
                           r"\(30 bytes\)"):
            await b.put("x" * 31, owner="user:alice")
        with pytest.raises(OwnerLimitExceeded):
            async with a.open_spool(owner="user:alice") as spool:
                await spool.write("y" * 31)
                await spool.commit()
        assert await b.owner_usage() == {"user:alice": (24, 30), "user:bob": (55, 60)}
        assert await place.rows() == (4, 0, 0)
    finally:
        await b.aclose()
        await a.aclose()


async def test_a_full_quota_evicts_the_largest_holders_oldest_first(place: Place) -> None:
    store = await place.open(quota_bytes=100)
    try:
        a1 = (await store.put("a" * 20, owner="a")).id
        b1 = (await store.put("b" * 30, owner="b")).id
        a2 = (await store.put("a" * 25, owner="a")).id
        c1 = (await store.put("c" * 30, owner="c")).id  # 105: a holds the most (45)
        assert await _alive(store, a1, b1, a2, c1) == [False, True, True, True]
        # 125: b and c hold the most that can be evicted (30 each), b's object is older
        n1 = (await store.put("n" * 40)).id
        assert await _alive(store, b1, a2, c1, n1) == [False, True, True, True]
        with pytest.raises(ValueError, match="owner must be"):
            await store.put("x", owner="")
    finally:
        await store.aclose()


async def test_an_index_from_before_owners_is_migrated(place: Place) -> None:
    """Schema version 1 (no owners) migrates to the newest at open; its objects stay
    readable (and are in the bucket: nothing of version 1 is staged)."""
    from managed_store.s3.index import MIGRATIONS

    async with place.pool.acquire() as conn:
        await conn.execute(MIGRATIONS[1])
        await conn.execute("CREATE TABLE sidecar_schema (component TEXT PRIMARY KEY, "
                           "version INTEGER NOT NULL)")
        await conn.execute("INSERT INTO sidecar_schema VALUES ('managed_store', 1)")
        await conn.execute(
            "INSERT INTO sidecar_managed_objects VALUES ($1, $2, 'default', 4, 1, "
            "extract(epoch from now()))",
            "m_" + "o" * 26, place.settings.location)
    obstore.put(place.s3.client(), place.settings.key("m_" + "o" * 26), b"old\n")  # type: ignore[arg-type]
    store = await place.open(quota_bytes=60)
    try:
        assert (await store.read_lines("m_" + "o" * 26)).text == "old\n"
        mine = (await store.put("m" * 25, owner="a")).id
        assert await _alive(store, "m_" + "o" * 26, mine) == [True, True]
        assert await place.pool.fetchval(
            "SELECT version FROM sidecar_schema WHERE component = 'managed_store'") == 3
        assert await place.pool.fetchval(
            "SELECT staged_in FROM sidecar_managed_objects WHERE id = $1", "m_" + "o" * 26) is None
    finally:
        await store.aclose()

"""Managed store (`TextStore`) contract: complete texts by opaque id, read back by lines,
bytes or grep, streamed in through a spool (commit or abort), kept across a restart, evicted
oldest first under the quota and after the retention period; bad ids are errors, never paths."""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager as AsyncContextManager
from pathlib import Path
from typing import Protocol

import anyio
import pytest

from managed_store import InvalidRef, ManagedNotFound, ManagedStore, StoreStats, TextStore
from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server

pytestmark = pytest.mark.anyio


class OpenStore(Protocol):
    def __call__(
        self, *, ttl_seconds: float = math.inf, quota_bytes: int = 1 << 30
    ) -> Awaitable[TextStore]: ...


@contextlib.asynccontextmanager
async def _directory(tmp_path: Path, request: pytest.FixtureRequest
                     ) -> AsyncIterator[OpenStore]:
    def open_store(*, ttl_seconds: float = math.inf, quota_bytes: int = 1 << 30
                   ) -> Awaitable[TextStore]:
        return ManagedStore.open(tmp_path / "managed", ttl_seconds=ttl_seconds,
                                 quota_bytes=quota_bytes, cleanup_interval=math.inf)
    yield open_store


@contextlib.asynccontextmanager
async def _s3(tmp_path: Path, request: pytest.FixtureRequest, *, behind: bool = False
              ) -> AsyncIterator[OpenStore]:
    """A fresh prefix on the session's SeaweedFS (tests/fleet/s3.py), indexed in a fresh
    database on the session's PostgreSQL (tests/fleet/postgres.py). `behind`: writing behind,
    commits return once the object is in a staging directory (reads on the same store use it
    until the upload ends; reopening uploads what is left)."""
    import asyncpg

    from managed_store.s3 import S3Settings, S3TextStore

    postgres: PostgresServer = request.getfixturevalue("postgres_server")
    s3: S3Server = request.getfixturevalue("s3_server")
    settings = S3Settings.from_url(s3.new_location(), s3.env(""))
    pool = await asyncpg.create_pool(await postgres.new_database(), min_size=1, max_size=4)

    def open_store(*, ttl_seconds: float = math.inf, quota_bytes: int = 1 << 30
                   ) -> Awaitable[TextStore]:
        return S3TextStore.open(pool, settings, ttl_seconds=ttl_seconds,
                                quota_bytes=quota_bytes, cleanup_interval=math.inf,
                                staging_dir=tmp_path / "staging" if behind else None)
    try:
        yield open_store
    finally:
        await pool.close()


IMPLEMENTATIONS: list[object] = [pytest.param(_directory, id="directory"),
                                 pytest.param(_s3, id="s3-through"),
                                 pytest.param(functools.partial(_s3, behind=True),
                                              id="s3-behind")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens the same store anew on each call (one open at a time); all closed at the end."""
    make: Callable[[Path, pytest.FixtureRequest], AsyncContextManager[OpenStore]] = (
        request.param)
    opened: list[TextStore] = []
    async with make(tmp_path, request) as inner:

        async def open_one(*, ttl_seconds: float = math.inf, quota_bytes: int = 1 << 30
                           ) -> TextStore:
            store = await inner(ttl_seconds=ttl_seconds, quota_bytes=quota_bytes)
            opened.append(store)
            return store

        try:
            yield open_one  # type: ignore[misc]
        finally:
            for store in opened:
                await store.aclose()


TEXT = "".join(f"line {i} of the log\n" for i in range(1, 101))


async def test_put_then_read_lines_bytes_and_stat(open_store: OpenStore) -> None:
    store = await open_store()
    ref = await store.put(TEXT, namespace="loc")
    assert (ref.size_bytes, ref.lines, ref.namespace) == (len(TEXT), 100, "loc")
    page = await store.read_lines(ref.id, offset=10, limit=3)
    assert page.text == "line 10 of the log\nline 11 of the log\nline 12 of the log\n"
    assert (page.first_line, page.last_line, page.eof) == (10, 12, False)
    last = await store.read_lines(ref.id, offset=99, limit=10)
    assert last.text == "line 99 of the log\nline 100 of the log\n" and last.eof
    head = await store.read_bytes(ref.id, offset=0, limit=len("line 1 of the log\n"))
    assert head.text == "line 1 of the log\n"
    assert await store.stat(ref.id) == ref


async def test_grep_finds_lines_with_context(open_store: OpenStore) -> None:
    store = await open_store()
    ref = await store.put(TEXT)
    result = await store.grep(ref.id, r"line 5\d ", max_matches=3, context=1)
    assert [m.line for m in result.matches] == [50, 51, 52] and result.truncated
    assert result.matches[0].text == "line 50 of the log"
    assert result.matches[0].before == ("line 49 of the log",)


async def test_text_is_kept_exactly(open_store: OpenStore) -> None:
    store = await open_store()
    text = "naïve café — 日本語 🙂\r\nno newline at the end"
    ref = await store.put(text)
    whole = await store.read_bytes(ref.id, offset=0, limit=1 << 20)
    assert whole.text == text and whole.eof
    assert ref.size_bytes == len(text.encode())


async def test_a_spool_commits_once_whole(open_store: OpenStore) -> None:
    store = await open_store()
    async with store.open_spool(namespace="loc") as spool:
        for i in range(1, 101):
            await spool.write(f"line {i} of the log\n")
        ref = await spool.commit()
    assert (await store.read_bytes(ref.id, 0, 1 << 20)).text == TEXT
    assert (await store.stats()).count == 1


async def test_an_aborted_spool_leaves_nothing(open_store: OpenStore) -> None:
    store = await open_store()
    before = await store.stats()
    async with store.open_spool() as spool:
        await spool.write("partial output\n")
        await spool.abort()
    with pytest.raises(RuntimeError):
        async with store.open_spool() as spool:
            await spool.write("a spool left by an error\n")
            raise RuntimeError("producer failed")
    assert await store.stats() == before


async def test_texts_survive_a_restart(open_store: OpenStore) -> None:
    store = await open_store()
    refs = [await store.put(f"text {i}\n" * (i + 1)) for i in range(5)]
    await store.aclose()
    reopened = await open_store()
    for i, ref in enumerate(refs):
        assert (await reopened.read_lines(ref.id)).text == f"text {i}\n" * (i + 1)
    assert (await reopened.stats()).count == 5


async def test_the_quota_evicts_oldest_first(open_store: OpenStore) -> None:
    store = await open_store(quota_bytes=100)
    a = await store.put("a" * 40)
    b = await store.put("b" * 40)
    c = await store.put("c" * 40)  # 120 > 100: the oldest goes
    with pytest.raises(ManagedNotFound):
        await store.stat(a.id)
    assert [await store.stat(r.id) for r in (b, c)] == [b, c]
    await store.put("d" * 70)  # needs 70: b and c go
    assert await store.stats() == StoreStats(count=1, bytes=70)


async def test_every_engine_takes_an_owner(open_store: OpenStore) -> None:
    """`owner=` is part of the contract: every engine accepts it (the directory engine also
    enforces per-owner shares: tests/managed_store/test_store_owners.py)."""
    store = await open_store(quota_bytes=1000)
    put = await store.put("a" * 40, owner="session:a")
    async with store.open_spool(owner="token:b") as spool:
        await spool.write("b" * 40)
        spooled = await spool.commit()
    assert [await store.stat(r.id) for r in (put, spooled)] == [put, spooled]


async def test_retention_expires_old_texts(open_store: OpenStore) -> None:
    store = await open_store(ttl_seconds=0.2)
    old = await store.put("short-lived")
    await anyio.sleep(0.3)
    fresh = await store.put("fresh")
    assert await store.cleanup() == 1
    with pytest.raises(ManagedNotFound):
        await store.read_lines(old.id)
    assert (await store.read_lines(fresh.id)).text == "fresh"


async def test_ids_are_opaque_and_checked(open_store: OpenStore) -> None:
    store = await open_store()
    ref = await store.put("x")
    assert "/" not in ref.id and ".." not in ref.id
    for bad in ("../../etc/passwd", "/etc/passwd", "", "x" * 500):
        with pytest.raises(InvalidRef):
            await store.read_lines(bad)
    unknown = ref.id[:-4] + ("0000" if not ref.id.endswith("0000") else "1111")
    with pytest.raises(ManagedNotFound):
        await store.stat(unknown)

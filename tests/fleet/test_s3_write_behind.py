"""`S3TextStore` writing behind (`staging_dir=`): a commit returns once the object is in the
store's staging directory and indexed as staged, and the upload ends in the background.

The upload is held back for real: the session's SeaweedFS process is paused (SIGSTOP) and
resumed (SIGCONT). Store A writes behind; store B (another replica: its own pool, no staging)
reads what A committed."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import math
import os
import signal
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import obstore
import pytest

from managed_store import ManagedNotFound, ManagedStoreError, StagedStats
from managed_store.s3 import S3Settings, S3TextStore, WriteSettings
from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server

pytestmark = pytest.mark.anyio

PART = 5 * 1024 * 1024
BEAT = 0.1
READER_BEAT = 1.0
"""Store B's heartbeat: B takes A for stopped once A renewed nothing for three of them. 3 s, so
that A's renewals running late on a loaded machine are not taken for a stop; the test of a
stopped A gives B `BEAT` (0.3 s)."""


@dataclass
class Fleet:
    pool: asyncpg.Pool
    settings: S3Settings
    s3: S3Server
    dsn: str
    tmp: Path

    async def writer(self, name: str = "a", **options: Any) -> S3TextStore:
        """A store writing behind from `<tmp>/<name>`, as replica `replica-<name>`."""
        options.setdefault("cleanup_interval", math.inf)
        options.setdefault("heartbeat_seconds", BEAT)
        return await S3TextStore.open(self.pool, self.settings, staging_dir=self.tmp / name,
                                      replica=f"replica-{name}", **options)

    def staged_files(self, name: str = "a") -> list[str]:
        return sorted(p.name for p in (self.tmp / name).glob("*/objects/*"))

    async def staged_in(self, ref_id: str) -> str | None:
        value = await self.pool.fetchval(
            "SELECT staged_in FROM sidecar_managed_objects WHERE id = $1", ref_id)
        return None if value is None else str(value)

    def exists(self, ref_id: str) -> bool:
        try:
            obstore.head(self.s3.client(), self.settings.key(ref_id))  # type: ignore[arg-type]
        except FileNotFoundError:
            return False
        return True

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """SeaweedFS stopped (every request to it waits) until the block ends."""
        os.kill(self.s3.process.pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(self.s3.process.pid, signal.SIGCONT)


@pytest.fixture
async def fleet(postgres_server: PostgresServer, s3_server: S3Server, tmp_path: Path
                ) -> AsyncIterator[Fleet]:
    settings = S3Settings.from_url(s3_server.new_location(), s3_server.env(""))
    dsn = await postgres_server.new_database()
    pool = await asyncpg.create_pool(dsn, min_size=1, max_size=4)
    try:
        yield Fleet(pool, settings, s3_server, dsn, tmp_path)
    finally:
        await pool.close()


@contextlib.asynccontextmanager
async def _reader(fleet: Fleet, **options: Any) -> AsyncIterator[S3TextStore]:
    """Store B: another replica on the same bucket and database (write-through, own pool)."""
    pool = await asyncpg.create_pool(fleet.dsn, min_size=1, max_size=2)
    try:
        options.setdefault("heartbeat_seconds", READER_BEAT)
        store = await S3TextStore.open(pool, fleet.settings, cleanup_interval=math.inf,
                                       **options)
        try:
            yield store
        finally:
            await store.aclose()
    finally:
        await pool.close()


def _lines(count: int, tag: str = "row") -> str:
    return "".join(f"{tag} {i} of the output\n" for i in range(1, count + 1))


async def test_a_ref_is_read_on_its_store_at_once_and_on_another_after_the_upload(
        fleet: Fleet) -> None:
    text = _lines(300_000)  # 6.6 MB: a multipart upload (5 MiB parts)
    a = await fleet.writer(part_bytes=PART)
    try:
        async with _reader(fleet) as b:
            with fleet.paused():
                ref = await a.put(text)  # returns although nothing can reach the bucket
                assert await fleet.staged_in(ref.id) is not None
                assert fleet.staged_files() == [ref.id]
                # on A: from the staging file
                assert (await a.read_lines(ref.id, 123_456, 2)).text == \
                    "row 123456 of the output\nrow 123457 of the output\n"
                assert [m.line for m in (await a.grep(ref.id, "^row 29999[89] ")).matches] == \
                    [299_998, 299_999]
                assert (await a.read_chars(ref.id, 7, 4, 1)).text == "7"
                assert await b.stat(ref.id) == ref  # the index answers at once
                # on B: the read waits for the upload
                read = asyncio.create_task(b.read_lines(ref.id, 299_999, 5))
                await asyncio.sleep(0.5)
                assert not read.done()
            page = await read
            assert page.text == "row 299999 of the output\nrow 300000 of the output\n"
            assert page.eof
            assert await fleet.staged_in(ref.id) is None
            assert fleet.exists(ref.id)
            assert fleet.staged_files() == []
            assert fleet.s3.uploads_in_progress(fleet.settings.prefix) == []
    finally:
        await a.aclose()


async def test_a_read_elsewhere_fails_clearly_when_the_uploading_store_stopped(
        fleet: Fleet) -> None:
    """A stops hard (its pool is closed under it: no aclose, no more heartbeats); B's read
    fails once A's rows are a few heartbeats old, naming the object and A."""
    pool_a = await asyncpg.create_pool(fleet.dsn, min_size=1, max_size=2)
    a = await S3TextStore.open(pool_a, fleet.settings, cleanup_interval=math.inf,
                               staging_dir=fleet.tmp / "a", replica="replica-a",
                               heartbeat_seconds=BEAT, close_wait_seconds=0)
    try:
        async with _reader(fleet, read_wait_seconds=60, heartbeat_seconds=BEAT) as b:
            with fleet.paused():
                ref = await a.put(_lines(1000))
                pool_a.terminate()
                with pytest.raises(ManagedStoreError) as failed:
                    await b.read_lines(ref.id)
            message = str(failed.value)
            assert ref.id in message and "replica-a" in message
            assert "stopped before its upload completed" in message
            # the same from every reading method
            with pytest.raises(ManagedStoreError, match="stopped before its upload"):
                await b.grep(ref.id, "row")
    finally:
        await a.aclose()


async def test_a_read_elsewhere_waits_at_most_the_read_wait(fleet: Fleet) -> None:
    a = await fleet.writer()
    try:
        async with _reader(fleet, read_wait_seconds=0.3) as b:
            with fleet.paused():
                ref = await a.put(_lines(10))
                with pytest.raises(ManagedStoreError, match=r"still being uploaded by replica "
                                                            r"replica-a after 0\.3 s"):
                    await b.read_bytes(ref.id)
                reading = asyncio.create_task(b.read_lines(ref.id))
                await asyncio.sleep(0.1)
                reading.cancel()  # a waiting read is cancellable
                with pytest.raises(asyncio.CancelledError):
                    await reading
            assert (await b.read_lines(ref.id, 10)).text == "row 10 of the output\n"
    finally:
        await a.aclose()


async def test_a_store_reopened_on_the_same_staging_directory_resumes_the_upload(
        fleet: Fleet) -> None:
    a = await fleet.writer(close_wait_seconds=0)
    with fleet.paused():
        ref = await a.put(_lines(2000))
        await a.aclose()  # gives up on the upload at once: the file stays
    assert fleet.staged_files() == [ref.id]
    assert await fleet.staged_in(ref.id) is not None
    [staging] = list((fleet.tmp / "a").iterdir())
    stray = staging / "objects" / ("m_" + "s" * 26)
    stray.write_text("a spool cut short by a crash: no row names it\n")
    async with _reader(fleet) as b:
        again = await fleet.writer()
        try:
            assert not stray.exists()
            assert (await b.read_lines(ref.id, 2000)).text == "row 2000 of the output\n"
            assert await fleet.staged_in(ref.id) is None
        finally:
            await again.aclose()
    assert fleet.staged_files() == []


async def test_stats_say_what_waits_here_for_its_upload_and_why(fleet: Fleet) -> None:
    """`stats().staged` (health's `store.staged`): objects committed here and not uploaded,
    their bytes, the oldest commit's age; an upload that fails (a request timing out at the
    paused bucket) is counted as retrying with its error, until an attempt succeeds."""
    hurried = dataclasses.replace(fleet.settings, request_timeout=1.0, max_retries=0)
    a = await S3TextStore.open(fleet.pool, hurried, staging_dir=fleet.tmp / "a",
                               replica="replica-a", cleanup_interval=math.inf,
                               heartbeat_seconds=BEAT)
    try:
        async with _reader(fleet) as b:
            assert (await b.stats()).staged is None  # write-through: nothing is staged
            nothing = (await a.stats()).staged
            assert nothing == StagedStats(objects=0, bytes=0, oldest_seconds=0.0)
            with fleet.paused():
                first = await a.put(_lines(2000))
                second = await a.put(_lines(3000, tag="two"))
                staged = (await a.stats()).staged
                assert staged is not None
                assert (staged.objects, staged.bytes) == \
                    (2, first.size_bytes + second.size_bytes)
                assert staged.oldest_seconds >= 0
                async with asyncio.timeout(60):  # a hang guard: each request times out in 1 s
                    while True:
                        staged = (await a.stats()).staged
                        if staged is not None and staged.retrying == 2:
                            break
                        await asyncio.sleep(0.1)
                assert staged.objects == 2 and staged.last_error is not None
                assert "PUT" in staged.last_error and "error sending request" in \
                    staged.last_error
            async with asyncio.timeout(60):  # the next attempts go through
                while True:
                    staged = (await a.stats()).staged
                    if staged is None or not staged.objects:
                        break
                    await asyncio.sleep(0.1)
            assert staged == StagedStats(objects=0, bytes=0, oldest_seconds=0.0)
            assert (await b.read_lines(second.id, 3000)).text == "two 3000 of the output\n"
    finally:
        await a.aclose()


async def test_closing_finishes_the_uploads_first(fleet: Fleet) -> None:
    a = await fleet.writer()
    refs = [await a.put(_lines(500, tag=f"t{i}")) for i in range(5)]
    await a.aclose()
    assert fleet.staged_files() == []
    assert [await fleet.staged_in(r.id) for r in refs] == [None] * 5
    assert all(fleet.exists(r.id) for r in refs)


async def test_past_the_staging_cap_a_commit_waits_for_its_own_upload(fleet: Fleet) -> None:
    a = await fleet.writer(staging_bytes=100_000)
    try:
        with fleet.paused():
            small = await a.put(_lines(2000))  # 46 kB: staged
            assert await fleet.staged_in(small.id) is not None
            over = asyncio.create_task(a.put(_lines(3000, tag="big")))  # 46 + 70 kB > cap
            await asyncio.sleep(0.5)
            assert not over.done()
        big = await over
        assert await fleet.staged_in(big.id) is None  # written through
        assert fleet.exists(big.id)
    finally:
        await a.aclose()


async def test_evicting_an_object_still_uploading_stops_its_upload(fleet: Fleet) -> None:
    a = await fleet.writer(quota_bytes=9 * 1024 * 1024, part_bytes=PART)
    try:
        async with _reader(fleet) as b:
            with fleet.paused():
                old = await a.put(_lines(300_000, tag="old"))  # 7.5 MB, multipart
                assert fleet.staged_files() == [old.id]
                new = asyncio.create_task(a.put(_lines(100_000, tag="new")))  # evicts `old`
                await asyncio.sleep(0.3)
            new_ref = await new
            assert fleet.staged_files() in ([new_ref.id], [])
            with pytest.raises(ManagedNotFound):
                await a.read_lines(old.id)
            assert (await b.read_lines(new_ref.id, 100_000)).text == \
                "new 100000 of the output\n"
            assert not fleet.exists(old.id)
            assert await fleet.pool.fetchval(
                "SELECT count(*) FROM sidecar_managed_pending") == 0
    finally:
        await a.aclose()


async def test_a_long_spool_uploads_its_parts_while_it_writes_and_an_abort_stops_them(
        fleet: Fleet) -> None:
    a = await fleet.writer(part_bytes=PART)
    try:
        async with a.open_spool() as spool:
            await spool.write(b"z" * (PART + 1024) + b"\n")
            for _ in range(200):  # the head start (0.5 s), then the first part goes up
                if fleet.s3.uploads_in_progress(fleet.settings.prefix):
                    break
                await asyncio.sleep(0.05)
            [key] = fleet.s3.uploads_in_progress(fleet.settings.prefix)
            [staged] = fleet.staged_files()
            assert key == fleet.settings.key(staged)
            await spool.abort()
        assert fleet.s3.uploads_in_progress(fleet.settings.prefix) == []
        assert fleet.staged_files() == []
        assert await fleet.pool.fetchval("SELECT count(*) FROM sidecar_managed_pending") == 0
    finally:
        await a.aclose()


async def test_a_close_cancelled_by_its_scope_has_released_the_staging_directory(
        fleet: Fleet) -> None:
    """An anyio cancel scope cancels every await of the close again: the close still ends
    (spools aborted, staging directory released) before the cancellation reaches the scope
    (it used to stop at its first spool abort, keeping the directory locked)."""
    a = await fleet.writer()
    async with a.open_spool() as spool:
        await spool.write(_lines(100))
        with anyio.CancelScope() as scope:
            scope.cancel()
            await a.aclose()
        assert scope.cancelled_caught
    assert fleet.staged_files() == []
    assert await fleet.pool.fetchval("SELECT count(*) FROM sidecar_managed_pending") == 0
    again = await fleet.writer()  # the directory is free again
    await again.aclose()


async def test_an_abandon_cancelled_by_its_scope_has_stopped_the_upload_and_deleted_the_file(
        fleet: Fleet) -> None:
    """`Staging.abandon` (what a cleanup evicting an object still uploading here runs) under a
    cancelled scope: the upload has ended and its file is gone when the cancellation reaches
    the scope (a shielded wait used to return at once, leaving both)."""
    a = await fleet.writer()
    try:
        with fleet.paused():
            ref = await a.put(_lines(100))  # its upload waits for the paused bucket
            assert fleet.staged_files() == [ref.id]
            staging = a._staging  # no public path reaches abandon in the caller's own task
            assert staging is not None
            with anyio.CancelScope() as scope:
                scope.cancel()
                await staging.abandon([ref.id])
            assert scope.cancelled_caught
            assert fleet.staged_files() == []
            assert (await a.stats()).staged == StagedStats(objects=0, bytes=0,
                                                           oldest_seconds=0.0)
    finally:
        await a.aclose()


async def test_one_store_at_a_time_on_a_staging_directory(fleet: Fleet) -> None:
    a = await fleet.writer()
    try:
        with pytest.raises(ManagedStoreError, match="is in use by another store"):
            await fleet.writer()
        [staging] = list((fleet.tmp / "a").iterdir())
        assert {p.name for p in staging.iterdir()} == {"id", "lock", "objects"}
        assert {oct(p.stat().st_mode & 0o777) for p in (staging, staging / "objects")} == \
            {"0o700"}
    finally:
        await a.aclose()


def test_the_write_settings_come_from_the_environment() -> None:
    assert WriteSettings.from_environ({}) == WriteSettings(
        behind=True, staging_bytes=1024**3, read_wait=120.0, close_wait=20.0)
    assert WriteSettings.from_environ({
        "SIDECAR_OBJECT_STORE_WRITE": "Through", "SIDECAR_OBJECT_STORE_STAGING_BYTES": "512M",
        "SIDECAR_OBJECT_STORE_READ_WAIT": "2m", "SIDECAR_OBJECT_STORE_CLOSE_WAIT": "5s",
    }) == WriteSettings(behind=False, staging_bytes=512 * 1024**2, read_wait=120.0,
                        close_wait=5.0)
    assert WriteSettings.from_environ({"SIDECAR_OBJECT_STORE_STAGING_BYTES": "0"}
                                      ).staging_bytes == 0  # every commit written through
    for name, value in (("SIDECAR_OBJECT_STORE_WRITE", "later"),
                        ("SIDECAR_OBJECT_STORE_STAGING_BYTES", "lots"),
                        ("SIDECAR_OBJECT_STORE_READ_WAIT", "-1"),
                        ("SIDECAR_OBJECT_STORE_CLOSE_WAIT", "soon")):
        with pytest.raises(ValueError, match=name):
            WriteSettings.from_environ({name: value})

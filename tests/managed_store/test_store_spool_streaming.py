"""Streaming into a spool: overlapping writes, newline counting, early writeback."""

from __future__ import annotations

import asyncio
import os
import random
import threading
from pathlib import Path

import pytest
from store_helpers import editor_lines, eventually, files_in

from managed_store import ManagedStore, RetentionError, StoreClosed
from managed_store.newlines import NUMPY_FROM, newlines_at
from managed_store.spool import WINDOW, WRITEBACK_BYTES

pytestmark = pytest.mark.anyio


def _spool_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("managed-store-spool")]


@pytest.mark.parametrize("size", [0, 1, NUMPY_FROM - 1, NUMPY_FROM, 3 * NUMPY_FROM + 17])
@pytest.mark.parametrize("density", [0.0, 0.02, 0.5, 1.0])
def test_newlines_at_every_cut_match_bytes_count(size: int, density: float) -> None:
    rng = random.Random(size * 7 + int(density * 100))
    data = bytes(10 if rng.random() < density else rng.choice(b"ab\r\xc3") for _ in range(size))
    cuts = sorted({0, size, *(rng.randrange(size + 1) for _ in range(20))})
    expected = [data[:cut].count(b"\n") for cut in cuts] + [data.count(b"\n")]
    assert newlines_at(data, cuts) == expected
    assert newlines_at(data, []) == [data.count(b"\n")]


async def test_overlapping_writes_land_in_call_order(store: ManagedStore) -> None:
    rng = random.Random(3)
    pieces = ["a", "é", "€", "\n", "line\n", "😀"]
    chunks: list[str | bytes] = []
    for n in range(24):
        text = "".join(rng.choice(pieces) for _ in range(rng.choice([1, 5_000, 400_000])))
        chunks.append(text if n % 2 else text.encode())
    chunks.append("x" * (2 * WINDOW + 5) + "\n")  # one write of three windows among the rest
    async with store.open_spool() as spool:
        writes = [asyncio.create_task(spool.write(chunk)) for chunk in chunks]
        await asyncio.gather(*writes)
        assert _spool_threads(), "a streaming spool writes on its own thread"
        ref = await spool.commit()
    await eventually(lambda: not _spool_threads())

    data = b"".join(c if isinstance(c, bytes) else c.encode() for c in chunks)
    assert (ref.size_bytes, ref.lines) == (len(data), len(editor_lines(data)))
    whole = await store.read_bytes(ref.id, 0, len(data) + 1)
    assert whole.text.encode() == data
    middle = len(editor_lines(data)) // 2
    page = await store.read_lines(ref.id, offset=middle, limit=2)
    assert page.text.encode() == b"".join(editor_lines(data)[middle - 1 : middle + 1])


async def test_a_failing_write_among_overlapping_ones_aborts_the_spool(
    store: ManagedStore, root: Path
) -> None:
    async with store.open_spool() as spool:
        await spool.write(b"first\n")
        writes = [
            asyncio.create_task(spool.write(chunk))
            for chunk in (b"ok " * 100_000, b"bad \xff byte", b"after " * 100_000)
        ]
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert results[0] is None
        assert isinstance(results[1], RetentionError)
        assert "not valid UTF-8" in str(results[1])
        # Queued behind the failure: it finds the spool discarded, never a half-written file.
        assert isinstance(results[2], StoreClosed | RetentionError)
        with pytest.raises(StoreClosed, match="aborted"):
            await spool.commit()
    assert files_in(root) == []
    await eventually(lambda: not _spool_threads())


async def test_cancelling_a_queued_write_aborts_the_spool(store: ManagedStore, root: Path) -> None:
    async with store.open_spool() as spool:
        await spool.write("first\n")
        big = "y" * (8 * WINDOW)
        writes = [asyncio.create_task(spool.write(big)) for _ in range(3)]
        await asyncio.sleep(0)  # every write has queued its windows
        writes[1].cancel()
        results = await asyncio.gather(*writes, return_exceptions=True)
        assert isinstance(results[1], asyncio.CancelledError)
        with pytest.raises(StoreClosed, match="aborted"):
            await spool.write("more")
    assert files_in(root) == []
    await eventually(lambda: not _spool_threads())


async def test_a_spool_cancelled_by_its_scope_is_discarded_when_the_scope_exits(
    store: ManagedStore, root: Path
) -> None:
    """An anyio cancel scope cancels every await of the cleanup again: the discard still ends
    before the cancellation reaches the scope (a shielded discard used to be left running)."""
    import anyio

    under_way = anyio.Event()

    async def produce() -> None:
        async with store.open_spool() as spool:
            while True:
                await spool.write("y" * WINDOW)
                under_way.set()

    for _ in range(5):
        under_way = anyio.Event()
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(produce)
            await under_way.wait()
            tasks.cancel_scope.cancel()
        assert files_in(root) == []


async def test_a_large_object_is_written_back_as_it_streams(
    store: ManagedStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    advice: list[tuple[int, int, int]] = []
    real = os.posix_fadvise

    def spy(fd: int, offset: int, length: int, what: int) -> None:
        advice.append((offset, length, what))
        real(fd, offset, length, what)

    monkeypatch.setattr(os, "posix_fadvise", spy)
    line = b"%07d a line of text\n"
    chunk = b"".join(line % n for n in range(WINDOW // len(line % 0)))
    count = 3 * WRITEBACK_BYTES // len(chunk) + 2
    async with store.open_spool() as spool:
        for _ in range(count):
            await spool.write(chunk)
        ref = await spool.commit()

    assert ref.size_bytes == count * len(chunk)
    assert {what for _, _, what in advice} == {os.POSIX_FADV_DONTNEED}
    starts = [offset for offset, _, _ in advice]
    ends = [offset + length for offset, length, _ in advice]
    assert starts == [0, *ends[:-1]], "each range starts where the previous one ended"
    assert all(length >= WRITEBACK_BYTES for _, length, _ in advice)
    assert ref.size_bytes - ends[-1] < WRITEBACK_BYTES
    tail = await store.read_bytes(ref.id, ref.size_bytes - len(chunk), len(chunk))
    assert tail.text.encode() == chunk


async def test_closing_the_store_under_queued_writes_is_store_closed_not_cancelled(
    store: ManagedStore, root: Path
) -> None:
    spool = store.open_spool()
    await spool.__aenter__()
    await spool.write("first\n")
    big = "z" * (8 * WINDOW)
    writes = [asyncio.create_task(spool.write(big)) for _ in range(3)]
    await asyncio.sleep(0)  # every write has queued its windows
    await store.aclose()
    results = await asyncio.gather(*writes, return_exceptions=True)
    assert not any(isinstance(r, asyncio.CancelledError) for r in results), results
    assert any(isinstance(r, StoreClosed) for r in results), results
    await spool.__aexit__(None, None, None)
    assert files_in(root) == []
    await eventually(lambda: not _spool_threads())

"""Open/close, concurrency, and the promise that the event loop is never blocked."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import anyio
import pytest
from store_helpers import files_in, mode_of

from managed_store import ManagedStore, StoreClosed, StoreStats, TextStore

pytestmark = pytest.mark.anyio


def _cleanup_tasks() -> list[asyncio.Task[object]]:
    return [t for t in asyncio.all_tasks() if t.get_name().startswith("managed-store-cleanup")]


async def test_close_cancels_the_background_cleanup(root: Path) -> None:
    store = await ManagedStore.open(root, cleanup_interval=0.01)
    [task] = _cleanup_tasks()
    await anyio.sleep(0.05)  # let it run a few rounds
    await store.aclose()
    assert task.cancelled()
    assert _cleanup_tasks() == []
    await store.aclose()  # idempotent


async def test_use_after_close_is_refused(root: Path) -> None:
    async with await ManagedStore.open(root) as store:
        ref = await store.put("x")
    with pytest.raises(StoreClosed):
        await store.put("y")
    with pytest.raises(StoreClosed):
        await store.read_lines(ref.id)
    with pytest.raises(StoreClosed):
        await store.stats()
    with pytest.raises(StoreClosed):
        store.open_spool()
    async with await ManagedStore.open(root) as reopened:  # the lock was released
        assert (await reopened.read_lines(ref.id)).text == "x"


async def test_close_aborts_open_spools(root: Path) -> None:
    store = await ManagedStore.open(root)
    async with store.open_spool() as spool:
        await spool.write("never committed")
        await store.aclose()
        assert files_in(root) == []
        with pytest.raises(StoreClosed):
            await spool.write("more")


async def test_a_close_cancelled_by_its_scope_has_unlocked_the_root_when_the_scope_exits(
    root: Path,
) -> None:
    """An anyio cancel scope cancels every await of the close again: the close still ends
    (spools aborted, index closed, root unlocked) before the cancellation reaches the scope
    (it used to stop at its first await, leaving the root locked)."""
    store = await ManagedStore.open(root, cleanup_interval=0.01)
    async with store.open_spool() as spool:
        await spool.write("half a line")
        with anyio.CancelScope() as scope:
            scope.cancel()
            await store.aclose()
        assert scope.cancelled_caught
    assert files_in(root) == []
    async with await ManagedStore.open(root):  # the root is free again
        pass


async def test_50_concurrent_puts(store: ManagedStore) -> None:
    texts = [f"object {n}\n" * (n + 1) for n in range(50)]
    refs = await asyncio.gather(
        *(store.put(t, namespace=f"ns{n % 3}") for n, t in enumerate(texts))
    )
    assert len({r.id for r in refs}) == 50
    for ref, text in zip(refs, texts, strict=True):
        assert (await store.read_lines(ref.id, 1, 100)).text == text
        assert ref.lines == text.count("\n")
    assert await store.stats() == StoreStats(50, sum(len(t) for t in texts))


async def test_concurrent_readers_and_writers_with_evictions(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=20_000) as store:

        async def writer(n: int) -> None:
            for _ in range(10):
                ref = await store.put(f"{n}" * 1000)
                try:
                    await store.read_bytes(ref.id, 0, 10)
                    await store.grep(ref.id, str(n))
                except Exception as exc:  # evicted by another writer in between is fine
                    assert type(exc).__name__ == "ManagedNotFound"

        async with anyio.create_task_group() as tg:
            for n in range(8):
                tg.start_soon(writer, n)
        stats = await store.stats()
        assert stats.bytes <= 20_000
        assert len(files_in(root)) == stats.count


async def test_the_event_loop_stays_responsive(store: ManagedStore) -> None:
    text = "a fairly ordinary line of text, nothing to see here\n" * 800_000  # ~42 MB
    gaps: list[float] = []

    async def heartbeat() -> None:
        last = time.perf_counter()
        while True:
            await asyncio.sleep(0.005)
            now = time.perf_counter()
            gaps.append(now - last)
            last = now

    beat = asyncio.create_task(heartbeat())
    try:
        started = time.perf_counter()
        ref = await store.put(text)
        await store.read_lines(ref.id, 400_000, 50_000)
        await store.read_bytes(ref.id, 20_000_000, 5_000_000)
        await store.grep(ref.id, "needle")
        elapsed = time.perf_counter() - started
    finally:
        beat.cancel()
        await asyncio.wait([beat])
    # The work takes far longer than any single pause the loop saw. Relative, not absolute,
    # so a loaded machine cannot flake it: a blocking put or grep would stall the loop for
    # most of `elapsed`.
    assert max(gaps) < elapsed / 4, (max(gaps), elapsed)


async def test_the_store_is_a_text_store(store: ManagedStore) -> None:
    engine: TextStore = store
    ref = await engine.put("through the protocol")
    assert (await engine.read_lines(ref.id)).text == "through the protocol"


async def test_store_directories_are_private(store: ManagedStore, root: Path) -> None:
    assert (mode_of(root), mode_of(root / "objects")) == (0o700, 0o700)

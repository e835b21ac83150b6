"""What the store reports about its own upkeep: evictions by reason, and its index files'
size, with the index WAL emptied by every cleanup."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest

from managed_store import ManagedStore

pytestmark = pytest.mark.anyio


async def test_evictions_are_counted_by_reason(root: Path) -> None:
    async with await ManagedStore.open(root, ttl_seconds=0.2, quota_bytes=10,
                                       cleanup_interval=math.inf) as store:
        await store.put("123456")
        await store.put("abcdef")  # the first one goes to make room
        stats = await store.stats()
        assert (stats.count, stats.evicted_quota, stats.evicted_expired) == (1, 1, 0)
        await anyio.sleep(0.3)
        assert await store.cleanup() == 1
        stats = await store.stats()
        assert (stats.count, stats.evicted_quota, stats.evicted_expired) == (0, 1, 1)


async def test_cleanup_empties_the_index_wal(root: Path) -> None:
    async with await ManagedStore.open(root, cleanup_interval=math.inf) as store:
        for i in range(50):
            await store.put(f"text {i}\n" * 100)
        wal = root / "index.sqlite-wal"
        assert wal.stat().st_size > 0
        before = (await store.stats()).index_bytes
        await store.cleanup()
        assert wal.stat().st_size == 0
        after = await store.stats()
        assert after.index_bytes == (root / "index.sqlite").stat().st_size < before
        assert after.count == 50

"""TTL and quota eviction, oldest first; stats."""

from __future__ import annotations

import math
from pathlib import Path

import anyio
import pytest
from store_helpers import files_in

from managed_store import ManagedNotFound, ManagedStore, RetentionError, StoreStats

pytestmark = pytest.mark.anyio


async def test_stats_count_objects_and_bytes(store: ManagedStore) -> None:
    assert await store.stats() == StoreStats(count=0, bytes=0)
    await store.put("abc")
    await store.put("€")
    assert await store.stats() == StoreStats(count=2, bytes=6)


async def test_ttl_eviction_by_cleanup_and_at_open(root: Path) -> None:
    async with await ManagedStore.open(root, ttl_seconds=math.inf) as store:
        kept_by_open = await store.put("old, evicted at open")
    async with await ManagedStore.open(root, ttl_seconds=0.3) as store:
        old = await store.put("old, evicted by cleanup", namespace="other")
        assert (await store.stat(kept_by_open.id)).id == kept_by_open.id
        await anyio.sleep(0.4)
        fresh = await store.put("fresh")
        assert await store.cleanup() == 2
        for gone in (kept_by_open, old):
            with pytest.raises(ManagedNotFound):
                await store.read_lines(gone.id)
        assert (await store.read_lines(fresh.id)).text == "fresh"
        assert await store.cleanup() == 0
    async with await ManagedStore.open(root, ttl_seconds=math.inf) as store:
        old_at_open = await store.put("will be too old at the next open")
    await anyio.sleep(0.35)
    async with await ManagedStore.open(root, ttl_seconds=0.3) as store:
        with pytest.raises(ManagedNotFound):
            await store.stat(old_at_open.id)
        assert await store.stats() == StoreStats(0, 0)
    assert files_in(root) == []


async def test_background_cleanup_evicts_expired_objects(root: Path) -> None:
    async with await ManagedStore.open(root, ttl_seconds=0.2, cleanup_interval=0.05) as store:
        ref = await store.put("short-lived")
        with anyio.fail_after(3):
            while True:
                try:
                    await store.stat(ref.id)
                except ManagedNotFound:
                    break
                await anyio.sleep(0.05)
        assert files_in(root) == []


async def test_quota_evicts_oldest_first(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=100) as store:
        a = await store.put("a" * 40)
        b = await store.put("b" * 40)
        c = await store.put("c" * 40)  # 120 > 100: a goes
        with pytest.raises(ManagedNotFound):
            await store.stat(a.id)
        assert [await store.stat(r.id) for r in (b, c)] == [b, c]
        d = await store.put("d" * 70)  # needs 70: b and c go
        assert await store.stats() == StoreStats(1, 70)
        assert (await store.read_lines(d.id)).text == "d" * 70
        exact = await store.put("e" * 100)  # exactly the quota fits, alone
        assert await store.stats() == StoreStats(1, 100)
        assert files_in(root) == [f"{exact.id}.txt"]


async def test_quota_eviction_order_is_commit_order_even_for_tiny_objects(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=10) as store:
        refs = [await store.put(str(n)) for n in range(10)]
        newest = await store.put("x")  # evicts exactly refs[0]
        survivors = []
        for ref in [*refs, newest]:
            try:
                survivors.append((await store.stat(ref.id)).id)
            except ManagedNotFound:
                pass
        assert survivors == [r.id for r in refs[1:]] + [newest.id]


async def test_quota_impossible_fails_without_touching_anything(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=10) as store:
        kept = await store.put("0123456789")
        with pytest.raises(RetentionError, match="quota"):
            await store.put("x" * 11)
        with pytest.raises(RetentionError, match="quota"):
            await store.put("é" * 6)  # 6 characters but 12 bytes: caught while writing
        with pytest.raises(RetentionError, match="quota"):
            async with store.open_spool() as spool:
                await spool.write(b"12345")
                await spool.write("678901")
        assert await store.stat(kept.id) == kept  # nothing was evicted for a hopeless object
        assert files_in(root) == [f"{kept.id}.txt"]


async def test_cleanup_enforces_a_lowered_quota(root: Path) -> None:
    async with await ManagedStore.open(root) as store:
        refs = [await store.put("x" * 10) for _ in range(5)]
    async with await ManagedStore.open(root, quota_bytes=25) as store:
        assert await store.stats() == StoreStats(2, 20)
        assert [(await store.stat(r.id)).id for r in refs[3:]] == [r.id for r in refs[3:]]


async def test_open_validates_its_parameters(root: Path) -> None:
    with pytest.raises(ValueError, match="ttl_seconds"):
        await ManagedStore.open(root, ttl_seconds=0)
    with pytest.raises(ValueError, match="quota_bytes"):
        await ManagedStore.open(root, quota_bytes=-1)
    with pytest.raises(ValueError, match="cleanup_interval"):
        await ManagedStore.open(root, cleanup_interval=0)

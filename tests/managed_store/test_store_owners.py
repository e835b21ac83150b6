"""Per-owner shares of the quota: one owner storing a lot evicts its own objects, not the
others' (issue 26 item 6); owners' own limits in place of the share (`OwnerLimits`, the
per-user `store_bytes` quota of issue 45)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from managed_store import (
    ManagedNotFound,
    ManagedStore,
    OwnerLimitExceeded,
    OwnerLimits,
    OwnerShareExceeded,
    RetentionError,
    StoreStats,
)

pytestmark = pytest.mark.anyio


async def _alive(store: ManagedStore, *refs: str) -> list[bool]:
    alive = []
    for ref in refs:
        try:
            await store.stat(ref)
            alive.append(True)
        except ManagedNotFound:
            alive.append(False)
    return alive


async def test_a_flooding_owner_evicts_its_own_oldest_not_the_others(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=100) as store:  # share: 50 bytes
        victim = (await store.put("v" * 30, owner="session:a")).id
        flood = [(await store.put(str(i) * 20, owner="session:b")).id for i in range(8)]
        # b may hold 50 bytes: its two newest stay, each new one evicted its own oldest
        assert await _alive(store, victim, *flood) == [True, *[False] * 6, True, True]
        assert await store.stats() == StoreStats(count=3, bytes=70)
        spooled = store.open_spool(owner="session:b")
        async with spooled as spool:
            await spool.write("s" * 25)
            flood.append((await spool.commit()).id)
        assert await _alive(store, victim, *flood[-3:]) == [True, False, True, True]


async def test_one_object_over_the_owner_share_is_refused(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=100, owner_share=0.4) as store:
        kept = (await store.put("k" * 30, owner="session:b")).id
        with pytest.raises(RetentionError, match=r"over the per-owner share of the store "
                           r"quota \(40 bytes: 40% of 100\)"):
            await store.put("x" * 41, owner="session:b")
        spooled = store.open_spool(owner="session:b")
        with pytest.raises(RetentionError, match="per-owner share"):
            async with spooled as spool:
                await spool.write("y" * 41)
                await spool.commit()
        assert await _alive(store, kept) == [True]
        assert (await store.put("z" * 41)).size_bytes == 41  # no owner: the whole quota


async def test_an_owners_own_limit_replaces_the_share(root: Path) -> None:
    limits = OwnerLimits()
    limits.set({"user:alice": 30}, {"user:": 60})
    async with await ManagedStore.open(root, quota_bytes=200, owner_share=0.25,
                                       owner_limits=limits) as store:  # share: 50 bytes
        assert store.owner_limits is limits
        other = (await store.put("s" * 40, owner="session:x")).id
        bob = (await store.put("b" * 55, owner="user:bob")).id  # the prefix's 60, over the share
        alice = [(await store.put(str(i) * 12, owner="user:alice")).id for i in range(4)]
        # alice may hold 30 bytes: her two newest stay, each new one evicted her own oldest
        assert await _alive(store, other, bob, *alice) == [True, True, False, False, True, True]
        with pytest.raises(OwnerLimitExceeded) as refused:
            await store.put("x" * 31, owner="user:alice")
        assert isinstance(refused.value, OwnerShareExceeded)
        assert (refused.value.owner, refused.value.limit_bytes, refused.value.size_bytes) == (
            "user:alice", 30, 31)
        assert "over the limit of user:alice in the store (30 bytes)" in str(refused.value)
        with pytest.raises(OwnerLimitExceeded, match="user:alice"):
            async with store.open_spool(owner="user:alice") as spool:
                await spool.write("y" * 31)
                await spool.commit()
        assert await _alive(store, other, bob, *alice[2:]) == [True, True, True, True]
        assert await store.owner_usage() == {"user:alice": (24, 30), "user:bob": (55, 60)}
        limits.set({})  # replaced at runtime: the share again
        with pytest.raises(OwnerShareExceeded, match="per-owner share"):
            await store.put("b" * 51, owner="user:bob")
        assert (await store.put("z" * 45, owner="user:alice")).size_bytes == 45
        assert await store.owner_usage() == {}
        assert await _alive(store, other, bob) == [True, True]


def test_owner_limits_are_checked() -> None:
    limits = OwnerLimits()
    with pytest.raises(ValueError, match="'user:a' must be > 0"):
        limits.set({"user:a": 0})
    with pytest.raises(TypeError, match="must be an int"):
        limits.set({}, {"user:": True})
    limits.set({"user:a": 5}, {"user:": 9, "user:team-": 7})
    assert [limits.limit_of(o) for o in ("user:a", "user:b", "user:team-x", "session:s")] == [
        5, 9, 7, None]


async def test_a_full_quota_evicts_the_largest_holders_oldest_first(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=100) as store:
        a1 = (await store.put("a" * 20, owner="a")).id
        b1 = (await store.put("b" * 30, owner="b")).id
        a2 = (await store.put("a" * 25, owner="a")).id
        c1 = (await store.put("c" * 30, owner="c")).id  # 105: a holds the most (45)
        assert await _alive(store, a1, b1, a2, c1) == [False, True, True, True]
        # 125: b and c hold the most that can be evicted (30 each), b's object is older
        n1 = (await store.put("n" * 40)).id
        assert await _alive(store, b1, a2, c1, n1) == [False, True, True, True]


async def test_without_owners_eviction_stays_oldest_first(root: Path) -> None:
    async with await ManagedStore.open(root, quota_bytes=100) as store:
        refs = [(await store.put(str(i) * 30)).id for i in range(5)]
        assert await _alive(store, *refs) == [False, False, True, True, True]


async def test_owners_are_checked(store: ManagedStore) -> None:
    with pytest.raises(ValueError, match="owner must be"):
        await store.put("x", owner="")
    with pytest.raises(TypeError, match="owner must be str"):
        store.open_spool(owner=7)  # type: ignore[arg-type]


async def test_an_index_from_before_owners_opens_and_takes_owners(root: Path) -> None:
    async with await ManagedStore.open(root) as store:
        old = (await store.put("from before owners")).id
    index = root / "index.sqlite"
    # back to the version-1 table, without `owner`
    with contextlib.closing(sqlite3.connect(index)) as conn, conn:
        conn.execute("DROP INDEX objects_by_owner")
        conn.execute("ALTER TABLE objects DROP COLUMN owner")
        conn.execute("PRAGMA user_version=1")
    async with await ManagedStore.open(root, quota_bytes=60) as store:
        assert (await store.read_lines(old)).text == "from before owners"
        mine = (await store.put("m" * 25, owner="a")).id
        assert await _alive(store, old, mine) == [True, True]

"""Write failures leave nothing behind: real ENOSPC, invalid UTF-8, crashes, leftovers."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import anyio
import pytest
from store_helpers import REPO_ROOT, eventually, files_in

from managed_store import (
    ManagedNotFound,
    ManagedStore,
    ManagedStoreError,
    RetentionError,
    StoreClosed,
    StoreStats,
)

pytestmark = pytest.mark.anyio

ORPHAN_ID = "m_" + "z" * 26


async def test_disk_full_put_fails_cleanly_and_the_store_recovers(tiny_fs_root: Path) -> None:
    async with await ManagedStore.open(tiny_fs_root) as store:
        kept = await store.put("k" * 100_000)
        with pytest.raises(RetentionError, match="ENOSPC") as info:
            await store.put("x" * 300_000)
        assert isinstance(info.value.__cause__, OSError)
        assert files_in(tiny_fs_root) == [f"{kept.id}.txt"]
        assert await store.stats() == StoreStats(1, 100_000)
        assert (await store.read_bytes(kept.id, 99_990)).text == "k" * 10
        after = await store.put("y" * 100_000)  # the failed write's space came back
        assert (await store.stat(after.id)).size_bytes == 100_000


async def test_disk_full_in_a_spool_aborts_it(tiny_fs_root: Path) -> None:
    async with await ManagedStore.open(tiny_fs_root) as store:
        with pytest.raises(RetentionError, match="ENOSPC"):
            async with store.open_spool() as spool:
                for _ in range(100):
                    await spool.write(b"z" * 10_000)
        assert files_in(tiny_fs_root) == []
        with pytest.raises(StoreClosed, match="aborted"):
            await spool.write("more")
        assert await store.stats() == StoreStats(0, 0)


@pytest.mark.parametrize(
    ("chunks", "message"),
    [
        ([b"ok", b"\xff"], "not valid UTF-8"),
        ([b"ok\xe2\x82"], "ends inside a UTF-8 character"),
        ([b"\xe2\x82", "\u20ac"], "str chunk follows bytes"),
        ([b"ok\xe2\x82", b"abc"], "not valid UTF-8"),  # ASCII cannot end an open character
        (["ok", "\ud800"], "not encodable as UTF-8"),
        ([b"\xc0\x80"], "not valid UTF-8"),  # overlong NUL
        ([b"\xed\xa0\x80"], "not valid UTF-8"),  # encoded surrogate
    ],
)
async def test_invalid_utf8_is_a_retention_error(
    store: ManagedStore, root: Path, chunks: list[str | bytes], message: str
) -> None:
    with pytest.raises(RetentionError, match=message):
        async with store.open_spool() as spool:
            for chunk in chunks:
                await spool.write(chunk)
            await spool.commit()
    assert files_in(root) == []
    assert await store.stats() == StoreStats(0, 0)


async def test_put_of_a_lone_surrogate_is_a_retention_error(
    store: ManagedStore, root: Path
) -> None:
    with pytest.raises(RetentionError):
        await store.put("fine until \udc80")
    assert files_in(root) == []


async def test_exception_inside_the_spool_discards_it(store: ManagedStore, root: Path) -> None:
    with pytest.raises(KeyError):
        async with store.open_spool() as spool:
            await spool.write("half of a text")
            assert len(files_in(root)) == 1  # the temp file exists while writing
            raise KeyError("producer crashed")
    assert files_in(root) == []
    assert await store.stats() == StoreStats(0, 0)


async def test_cancelled_put_leaves_nothing(store: ManagedStore, root: Path) -> None:
    big = "c" * (64 * 1024 * 1024)
    with anyio.move_on_after(0.01) as scope:
        await store.put(big)
    assert scope.cancelled_caught
    # The discard is shielded but may still be finishing in its thread.
    await eventually(lambda: files_in(root) == [])
    assert await store.stats() == StoreStats(0, 0)


async def test_crash_leftovers_are_removed_at_open(root: Path) -> None:
    async with await ManagedStore.open(root) as store:
        kept = await store.put("committed before the crash")
    objects = root / "objects"
    (objects / ".tmp-deadbeef").write_bytes(b"a write that never finished")
    (objects / f"{ORPHAN_ID}.txt").write_bytes(b"renamed but never indexed")
    (objects / "README").write_text("not ours: left alone")
    os.unlink(objects / f"{kept.id}.txt")  # a row whose file vanished
    async with await ManagedStore.open(root) as store:
        assert files_in(root) == ["README"]
        for ref_id in (kept.id, ORPHAN_ID):
            with pytest.raises(ManagedNotFound):
                await store.stat(ref_id)
        assert await store.stats() == StoreStats(0, 0)


async def test_a_real_crash_mid_write_leaves_no_visible_object(root: Path) -> None:
    crash = textwrap.dedent(
        f"""
        import asyncio, os, sys
        from pathlib import Path
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from managed_store import ManagedStore

        async def main():
            store = await ManagedStore.open(Path({str(root)!r}))
            ref = await store.put("survives")
            print(ref.id, flush=True)
            spool = store.open_spool()
            await spool.__aenter__()
            await spool.write("x" * 3_000_000)
            os._exit(9)  # no cleanup, no close: like a kill -9 mid-write

        asyncio.run(main())
        """
    )
    done = await anyio.run_process([sys.executable, "-c", crash], check=False)
    assert done.returncode == 9, done.stderr.decode()
    survivor = done.stdout.decode().strip()
    assert any(name.startswith(".tmp-") for name in files_in(root))
    async with await ManagedStore.open(root) as store:
        assert files_in(root) == [f"{survivor}.txt"]
        assert (await store.read_lines(survivor)).text == "survives"
        assert await store.stats() == StoreStats(1, 8)


async def test_a_root_has_one_live_store(store: ManagedStore, root: Path) -> None:
    with pytest.raises(ManagedStoreError, match="already open"):
        await ManagedStore.open(root)
    child = await anyio.run_process(
        [
            sys.executable,
            "-c",
            f"import sys; sys.path.insert(0, {str(REPO_ROOT)!r});"
            "import asyncio, pathlib; from managed_store import ManagedStore;"
            f"asyncio.run(ManagedStore.open(pathlib.Path({str(root)!r})))",
        ],
        check=False,
    )
    assert b"already open" in child.stderr


async def test_cancellation_at_any_point_keeps_disk_and_index_in_agreement(
    store: ManagedStore, root: Path
) -> None:
    text = "payload line\n" * 200_000  # 2.6 MB: a few windows, an fsync, a commit
    committed = 0
    for step in range(25):
        with anyio.move_on_after(step * 0.002):
            await store.put(text)
            committed += 1

    def agreed() -> bool:
        names = files_in(root)
        return not any(n.startswith(".tmp-") for n in names)

    await eventually(agreed)
    stats = await store.stats()
    # A commit whose caller was cancelled still completes; it is just never reported.
    assert stats.count >= committed
    assert stats.count == len(files_in(root))
    assert stats.bytes == stats.count * len(text)

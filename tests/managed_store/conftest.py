"""Fixtures for the managed store tests: both event loops, a fresh store, a tiny filesystem."""

from __future__ import annotations

import shutil
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from managed_store import ManagedStore


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return tmp_path / "store"


@pytest.fixture
async def store(root: Path) -> AsyncIterator[ManagedStore]:
    async with await ManagedStore.open(root) as opened:
        yield opened


@pytest.fixture
def tiny_fs_root(tmp_path: Path) -> Iterator[Path]:
    """A store root whose `objects/` is a real 256 KiB tmpfs, so ENOSPC is the kernel's own.

    The index stays on the normal disk; only object bytes run out of space.
    """
    root = tmp_path / "tiny"
    objects = root / "objects"
    objects.mkdir(parents=True)
    if shutil.which("mount") is None:
        pytest.fail("no mount(8) here, cannot build a tiny filesystem")
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(objects)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        # CI runs as root where tmpfs mounts work; failing (not skipping) keeps this honest.
        pytest.fail(f"mounting a tmpfs is not permitted here: {mounted.stderr.strip()}")
    try:
        yield root
    finally:
        subprocess.run(["umount", str(objects)], check=True)

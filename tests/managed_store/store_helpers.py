"""Helpers shared by the store tests (a plain module: tests/ is not a package)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio


def files_in(root: Path) -> list[str]:
    """Names in `objects/`, temp files included."""
    return sorted(p.name for p in (root / "objects").iterdir())


def mode_of(path: Path) -> int:
    return path.stat().st_mode & 0o777


def editor_lines(data: bytes) -> list[bytes]:
    """Lines as an editor counts them, each with its `\\n`."""
    parts = data.split(b"\n")
    return [part + b"\n" for part in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


REPO_ROOT = Path(__file__).resolve().parents[2]


async def eventually(check: Callable[[], bool]) -> None:
    """Wait (up to 5 s) until `check()` holds; for effects that finish in a worker thread."""
    with anyio.fail_after(5):
        while True:
            if check():
                return
            await anyio.sleep(0.01)

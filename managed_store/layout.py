"""Where a store keeps things on disk, and the lock that makes one process its owner.

    <root>/index.sqlite        the SQLite index (WAL mode), see `index.py`
    <root>/objects/<id>.txt    one UTF-8 file per object, named by its id
    <root>/objects/.tmp-<hex>  a write in progress; any found at open is a crash leftover
    <root>/lock                held with `flock` while a store is open

Everything here is synchronous and meant to run in a worker thread.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import secrets
from dataclasses import dataclass
from pathlib import Path

from managed_store.errors import StoreInUse
from managed_store.refs import REF_ID_PATTERN

TEMP_PREFIX = ".tmp-"
OBJECT_SUFFIX = ".txt"


@dataclass(frozen=True, slots=True)
class StoreLayout:
    """Paths under one store root."""

    root: Path

    @property
    def index_path(self) -> Path:
        return self.root / "index.sqlite"

    @property
    def objects_dir(self) -> Path:
        return self.root / "objects"

    @property
    def lock_path(self) -> Path:
        return self.root / "lock"

    def object_path(self, ref_id: str) -> Path:
        """Path of an object; `ref_id` must already have come out of the index."""
        # Checked again here so no code path can ever turn an unchecked string into a path.
        if not REF_ID_PATTERN.fullmatch(ref_id):
            raise ValueError("object_path() needs a validated ref id")
        return self.objects_dir / f"{ref_id}{OBJECT_SUFFIX}"

    def new_temp_path(self) -> Path:
        return self.objects_dir / f"{TEMP_PREFIX}{secrets.token_hex(8)}"

    def create_dirs(self) -> None:
        # Private by default: retained texts are tool outputs and may hold secrets.
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.objects_dir.mkdir(mode=0o700, exist_ok=True)

    def temp_files(self) -> list[Path]:
        return [p for p in self.objects_dir.iterdir() if p.name.startswith(TEMP_PREFIX)]

    def object_files(self) -> dict[str, Path]:
        """Files that look like objects, keyed by id; anything else in the dir is left alone."""
        found: dict[str, Path] = {}
        for path in self.objects_dir.iterdir():
            ref_id = path.name.removesuffix(OBJECT_SUFFIX)
            if path.name.endswith(OBJECT_SUFFIX) and REF_ID_PATTERN.fullmatch(ref_id):
                found[ref_id] = path
        return found


def private_opener(path: str, flags: int) -> int:
    """An `opener` for `open()` that creates files 0600 (tool output may hold secrets)."""
    return os.open(path, flags | os.O_NOFOLLOW, 0o600)


def create_private_file(path: Path) -> None:
    """Create `path` empty and 0600 unless it exists: for the index, before SQLite opens it
    (SQLite gives its `-wal` and `-shm` files the database file's mode)."""
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600))


def fsync_dir(path: Path) -> None:
    """Make a rename or unlink inside `path` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def unlink_quietly(path: Path) -> None:
    """Remove `path` if it is there; a concurrent removal is not an error."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()


class StoreLock:
    """An exclusive `flock` on `<root>/lock`, so one root has one live store.

    Two stores on one root would delete each other's in-flight temp files at open, so the second
    one is refused instead. The lock dies with the process, so a crash never leaves it stale.
    """

    def __init__(self, fd: int) -> None:
        self._fd: int | None = fd

    @classmethod
    def acquire(cls, layout: StoreLayout) -> StoreLock:
        fd = os.open(layout.lock_path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise StoreInUse(
                f"managed store at {layout.root} is already open (in this or another process)"
            ) from None
        except BaseException:
            os.close(fd)
            raise
        return cls(fd)

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def describe_os_error(exc: OSError) -> str:
    """`ENOSPC (No space left on device)`: the cause without the file name, which is internal."""
    name = errno.errorcode.get(exc.errno, "OSError") if exc.errno is not None else "OSError"
    return f"{name} ({exc.strerror or exc})"

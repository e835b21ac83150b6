"""Where a spool's bytes go: the `ObjectSink` seam, and `FileSink`, the local store's temp file.

An engine on other storage (the S3 engine's upload) implements `ObjectSink`; `spool.TempObject`
does the checks, counting and line marks in front of any sink.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import BinaryIO, Protocol

from managed_store.errors import RetentionError, StoreClosed
from managed_store.layout import describe_os_error, private_opener, unlink_quietly

WRITEBACK_BYTES = 8 * 1024 * 1024
"""Written bytes after which the kernel is asked to start writing them to disk."""


class ObjectSink(Protocol):
    """Where a spool's bytes go. Called from worker threads, one call at a time (under the
    `TempObject`'s lock): `create` once, `write` any number of times, then `finish` (the bytes
    are complete and durable) or `discard` (remove whatever was written, quietly; called after
    a failed `write` or `finish` too, never after a failed `create`). Failures raise
    `RetentionError` (an `OSError` is turned into one)."""

    @property
    def path(self) -> Path | None: ...

    def create(self) -> None: ...

    def write(self, data: bytes) -> None: ...

    def finish(self) -> None: ...

    def discard(self) -> None: ...


class FileSink:
    """A private temp file, written back to disk as it grows and fsynced at `finish`."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._file: BinaryIO | None = None
        self._size = 0
        self._written_back = 0

    @property
    def path(self) -> Path:
        return self._path

    def create(self) -> None:
        try:
            self._file = open(self._path, "xb", opener=private_opener)
        except OSError as exc:
            raise RetentionError(f"could not create a temp file: {describe_os_error(exc)}") from exc

    def write(self, data: bytes) -> None:
        file = self._opened()
        try:
            file.write(data)
        except OSError as exc:
            raise RetentionError(f"could not write the object: {describe_os_error(exc)}") from exc
        self._size += len(data)
        if self._size - self._written_back >= WRITEBACK_BYTES:
            _start_writeback(file, self._written_back, self._size)
            self._written_back = self._size

    def flush(self) -> None:
        """Hand what was written to the kernel (so that another reader of the file sees it)."""
        file = self._opened()
        try:
            file.flush()
        except OSError as exc:
            raise RetentionError(f"could not write the object: {describe_os_error(exc)}") from exc

    def finish(self) -> None:
        file = self._opened()
        try:
            file.flush()
            os.fsync(file.fileno())
            file.close()
        except OSError as exc:
            raise RetentionError(f"could not write the object: {describe_os_error(exc)}") from exc
        self._file = None

    def discard(self) -> None:
        if self._file is not None:
            # Closing flushes, which fails again after ENOSPC; the fd is released regardless.
            with contextlib.suppress(OSError):
                self._file.close()
            self._file = None
        unlink_quietly(self._path)

    def _opened(self) -> BinaryIO:
        if self._file is None:
            raise StoreClosed("the temp file is closed")
        return self._file


def _start_writeback(file: BinaryIO, start: int, stop: int) -> None:
    """Ask the kernel to start writing `start..stop` of `file` to disk now, without waiting.

    Left alone, the dirty pages of a large object all wait for `finish()`'s fsync (0.3-0.6 s
    per 512 MiB here) while the commit, and the call, wait for it; written back as they come,
    most are on disk by then. `POSIX_FADV_DONTNEED` starts the writeback of dirty pages (and
    drops pages already clean, which only a later read of the object would want). Advice
    only: where it is missing or fails, the fsync does all the work as before.
    """
    advise = getattr(os, "posix_fadvise", None)
    if advise is not None:
        with contextlib.suppress(OSError):
            advise(file.fileno(), start, stop - start, os.POSIX_FADV_DONTNEED)

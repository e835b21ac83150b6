"""Object bytes on S3: the spool's upload (`S3Sink`) and ranged reads (`RangedReader`).

Both are synchronous and run in worker threads, like the local store's file I/O: obstore's
blocking calls release the GIL while its own runtime does the network work, so a large upload
or scan never holds up the event loop.

An upload is one multipart upload once it passes `part_bytes` (parts go up while the producer
is still writing, `max_concurrency` at a time); a smaller object is one PUT when it finishes.
Nothing is visible under the key until the upload completes, and a discarded upload is
aborted, so S3 keeps no parts of it.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import obstore

from managed_store.errors import RetentionError

if TYPE_CHECKING:
    from pathlib import Path

    from obstore import WritableFile
    from obstore.store import S3Store
    from typing_extensions import Buffer

logger = logging.getLogger(__name__)

STREAM_CHUNK = 1024 * 1024
"""Bytes a sequential read asks the streamed GET for at a time."""
KEEP_BEHIND = 4 * 1024 * 1024
"""Bytes a reader keeps before its position (for short seeks back) before dropping them."""
_SHOWN = 300


def describe(exc: BaseException) -> str:
    """The first line of an object store error, cut short: enough to name the cause, never a
    credential (obstore messages carry the request URL, not the signature)."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return text if len(text) <= _SHOWN else text[:_SHOWN] + "…"


class S3Sink:
    """The `ObjectSink` of one spool: bytes go to `key`; see the module docstring."""

    def __init__(self, client: S3Store, key: str, *, part_bytes: int,
                 max_concurrency: int) -> None:
        self._client = client
        self._key = key
        self._part_bytes = part_bytes
        self._max_concurrency = max_concurrency
        self._writer: WritableFile | None = None
        self._finished = False

    @property
    def path(self) -> Path | None:
        return None

    @property
    def key(self) -> str:
        return self._key

    def create(self) -> None:
        # No request yet: the writer buffers up to one part, then starts a multipart upload.
        self._writer = obstore.open_writer(
            self._client, self._key, buffer_size=self._part_bytes,
            max_concurrency=self._max_concurrency)

    def write(self, data: bytes) -> None:
        writer = self._opened()
        try:
            writer.write(data)
        except Exception as exc:
            raise RetentionError(f"could not upload the object: {describe(exc)}") from exc

    def finish(self) -> None:
        writer = self._opened()
        try:
            writer.close()
        except Exception as exc:
            raise RetentionError(f"could not upload the object: {describe(exc)}") from exc
        self._finished = True
        self._writer = None

    def discard(self) -> None:
        writer, self._writer = self._writer, None
        try:
            if writer is not None:
                # Leaving the writer's context with an exception aborts its multipart upload.
                writer.__exit__(RetentionError, RetentionError("discarded"), None)
            elif self._finished:
                obstore.delete(self._client, self._key)
        except Exception as exc:  # the store's sweep removes it later (its pending row)
            logger.warning("managed store: could not remove a discarded upload: %s",
                           describe(exc))

    def _opened(self) -> WritableFile:
        if self._writer is None:
            raise RetentionError("the upload is closed")
        return self._writer


class RangedReader:
    """An `ObjectReader` over one object of known `size`: `prefetch` loads one range with a
    single GET; reading past what is loaded continues with one streamed GET from there, so a
    sequential scan (grep, a long line) costs one request, not one per block. obstore raises
    `FileNotFoundError` when the object is gone, and its `BaseError`s (or `OSError`) else."""

    def __init__(self, client: S3Store, key: str, size: int) -> None:
        self._client = client
        self._key = key
        self._size = size
        self._pos = 0
        self._start = 0  # object offset of self._buffer[0]
        self._buffer = bytearray()
        self._stream: Iterator[Any] | None = None
        self._stream_at = -1  # object offset of the next byte the stream yields

    def window(self, start: int, end: int) -> tuple[int, int] | None:
        """`start..end` clipped to the object; None when nothing of it is left."""
        end = min(end, self._size)
        return (start, end) if start < end else None

    def prefetch(self, start: int, end: int) -> None:
        """Load bytes `start..end` (clipped to the object) with one ranged GET."""
        if (window := self.window(start, end)) is not None:
            self.install(window[0], obstore.get_range(self._client, self._key,
                                                      start=window[0], end=window[1]))

    def install(self, start: int, data: Buffer) -> None:
        """Take `data`, fetched by the caller, as the object's bytes from `start` on."""
        self._buffer = bytearray(memoryview(data))
        self._start = start
        self._stream = None

    def seek(self, offset: int, whence: int = 0, /) -> int:
        if whence != 0:
            raise ValueError("RangedReader seeks from the start only")
        self._pos = offset
        return offset

    def tell(self) -> int:
        return self._pos

    def read(self, size: int = -1, /) -> bytes:
        want = self._size - self._pos if size < 0 else size
        self._ensure(lambda: self._end() - self._pos >= want)
        return self._take(min(want, max(0, self._end() - self._pos)))

    def readline(self, size: int = -1, /) -> bytes:
        self._ensure_line()
        local = self._pos - self._start
        newline = self._buffer.find(b"\n", max(0, local))
        stop = self._end() if newline == -1 else self._start + newline + 1
        if size >= 0:
            stop = min(stop, self._pos + size)
        return self._take(max(0, stop - self._pos))

    def __iter__(self) -> Iterator[bytes]:
        """The lines from the position on, each with its `\\n`, as a file yields them. Takes
        every whole line loaded at once and splits them in C (a `readline` each cost 2.5 us
        a line in Python): use it alone, not mixed with `seek` or `read`."""
        while True:
            self._ensure_line()
            local = self._pos - self._start
            last = self._buffer.rfind(b"\n", max(0, local))
            if last == -1:  # the end, without a final newline
                rest = self._take(self._end() - self._pos)
                if rest:
                    yield rest
                return
            *lines, _ = self._take(last + 1 - local).split(b"\n")
            for line in lines:
                yield line + b"\n"

    def _ensure_line(self) -> None:
        """Load until a `\\n` lies at or after the position, or the end is loaded."""
        searched = self._pos

        def has_line() -> bool:
            nonlocal searched
            found = self._buffer.find(b"\n", max(0, searched - self._start))
            searched = self._end()
            return found != -1

        self._ensure(has_line)

    def _end(self) -> int:
        return self._start + len(self._buffer)

    def _take(self, count: int) -> bytes:
        local = self._pos - self._start
        data = bytes(self._buffer[local:local + count])
        self._pos += len(data)
        if self._pos - self._start > KEEP_BEHIND:
            drop = self._pos - self._start - KEEP_BEHIND // 2
            del self._buffer[:drop]
            self._start += drop
        return data

    def _ensure(self, enough: Any) -> None:
        """Load more (streamed from where the loaded bytes end) until `enough()` or the end."""
        if not self._start <= self._pos <= self._end():
            # A seek outside what is loaded: start over there.
            self._buffer = bytearray()
            self._start = min(self._pos, self._size)
            self._stream = None
        while not enough() and self._end() < self._size:
            if self._stream is None or self._stream_at != self._end():
                result = obstore.get(self._client, self._key,
                                     options={"range": {"offset": self._end()}})
                self._stream = iter(result.stream(min_chunk_size=STREAM_CHUNK))
                self._stream_at = self._end()
            chunk = next(self._stream, None)
            if chunk is None:  # shorter than the index says: take what there is
                self._size = self._end()
                break
            self._buffer += memoryview(chunk)
            self._stream_at += len(chunk)

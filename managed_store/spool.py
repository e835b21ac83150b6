"""Writing one object: a temp file filled chunk by chunk, then committed or discarded.

`TempObject` is the synchronous half, run in worker threads; `SpoolWriter` is the async
facade a caller holds. Where the bytes go is the `ObjectSink` the engine gives: a temp file
(`FileSink`, the local store) or an upload (the S3 engine); the checks, counting and line marks
are the same for both. Input is handled in windows of `WINDOW` bytes (or characters, for `str`),
one worker-thread call each, so memory stays O(window) whatever the chunk size and a
cancellation takes effect between windows.

Ownership of the temp file (or upload) is always with exactly one party: the spool (and its
`TempObject`) until it passes the finished object to the store's commit, which then makes it
visible or removes it.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import enum
import functools
import logging
import os
import queue
import select
import threading
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import ParamSpec, Self, TypeVar

from managed_store.errors import ManagedStoreError, RetentionError, StoreClosed
from managed_store.index import MARK_BYTES, LineMark
from managed_store.layout import describe_os_error
from managed_store.newlines import newlines_at
from managed_store.refs import ManagedRef
from managed_store.sink import WRITEBACK_BYTES as WRITEBACK_BYTES
from managed_store.sink import FileSink, ObjectSink

WINDOW = 1024 * 1024
READ_BYTES = 1024 * 1024
"""Bytes one read of a file descriptor may take in `write_from` (a full 1 MiB pipe)."""
APPEND_DEPTH = 2
"""Reads `write_from` lets wait for its appending thread."""
TAIL_BYTES = 36 * 1024
"""Bytes of the end of what `write_from` wrote that it keeps in `Drained.tail`."""

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class WrittenObject:
    """A complete object (a fsynced temp file, a finished upload), handed from the spool to the
    store's commit. `path` is the temp file's, or None when the sink is not a local file."""

    path: Path | None
    size_bytes: int
    lines: int
    marks: tuple[LineMark, ...]


@dataclass(slots=True)
class Drained:
    """What `SpoolWriter.write_from` took from a file descriptor.

    Filled in by the spool's thread; read it only once `write_from` returned or raised (when
    cancelled, it says what was taken until the read stopped). `kept` counts the bytes read and
    kept, `leftover` included: bytes counted but not written, because they end inside a UTF-8
    character (at the end of the input or of the stop), or because they are not valid UTF-8
    (then `ended` is false and reading stopped there). `dropped` counts bytes read past `limit`
    and discarded. `tail` is the end of what was written (up to `TAIL_BYTES`; it may start
    inside a character).
    """

    limit: int
    kept: int = 0
    dropped: int = 0
    tail: bytes = b""
    leftover: bytes = b""
    ended: bool = False


class _TempState(enum.Enum):
    PENDING = "pending"
    OPEN = "open"
    FINISHED = "finished"
    DISCARDED = "discarded"


class TempObject:
    """An object being filled through its sink. Thread-safe: every method holds one lock.

    Any failure raises `RetentionError` and discards the sink's bytes before returning, so a
    failed write never leaves a temp file (or upload) behind, even if the caller forgets to
    abort.
    """

    def __init__(self, sink: ObjectSink, *, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._sink = sink
        self._max_bytes = max_bytes
        self._state = _TempState.PENDING
        # Validates bytes input as a whole, so a character may straddle two chunks.
        self._decoder = codecs.getincrementaldecoder("utf-8")()
        self._size = 0
        self._newlines = 0
        self._ends_with_newline = False
        self._next_mark = MARK_BYTES
        self._marks: list[LineMark] = []

    def create_file(self) -> None:
        with self._lock:
            if self._state is not _TempState.PENDING:
                return  # discarded before this job ran: it must not resurrect the file
            try:
                self._sink.create()
            except BaseException:
                self._state = _TempState.DISCARDED  # nothing was created: nothing to remove
                raise
            self._state = _TempState.OPEN

    def write(self, chunk: str | bytes, start: int, stop: int) -> None:
        """Append `chunk[start:stop]`: see `write_text` and `write_bytes`."""
        if isinstance(chunk, str):
            self.write_text(chunk, start, stop)
        else:
            self.write_bytes(chunk, start, stop)

    def write_text(self, text: str, start: int, stop: int) -> None:
        with self._lock, self._discard_on_failure():
            if self._decoder.getstate()[0]:
                raise RetentionError("a str chunk follows bytes that end inside a UTF-8 character")
            try:
                data = text[start:stop].encode("utf-8")
            except UnicodeEncodeError as exc:
                raise RetentionError(f"text is not encodable as UTF-8: {exc.reason}") from exc
            self._append(data)

    def write_bytes(self, chunk: bytes, start: int, stop: int) -> None:
        with self._lock, self._discard_on_failure():
            data = chunk[start:stop]
            try:
                # ASCII with no character open from earlier bytes is valid as it is; decoding
                # it would only build a string to throw away.
                if self._decoder.getstate()[0] or not data.isascii():
                    self._decoder.decode(data)
            except UnicodeDecodeError as exc:
                raise RetentionError(
                    f"bytes are not valid UTF-8 ({exc.reason}) near byte {self._size}"
                ) from exc
            self._append(data)

    def append_from(self, fd: int, wake: int, drained: Drained) -> None:
        """Append what `fd` yields until its end, until `wake` is readable, or until its bytes
        are not valid UTF-8; see `Drained` for what it records. Closes `wake`.

        Two threads share the work, as a pipeline: this one waits in `poll()` (`fd` may be
        non-blocking), reads up to `READ_BYTES` at a time and checks it (ASCII as read;
        anything else as UTF-8, up to its last whole character); a helper appends (write,
        line index). One thread doing both was the slower half of a 1 GiB output in calm
        phases of a 2-core VM. At most `APPEND_DEPTH` reads wait to be appended. The lock is
        taken per append, so a discard (the store closing) gets in between and the next append
        fails with `StoreClosed`.
        """
        with contextlib.ExitStack() as closing:
            closing.callback(os.close, wake)
            with self._lock:
                if self._decoder.getstate()[0]:
                    raise RetentionError(
                        "write_from() follows bytes that end inside a UTF-8 character"
                    )
            halted, halt = os.pipe()
            closing.callback(os.close, halted)
            closing.callback(os.close, halt)
            reads: queue.Queue[bytes | None] = queue.Queue(APPEND_DEPTH)
            failed: list[BaseException] = []

            def append_reads() -> None:
                while (data := reads.get()) is not None:
                    if failed:
                        continue  # only drained, so that the reader never blocks on `put`
                    try:
                        with self._lock, self._discard_on_failure():
                            self._append(data)
                    except BaseException as exc:  # raised in the reading thread, below
                        failed.append(exc)
                        os.write(halt, b"\0")

            appender = threading.Thread(target=append_reads, name="managed-store-append")
            appender.start()
            try:
                drained.leftover = self._read_checked(fd, (wake, halted), drained, reads)
            finally:
                reads.put(None)
                appender.join()
            if failed:
                raise failed[0]

    @staticmethod
    def _read_checked(
        fd: int, stops: tuple[int, ...], drained: Drained, reads: queue.Queue[bytes | None]
    ) -> bytes:
        """`append_from`'s reading half: queue whole valid UTF-8 from `fd` until its end or
        one of `stops` is readable; returns the bytes read and not queued (`Drained.leftover`)."""
        poller = select.poll()
        for watched in (fd, *stops):
            poller.register(watched, select.POLLIN)
        room = drained.limit
        carry = b""
        while not any(ready in stops for ready, _ in poller.poll()):
            try:
                data = os.read(fd, READ_BYTES)
            except (BlockingIOError, InterruptedError):
                continue
            if not data:
                drained.ended = True
                break
            if len(data) > room:
                drained.dropped += len(data) - room
                data = data[:room]
                if not data:
                    continue
            room -= len(data)
            drained.kept += len(data)
            data = carry + data if carry else data
            carry = b""
            if not data.isascii():
                try:
                    _, whole = codecs.utf_8_decode(data, "strict", False)
                except UnicodeDecodeError:
                    return data
                data, carry = data[:whole], data[whole:]
            if data:
                reads.put(data)
                drained.tail = (drained.tail + data[-TAIL_BYTES:])[-TAIL_BYTES:]
        return carry

    def finish(self) -> WrittenObject:
        """Complete the object (flush, fsync and close a file; finish an upload). It stays
        until the caller's commit makes it visible or removes it, or `discard()`s it."""
        with self._lock, self._discard_on_failure():
            try:
                self._decoder.decode(b"", final=True)
            except UnicodeDecodeError as exc:
                raise RetentionError("text ends inside a UTF-8 character") from exc
            try:
                self._sink.finish()
            except OSError as exc:
                raise RetentionError(
                    f"could not write the object: {describe_os_error(exc)}"
                ) from exc
            self._state = _TempState.FINISHED
            lines = self._newlines + (1 if self._size and not self._ends_with_newline else 0)
            return WrittenObject(self._sink.path, self._size, lines, tuple(self._marks))

    def discard(self) -> None:
        """Remove what was written; a no-op if it was already discarded."""
        with self._lock:
            self._discard_locked()

    def _discard_locked(self) -> None:
        if self._state is _TempState.DISCARDED:
            return
        if self._state in (_TempState.OPEN, _TempState.FINISHED):
            self._sink.discard()
        self._state = _TempState.DISCARDED

    @contextlib.contextmanager
    def _discard_on_failure(self) -> Iterator[None]:
        if self._state is not _TempState.OPEN:
            raise StoreClosed(f"the temp file is {self._state.value}")
        try:
            yield
        except BaseException:
            self._discard_locked()
            raise

    def _append(self, data: bytes) -> None:
        start = self._size
        end = start + len(data)
        if end > self._max_bytes:
            raise RetentionError(f"object exceeds the store quota of {self._max_bytes} bytes")
        try:
            self._sink.write(data)
        except OSError as exc:
            raise RetentionError(f"could not write the object: {describe_os_error(exc)}") from exc
        marks = range(self._next_mark, end + 1, MARK_BYTES)
        *at_marks, in_data = newlines_at(data, [mark - start for mark in marks])
        self._marks.extend(
            LineMark(mark, self._newlines + newlines)
            for mark, newlines in zip(marks, at_marks, strict=True)
        )
        self._newlines += in_data
        self._next_mark += len(marks) * MARK_BYTES
        self._size = end
        if data:
            self._ends_with_newline = data.endswith(b"\n")


async def to_the_end(job: Awaitable[_T]) -> _T:
    """Await `job` until it is done, even when the caller is cancelled meanwhile, then raise
    that cancellation (never swallowed): for cleanup that must be over once a cancelled task
    is seen to end. `asyncio.shield` alone returns at the cancellation and leaves the job
    running unobserved, and an anyio cancel scope cancels every await again at each turn of
    the loop, so a shielded step inside cleanup ended that cleanup at its first await.

    A failure of `job` is raised when nothing was cancelled; after a cancellation it is only
    logged (the cancellation is what the caller must see)."""
    task = asyncio.ensure_future(job)
    cancelled: asyncio.CancelledError | None = None
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError as exc:
            cancelled = cancelled or exc
    if cancelled is None:
        return task.result()
    if not task.cancelled() and (failure := task.exception()) is not None:
        logger.warning("managed store: cleanup failed while cancelled: %s", failure)
    raise cancelled


async def _outwait(job: asyncio.Future[None]) -> None:
    """Wait until `job` is done, whatever cancellations arrive meanwhile (a thread still
    reading a file descriptor must let go of it before its owner may close it)."""
    while not job.done():
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait([job])


CommitFn = Callable[[WrittenObject, str], Awaitable[ManagedRef]]


class _SpoolState(enum.Enum):
    NEW = "new"
    OPEN = "open"
    COMMITTING = "committing"
    COMMITTED = "committed"
    FAILED = "failed"
    ABORTED = "aborted"


class SpoolWriter:
    """Streams one object into the store; get one from `ManagedStore.open_spool()`.

    Use it as `async with`: `write()` any number of `str` or UTF-8 `bytes` chunks (a character
    may be split across chunks), then `commit()`. Leaving the block without a successful
    commit discards everything written. Memory is O(chunk) plus one window.

    Any write failure raises `RetentionError` and aborts the spool; so does a cancelled
    `write()`. Writes from several tasks are applied in the order they were called, and may
    overlap: from its second write on, a spool has its own worker thread, and a write queues
    its windows there and returns when they are written, so a producer can prepare its next
    chunk (and queue it) while the previous one is written. Call `commit()` once every write
    returned.
    """

    def __init__(
        self,
        temp: Path | ObjectSink,
        *,
        namespace: str,
        max_bytes: int,
        commit: CommitFn,
        live: set[SpoolWriter],
    ) -> None:
        # A path is a temp file (`FileSink`), as the local store always had it.
        sink = FileSink(temp) if isinstance(temp, Path) else temp
        self._temp = TempObject(sink, max_bytes=max_bytes)
        self._namespace = namespace
        self._commit = commit
        # The store's set of entered spools, so closing the store can abort them.
        self._live = live
        self._state = _SpoolState.NEW
        self._lock = asyncio.Lock()
        self._written = False
        # A spool's own thread, from its second write on: jobs run in the order queued, so
        # writes can be queued without waiting for the previous one. A one-write spool (every
        # `put()`) keeps to the shared pool and never pays for starting a thread.
        self._worker: ThreadPoolExecutor | None = None
        self._discarding: asyncio.Future[None] | None = None

    @property
    def namespace(self) -> str:
        return self._namespace

    async def __aenter__(self) -> Self:
        if self._state is not _SpoolState.NEW:
            raise ManagedStoreError("a spool can be entered only once")
        self._state = _SpoolState.OPEN
        self._live.add(self)
        try:
            await self._run(self._temp.create_file)
        except BaseException:
            self._live.discard(self)
            raise
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            await self.abort()
        finally:
            self._live.discard(self)
            self._stop_worker()

    async def write(self, chunk: str | bytes) -> None:
        """Append `chunk`; `bytes` are validated as UTF-8 together with what came before."""
        if not isinstance(chunk, str | bytes):
            raise TypeError(f"write() takes str or bytes, not {type(chunk).__name__}")
        write = self._temp.write
        windows = [(start, start + WINDOW) for start in range(0, len(chunk), WINDOW)]
        async with self._lock:
            self._require_open()
            if not self._written:
                self._written = True
                for start, stop in windows:
                    await self._run(write, chunk, start, stop)
                return
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="managed-store-spool")
            loop = asyncio.get_running_loop()
            # Queued under the lock, so in call order; awaited outside it, so the next write
            # can be queued meanwhile. A window only holds `chunk`: it is encoded when it runs.
            jobs = [loop.run_in_executor(self._worker, write, chunk, *window) for window in windows]
        try:
            for job in jobs:
                await job
        except BaseException:
            for job in jobs:
                job.cancel()
            await self.abort()
            raise

    async def write_from(self, fd: int, drained: Drained) -> None:
        """Append what `fd` yields until its end (`drained.ended`) or until it is not valid
        UTF-8, reading it in the spool's thread; `drained` records what was taken.

        For a producer's pipe: the event loop never touches the bytes (a loop reading 1 GiB
        and handing it to this thread spent more CPU on the hand-over than on the bytes).
        Bytes past `drained.limit` are read and discarded, so the producer never blocks on a
        full pipe. A cancellation stops the read (promptly, even while `fd` is quiet), waits
        for the thread to let go of `fd`, and leaves the spool open with everything taken
        until then written (whole characters only: see `Drained.leftover`). Any other failure
        aborts the spool, like `write()`'s. The caller must keep `fd` open until this returns.
        """
        async with self._lock:
            self._require_open()
            self._written = True
            if self._worker is None:
                self._worker = ThreadPoolExecutor(1, thread_name_prefix="managed-store-spool")
            wake, stop = os.pipe()
            try:
                job = asyncio.get_running_loop().run_in_executor(
                    self._worker, self._temp.append_from, fd, wake, drained
                )
            except BaseException:
                os.close(wake)
                os.close(stop)
                raise
        try:
            await asyncio.shield(job)
        except asyncio.CancelledError:
            if not job.done():
                with contextlib.suppress(OSError):  # the job has just ended and closed `wake`
                    os.write(stop, b"\0")
            await _outwait(job)
            if not job.cancelled() and job.exception() is not None:
                await self.abort()
            raise
        except BaseException:
            await self.abort()
            raise
        finally:
            os.close(stop)

    async def commit(self) -> ManagedRef:
        """Make the object visible and return its ref; the spool cannot be used afterwards."""
        async with self._lock:
            self._require_open()
            written = await self._run(self._temp.finish)
            # From here the store's commit owns the file (it renames or removes it), so
            # `abort()` must leave it alone: no await between these two lines.
            self._state = _SpoolState.COMMITTING
            try:
                ref = await self._commit(written, self._namespace)
            except BaseException:
                self._state = _SpoolState.FAILED
                raise
            self._state = _SpoolState.COMMITTED
            return ref

    async def abort(self) -> None:
        """Discard everything written; a no-op after `commit()` started.

        Returns once everything written is gone (the temp file, the engine's upload), also to
        a caller cancelled meanwhile, whose cancellation is raised after it; a second call
        waits for the same discard."""
        if self._state in (_SpoolState.NEW, _SpoolState.OPEN):
            self._state = _SpoolState.ABORTED
            self._discarding = asyncio.ensure_future(self._discard())
        try:
            if self._discarding is not None:
                await to_the_end(self._discarding)
        finally:
            self._stop_worker()

    async def _discard(self) -> None:
        """Remove everything written; run once, by the first `abort()`. Engines extend it."""
        # The job waits for the temp file's lock, so a write still running in a thread ends
        # first.
        await asyncio.to_thread(self._temp.discard)

    def _require_open(self) -> None:
        if self._state is _SpoolState.OPEN:
            return
        if self._state is _SpoolState.NEW:
            raise ManagedStoreError("enter the spool with `async with` before using it")
        if self._state is _SpoolState.ABORTED:
            raise StoreClosed(
                "spool was aborted (an earlier write failed or was cancelled, or the store "
                "was closed)"
            )
        raise ManagedStoreError(f"spool is {self._state.value}; it cannot be written again")

    def _stop_worker(self) -> None:
        # Jobs still queued run and find the temp file discarded (`StoreClosed`): cancelling
        # them here would raise `CancelledError` in writers that nobody cancelled.
        if self._worker is not None:
            self._worker.shutdown(wait=False)

    async def _run(self, fn: Callable[_P, _T], *args: _P.args, **kwargs: _P.kwargs) -> _T:
        """Run `fn` after every job queued before it; abort the spool if it fails."""
        try:
            if self._worker is None:
                return await asyncio.to_thread(fn, *args, **kwargs)
            job = functools.partial(fn, *args, **kwargs)
            return await asyncio.get_running_loop().run_in_executor(self._worker, job)
        except BaseException:
            await self.abort()
            raise

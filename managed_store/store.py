"""`ManagedStore`: complete texts on local disk, addressed by opaque ids.

Life of a store: `open` (lock the root, open the index, remove crash leftovers, first
cleanup, start the periodic cleanup) → use → `aclose` (stop the cleanup task, abort open
spools, close the index, unlock).

Threads: one dedicated thread owns the SQLite connection and runs everything that changes
which objects exist (commit, eviction, reconciliation), so those never race each other. Reading
and writing object bytes runs in the default executor, so a large read or write never holds up
the index. Searches run in threads and worker processes of their own (`managed_store.search`).
Nothing blocks the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import logging
import math
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Concatenate, NoReturn, ParamSpec, Self, TypeVar

from managed_store.errors import (
    ManagedNotFound,
    ManagedStoreError,
    RetentionError,
    StoreClosed,
)
from managed_store.index import ORIGIN, Index, LineMark, StoreStats
from managed_store.layout import (
    StoreLayout,
    StoreLock,
    describe_os_error,
    fsync_dir,
    unlink_quietly,
)
from managed_store.line_chars import LineChars, read_line_chars
from managed_store.pattern import check_pattern, compile_pattern
from managed_store.reading import (
    GrepResult,
    TextSlice,
    grep_lines,
    read_byte_range,
    read_line_range,
)
from managed_store.refs import ManagedRef, new_ref_id, validate_ref_id
from managed_store.retention import OwnerLimits, RetentionPolicy
from managed_store.search import Searches, SearchLimits
from managed_store.spool import SpoolWriter, WrittenObject, to_the_end

if TYPE_CHECKING:
    from managed_store.protocol import TextStore

logger = logging.getLogger(__name__)

_P = ParamSpec("_P")
_T = TypeVar("_T")
_MAX_NAMESPACE = 128
_MAX_OWNER = 256
# Offsets and limits past this are refused as arguments: SQLite's INTEGER ends at 2**63 - 1,
# and no object comes near either.
MAX_POSITION = 2**62


class ManagedStore:
    """The local-disk `TextStore`. Create with `await ManagedStore.open(root)`.

    One store per root at a time (enforced with a lock file). Objects are immutable once
    committed; they disappear only by TTL or quota eviction, oldest first. Methods taking an id
    raise `InvalidRef` for a malformed id and `ManagedNotFound` for one the store does not hold.
    """

    def __init__(
        self,
        layout: StoreLayout,
        policy: RetentionPolicy,
        cleanup_interval: float,
        executor: ThreadPoolExecutor,
        searches: SearchLimits,
    ) -> None:
        # Private: `open()` builds the pieces in order and undoes them if a step fails.
        self._layout = layout
        self._policy = policy
        self._cleanup_interval = cleanup_interval
        self._executor = executor
        self._searches = Searches(searches)
        self._index: Index | None = None
        self._lock: StoreLock | None = None
        self._spools: set[SpoolWriter] = set()
        self._cleanup_task: asyncio.Task[None] | None = None
        self._closed = False
        self._last_created_at = 0.0
        self._evicted_expired = 0
        self._evicted_quota = 0

    @classmethod
    async def open(
        cls,
        root: Path,
        *,
        ttl_seconds: float = 7 * 86400,
        quota_bytes: int = 2 * 1024**3,
        cleanup_interval: float = 3600.0,
        owner_share: float = 0.5,
        searches: SearchLimits | None = None,
        owner_limits: OwnerLimits | None = None,
    ) -> Self:
        """Open (creating if needed) the store at `root` and run a first `cleanup()`.

        `ttl_seconds` may be `math.inf`; `cleanup_interval=math.inf` disables the periodic
        cleanup. `owner_share` is the part of the quota one owner may hold (see `put`);
        `owner_limits` replace it for the owners they cover (`owner_limits` attribute).
        `searches` bounds `grep` (default: `SearchLimits.from_environ(os.environ)`).
        Raises `ManagedStoreError` if the root is in use or cannot be opened.
        """
        policy = RetentionPolicy(ttl_seconds=ttl_seconds, quota_bytes=quota_bytes,
                                 owner_share=owner_share, limits=owner_limits or OwnerLimits())
        if not cleanup_interval > 0:
            raise ValueError(f"cleanup_interval must be > 0, got {cleanup_interval!r}")
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="managed-store-index")
        store = cls(StoreLayout(Path(root)), policy, cleanup_interval, executor,
                    searches or SearchLimits.from_environ(os.environ))
        try:
            await asyncio.get_running_loop().run_in_executor(executor, store._open_sync)
            await store.cleanup()
        except BaseException:
            await store.aclose()
            raise
        if not math.isinf(cleanup_interval):
            store._cleanup_task = asyncio.create_task(
                store._cleanup_forever(), name=f"managed-store-cleanup {root}"
            )
        return store

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop the cleanup task, abort open spools, close the index. Idempotent.

        Returns once the root is unlocked (another store may open it), also to a caller
        cancelled meanwhile, whose cancellation is raised after (`to_the_end`): a cancelled
        close used to stop at its first await and leave the index open and the root locked."""
        if self._closed:
            return
        self._closed = True
        if self._cleanup_task is not None:
            self._cleanup_task.cancel()
        await to_the_end(self._close())

    async def _close(self) -> None:
        self._searches.close()
        if self._cleanup_task is not None:
            await asyncio.wait([self._cleanup_task])
        try:
            for spool in list(self._spools):
                await spool.abort()
        finally:
            # Queued behind any commit still running, so those finish (or fail) first.
            try:
                await asyncio.get_running_loop().run_in_executor(self._executor,
                                                                 self._close_sync)
            finally:
                self._executor.shutdown(wait=False)

    # -- writing -------------------------------------------------------------------------

    async def put(
        self, text: str, *, namespace: str = "default", owner: str | None = None
    ) -> ManagedRef:
        """Store `text` whole and return its ref.

        `owner` names who the text counts against (a client; None: nobody in particular): an
        owner holds at most `owner_share` of the quota (or its own limit, `owner_limits`), and
        storing for it first evicts its own oldest objects; when the whole quota is full, the
        largest holder's oldest go first (`managed_store.retention`).

        Extra memory is one window: 1 Mi characters, encoded (measured: +4 MB RSS for a 100 MB
        ASCII text). Raises `RetentionError` if it cannot be stored (quota, the owner's share,
        disk, surrogates).
        """
        if not isinstance(text, str):
            raise TypeError(f"put() takes str, not {type(text).__name__}")
        _check_namespace(namespace)
        _check_owner(owner)
        # Every character takes at least one byte, so this refuses hopeless texts before any I/O.
        self._policy.check_fits(len(text))
        self._policy.check_owner_fits(len(text), owner)
        async with self.open_spool(namespace=namespace, owner=owner) as spool:
            await spool.write(text)
            return await spool.commit()

    def open_spool(self, *, namespace: str = "default", owner: str | None = None) -> SpoolWriter:
        """A writer for one object of unknown size; use it with `async with`. `owner` as in
        `put` (an object over the owner's share fails at `commit`)."""
        _check_namespace(namespace)
        _check_owner(owner)
        self._check_open()
        return SpoolWriter(
            self._layout.new_temp_path(),
            namespace=namespace,
            max_bytes=self._policy.quota_bytes,
            commit=functools.partial(self._commit, owner=owner),
            live=self._spools,
        )

    async def _commit(
        self, written: WrittenObject, namespace: str, *, owner: str | None = None
    ) -> ManagedRef:
        loop = asyncio.get_running_loop()
        try:
            job = loop.run_in_executor(
                self._executor, self._commit_sync, written, namespace, owner)
        except RuntimeError:  # executor shut down: the store closed while the spool ran
            if written.path is not None:
                await asyncio.to_thread(unlink_quietly, written.path)
            raise StoreClosed("managed store is closed") from None
        # Shielded: once started, a commit runs to its end so the index and the files agree;
        # a cancelled caller just never learns the id (the object ages out like any other).
        # A shield (not `to_the_end`) by design: nothing waits for it, as every later use of
        # the index, `aclose` included, runs on the same thread after it.
        return await asyncio.shield(job)

    # -- reading -------------------------------------------------------------------------

    async def read_lines(self, ref_id: str, offset: int = 1, limit: int = 2000) -> TextSlice:
        """Lines `offset..offset+limit-1` (1-based), each with its `\\n`.

        Past the last line, returns an empty slice with `eof=True`. Cost is O(limit lines),
        independent of `offset`.
        """
        ref_id = validate_ref_id(ref_id)
        _check_int("offset", offset, 1)
        _check_int("limit", limit, 1)
        ref, mark = await self._on_index_thread(self._locate, ref_id, Index.mark_for_line, offset)
        return await self._read(ref, read_line_range, mark, offset, limit)

    async def read_bytes(self, ref_id: str, offset: int = 0, limit: int = 65536) -> TextSlice:
        """Whole characters within bytes `offset..offset+limit` (0-based).

        A character cut by either edge is left out, so the slice may start a little after
        `offset` (see `offset_bytes`) and be up to 3 bytes short of `limit`.
        """
        ref_id = validate_ref_id(ref_id)
        _check_int("offset", offset, 0)
        _check_int("limit", limit, 1)
        ref, mark = await self._on_index_thread(self._locate, ref_id, Index.mark_for_offset, offset)
        return await self._read(ref, read_byte_range, mark, offset, limit)

    async def read_chars(
        self, ref_id: str, line: int = 1, start: int = 0, length: int = 20_000
    ) -> LineChars:
        """Characters `start..start+length-1` (0-based) of line `line` (1-based): paging
        inside a line too long to read whole (see `managed_store.line_chars`)."""
        ref_id = validate_ref_id(ref_id)
        _check_int("line", line, 1)
        _check_int("start", start, 0)
        _check_int("length", length, 1)
        ref, mark = await self._on_index_thread(self._locate, ref_id, Index.mark_for_line, line)
        return await self._read_file(
            ref, lambda path, ref: read_line_chars(path, ref, mark, line, start, length)
        )

    async def grep(
        self,
        ref_id: str,
        pattern: str,
        *,
        max_matches: int = 100,
        context: int = 0,
        owner: str | None = None,
        time_limit: float | None = None,
    ) -> GrepResult:
        """Lines matching the RE2 `pattern` (`search`, per line, without line ending).

        Raises `InvalidPattern` (a `ValueError`) for a pattern that is too long, invalid or
        uses syntax RE2 leaves out (see `managed_store.pattern`), `TooManySearches` when
        `owner` already runs as many as the store's `SearchLimits.per_owner`, and
        `SearchTimeout` when the search runs past `time_limit` seconds (default: the
        store's), also inside one long line (see `managed_store.search`). Memory is
        O(longest line); each returned line is cut to 64 KiB.
        """
        ref_id = _grep_request(ref_id, pattern, max_matches, context)
        with self._searches.admitted(owner):
            # Compiling a long pattern takes milliseconds: never on the event loop.
            await self._searches.in_thread(functools.partial(compile_pattern, pattern))
            ref = await self._on_index_thread(self._lookup, ref_id)
            path = self._layout.object_path(ref.id)
            try:
                return await self._searches.run(ref.id, pattern, functools.partial(
                    grep_lines, path, ref, max_matches=max_matches, context=context),
                    time_limit=time_limit)
            except FileNotFoundError:
                raise _not_found(ref.id) from None  # evicted since the lookup

    async def stat(self, ref_id: str) -> ManagedRef:
        ref_id = validate_ref_id(ref_id)
        return await self._on_index_thread(self._lookup, ref_id)

    async def stats(self) -> StoreStats:
        return await self._on_index_thread(self._stats_sync)

    @property
    def owner_limits(self) -> OwnerLimits:
        """The owners' own byte limits (in place of the share); `set` them at any time."""
        return self._policy.limits

    async def owner_usage(self) -> dict[str, tuple[int, int]]:
        """(bytes held, limit) of each owner with its own limit (`OwnerLimits.usage`)."""
        held = await self._on_index_thread(Index.holdings)
        return self._policy.limits.usage({o: total for o, (total, _) in held.items()})

    async def cleanup(self) -> int:
        """Evict expired objects, then the oldest until the store is within its quota.

        Returns how many objects were evicted.
        """
        return await self._on_index_thread(self._cleanup_sync)

    # -- internals: event-loop side ------------------------------------------------------

    async def _cleanup_forever(self) -> None:
        while True:
            await asyncio.sleep(self._cleanup_interval)
            try:
                evicted = await self.cleanup()
            except StoreClosed:
                return
            except Exception:
                logger.exception(
                    "managed store cleanup failed; retrying in %ss", self._cleanup_interval
                )
            else:
                if evicted:
                    logger.info("managed store evicted %d objects", evicted)

    async def _on_index_thread(
        self, fn: Callable[Concatenate[Index, _P], _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        self._check_open()
        loop = asyncio.get_running_loop()
        try:
            job = loop.run_in_executor(
                self._executor, functools.partial(self._with_index, fn, *args, **kwargs)
            )
        except RuntimeError:  # executor shut down between the check and the submit
            raise StoreClosed("managed store is closed") from None
        return await job

    async def _read(
        self,
        ref: ManagedRef,
        fn: Callable[[Path, ManagedRef, LineMark, int, int], TextSlice],
        mark: LineMark,
        offset: int,
        limit: int,
    ) -> TextSlice:
        return await self._read_file(ref, functools.partial(_call_read, fn, mark, offset, limit))

    async def _read_file(self, ref: ManagedRef, fn: Callable[[Path, ManagedRef], _T]) -> _T:
        # The path is built from the id the index returned, never from the caller's string.
        path = self._layout.object_path(ref.id)
        try:
            return await asyncio.to_thread(fn, path, ref)
        except FileNotFoundError:
            # Evicted between the index lookup and the open.
            raise _not_found(ref.id) from None
        except OSError as exc:
            raise ManagedStoreError(
                f"could not read managed object {ref.id}: {describe_os_error(exc)}"
            ) from exc

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("managed store is closed")

    # -- internals: index thread ---------------------------------------------------------

    def _with_index(
        self, fn: Callable[Concatenate[Index, _P], _T], *args: _P.args, **kwargs: _P.kwargs
    ) -> _T:
        if self._index is None:
            raise StoreClosed("managed store is closed")
        return fn(self._index, *args, **kwargs)

    def _open_sync(self) -> None:
        layout = self._layout
        try:
            layout.create_dirs()
            self._lock = StoreLock.acquire(layout)
            self._index = Index.open(layout.index_path)
            self._reconcile_sync(self._index)
            self._last_created_at = self._index.newest_created_at()
        except OSError as exc:
            raise ManagedStoreError(
                f"cannot open managed store at {layout.root}: {describe_os_error(exc)}"
            ) from exc
        except sqlite3.Error as exc:
            raise ManagedStoreError(
                f"cannot open the index of managed store at {layout.root}: {exc}"
            ) from exc

    def _close_sync(self) -> None:
        if self._index is not None:
            self._index.close()
            self._index = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _reconcile_sync(self, index: Index) -> None:
        """Bring disk and index back in line after a crash.

        Temp files are writes that never finished; object files without a row were renamed
        but never recorded, so no caller ever saw their id; rows without a file point nowhere.
        """
        for temp in self._layout.temp_files():
            unlink_quietly(temp)
        files = self._layout.object_files()
        ids = index.ids()
        for orphan in files.keys() - ids:
            unlink_quietly(files[orphan])
        index.delete(ids - files.keys())

    def _commit_sync(
        self, written: WrittenObject, namespace: str, owner: str | None
    ) -> ManagedRef:
        index = self._index
        # This store's spools always write a temp file (`FileSink`).
        temp = written.path
        assert temp is not None
        try:
            if index is None:
                raise StoreClosed("managed store is closed")
            self._policy.check_fits(written.size_bytes)
            self._policy.check_owner_fits(written.size_bytes, owner)
            self._evicted_quota += self._evict_sync(
                index, self._policy.over_quota(index, written.size_bytes, owner))
            ref_id = new_ref_id()
            final = self._layout.object_path(ref_id)
            os.rename(temp, final)
        except BaseException as exc:
            unlink_quietly(temp)
            _raise_as_retention_error(exc)
        try:
            fsync_dir(self._layout.objects_dir)
            # Strictly increasing, so "oldest first" is the commit order even when two commits
            # read the same clock value (commits are serialized on this thread).
            created_at = max(time.time(), self._last_created_at + 1e-6)
            ref = ManagedRef(
                id=ref_id,
                size_bytes=written.size_bytes,
                lines=written.lines,
                created_at=created_at,
                namespace=namespace,
            )
            index.insert(ref, written.marks, owner)
            self._last_created_at = created_at
        except BaseException as exc:
            unlink_quietly(final)
            _raise_as_retention_error(exc)
        return ref

    def _cleanup_sync(self, index: Index) -> int:
        expired = self._evict_sync(index, self._policy.expired(index, time.time()))
        over = self._evict_sync(index, self._policy.over_quota(index, 0))
        self._evicted_expired += expired
        self._evicted_quota += over
        try:
            index.truncate_wal()
        except sqlite3.Error as exc:  # the WAL stays as it is until the next cleanup
            logger.warning("managed store: WAL checkpoint failed: %s", exc)
        return expired + over

    def _stats_sync(self, index: Index) -> StoreStats:
        path = self._layout.index_path
        index_bytes = sum(_size(p) for p in (path, path.with_name(path.name + "-wal")))
        return dataclasses.replace(
            index.totals(), evicted_expired=self._evicted_expired,
            evicted_quota=self._evicted_quota, index_bytes=index_bytes,
        )

    def _evict_sync(self, index: Index, victims: list[ManagedRef]) -> int:
        # Rows first: once the row is gone nobody can find the object; if we crash before the
        # unlink, the file is an orphan and goes at the next open.
        index.delete(ref.id for ref in victims)
        for ref in victims:
            unlink_quietly(self._layout.object_path(ref.id))
        return len(victims)

    def _locate(
        self,
        index: Index,
        ref_id: str,
        mark_for: Callable[[Index, str, int], LineMark],
        position: int,
    ) -> tuple[ManagedRef, LineMark]:
        ref = self._lookup(index, ref_id)
        return ref, (mark_for(index, ref.id, position) if ref.size_bytes else ORIGIN)

    @staticmethod
    def _lookup(index: Index, ref_id: str) -> ManagedRef:
        ref = index.get(ref_id)
        if ref is None:
            raise _not_found(ref_id)
        return ref


def _call_read(
    fn: Callable[[Path, ManagedRef, LineMark, int, int], TextSlice],
    mark: LineMark,
    offset: int,
    limit: int,
    path: Path,
    ref: ManagedRef,
) -> TextSlice:
    return fn(path, ref, mark, offset, limit)


def _size(path: Path) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


def _not_found(ref_id: str) -> ManagedNotFound:
    return ManagedNotFound(f"managed object {ref_id} not found (never stored, expired or evicted)")


def _raise_as_retention_error(exc: BaseException) -> NoReturn:
    """Re-raise `exc` as the `RetentionError` the contract promises for any write failure."""
    if isinstance(exc, ManagedStoreError) or not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, OSError):
        message = f"could not store the object: {describe_os_error(exc)}"
    elif isinstance(exc, sqlite3.Error):
        message = f"could not record the object in the index: {exc}"
    else:
        message = f"could not store the object: {exc!r}"
    raise RetentionError(message) from exc


def _grep_request(ref_id: object, pattern: object, max_matches: object, context: object) -> str:
    """A grep's arguments checked (the same for every store); the valid ref id."""
    ref_id = validate_ref_id(ref_id)
    _check_int("max_matches", max_matches, 1)
    _check_int("context", context, 0)
    check_pattern(pattern)
    return ref_id


def _check_int(name: str, value: object, minimum: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    if value > MAX_POSITION:
        raise ValueError(f"{name} must be <= 2**62, got {value}")


def _check_owner(owner: object) -> None:
    if owner is None:
        return
    if not isinstance(owner, str):
        raise TypeError(f"owner must be str or None, got {type(owner).__name__}")
    if not 0 < len(owner) <= _MAX_OWNER or not owner.isprintable():
        raise ValueError(f"owner must be 1-{_MAX_OWNER} printable characters, got {owner!r}")


def _check_namespace(namespace: object) -> None:
    if not isinstance(namespace, str):
        raise TypeError(f"namespace must be str, got {type(namespace).__name__}")
    if not 0 < len(namespace) <= _MAX_NAMESPACE or not namespace.isprintable():
        raise ValueError(
            f"namespace must be 1-{_MAX_NAMESPACE} printable characters, got {namespace!r}"
        )


if TYPE_CHECKING:

    def _is_a_text_store(store: ManagedStore) -> TextStore:
        # mypy proves here that the local engine keeps the exact shape of the seam.
        return store

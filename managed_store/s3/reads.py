"""The reads of `S3TextStore`: lines, bytes, characters, grep and `stat` of a committed object,
each served from its staging file while this replica still uploads it, else from the bucket with
ranged GETs (waiting for another replica's upload first). Imports its `managed_store` siblings;
exports `S3Reads`, the base class of `S3TextStore` that holds these methods (it owns no state:
it reads the store's attributes declared on it), and `DB_ERRORS`, what a failed query of the
index raises.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import asyncpg
import obstore
from obstore.exceptions import BaseError as ObjectStoreError

from managed_store.errors import ManagedStoreError, StoreClosed
from managed_store.index import MARK_BYTES
from managed_store.line_chars import LineChars, line_chars_in
from managed_store.pattern import compile_pattern
from managed_store.reading import (
    READ_BUFFER,
    GrepResult,
    ObjectReader,
    TextSlice,
    byte_range_in,
    grep_in,
    line_range_in,
)
from managed_store.refs import ManagedRef, validate_ref_id
from managed_store.s3.index import Found, PostgresIndex, Staged
from managed_store.s3.objects import RangedReader, describe
from managed_store.s3.staging import Staging, wait_for_upload
from managed_store.search import LineMatcher, Searches
from managed_store.store import _check_int, _grep_request, _not_found

if TYPE_CHECKING:
    from obstore.store import S3Store

    from managed_store.s3.settings import S3Settings

_T = TypeVar("_T")
DB_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
             asyncpg.exceptions.InternalClientError)
_CHARS_PREFETCH = 256 * 1024
"""Bytes past a line's mark that `read_chars` loads with its first GET."""
_STALE_BEATS = 3
"""Heartbeats an uploading replica may miss before readers take it for stopped."""


class S3Reads:
    """The read methods of `S3TextStore` (see there); `S3TextStore.__init__` sets the
    attributes below."""

    _client: S3Store
    _settings: S3Settings
    _index: PostgresIndex
    _staging: Staging | None
    _searches: Searches
    _read_wait: float
    _heartbeat: float
    _closed: bool

    async def read_lines(self, ref_id: str, offset: int = 1, limit: int = 2000) -> TextSlice:
        """Lines `offset..offset+limit-1` (1-based), each with its `\\n`: one ranged GET."""
        ref_id = validate_ref_id(ref_id)
        _check_int("offset", offset, 1)
        _check_int("limit", limit, 1)
        found, first, last = await self._found(ref_id, self._index.lines_at(
            ref_id, offset, offset + limit))
        ref = found[0]

        def read(reader: ObjectReader) -> TextSlice:
            return line_range_in(reader, ref, first, offset, limit)

        window = (first.byte_offset, last.byte_offset + MARK_BYTES)
        return await self._read_object(found, read, window if offset <= ref.lines else None)

    async def read_bytes(self, ref_id: str, offset: int = 0, limit: int = 65536) -> TextSlice:
        """Whole characters within bytes `offset..offset+limit` (see `ManagedStore`)."""
        ref_id = validate_ref_id(ref_id)
        _check_int("offset", offset, 0)
        _check_int("limit", limit, 1)
        found, mark = await self._found(ref_id, self._index.offset_at(ref_id, offset))
        ref = found[0]

        def read(reader: ObjectReader) -> TextSlice:
            return byte_range_in(reader, ref, mark, offset, limit)

        window = (mark.byte_offset, min(offset, ref.size_bytes) + limit + 3)
        return await self._read_object(found, read, window)

    async def read_chars(self, ref_id: str, line: int = 1, start: int = 0,
                         length: int = 20_000) -> LineChars:
        """Characters `start..start+length-1` of line `line` (see `ManagedStore`)."""
        ref_id = validate_ref_id(ref_id)
        _check_int("line", line, 1)
        _check_int("start", start, 0)
        _check_int("length", length, 1)
        found, mark, _ = await self._found(ref_id, self._index.lines_at(ref_id, line, line))
        ref = found[0]

        def read(reader: ObjectReader) -> LineChars:
            return line_chars_in(reader, ref, mark, line, start, length)

        window = (mark.byte_offset, mark.byte_offset + MARK_BYTES + _CHARS_PREFETCH)
        return await self._read_object(found, read, window if line <= ref.lines else None)

    async def grep(self, ref_id: str, pattern: str, *, max_matches: int = 100,
                   context: int = 0, owner: str | None = None,
                   time_limit: float | None = None) -> GrepResult:
        """Lines matching the RE2 `pattern` (see `ManagedStore.grep`), streamed with one GET,
        in a search thread and worker process (`managed_store.search`)."""
        ref_id = _grep_request(ref_id, pattern, max_matches, context)
        with self._searches.admitted(owner):
            await self._searches.in_thread(functools.partial(compile_pattern, pattern))
            found = await self._found(ref_id, self._index.get(ref_id))
            # The matcher exists only in the search thread, which runs the read. A read of the
            # staging file that finds it deleted (uploaded meanwhile) runs again from the
            # bucket, with a new search: each read uses its own search's matcher, the last.
            matchers: list[LineMatcher] = []

            def read(reader: ObjectReader) -> GrepResult:
                return grep_in(reader, found[0], matchers[-1], max_matches=max_matches,
                               context=context)

            def offload(job: Callable[[], GrepResult]) -> Awaitable[GrepResult]:
                def scan(matcher: LineMatcher) -> GrepResult:
                    matchers.append(matcher)
                    return job()

                return self._searches.run(ref_id, pattern, scan, time_limit=time_limit)

            return await self._read_object(found, read, offload=offload)

    async def stat(self, ref_id: str) -> ManagedRef:
        """The ref, from the index: at once on any replica, also while the object is still
        being uploaded (its size and lines are known from its commit on)."""
        ref_id = validate_ref_id(ref_id)
        return (await self._found(ref_id, self._index.get(ref_id)))[0]

    async def _on_index(self, query: Coroutine[Any, Any, _T]) -> _T:
        try:
            return await query
        except DB_ERRORS as exc:
            raise ManagedStoreError(f"could not read the managed store index: {exc}") from exc

    async def _found(self, ref_id: str, query: Coroutine[Any, Any, _T | None]) -> _T:
        if self._closed:
            query.close()
            raise StoreClosed("managed store is closed")
        found = await self._on_index(query)
        if found is None:
            raise _not_found(ref_id)
        return found

    async def _read_object(self, found: Found, fn: Callable[[ObjectReader], _T],
                           window: tuple[int, int] | None = None, *,
                           offload: Callable[[Callable[[], _T]], Awaitable[_T]] | None = None,
                           ) -> _T:
        """`fn` on a reader of the object, in a worker thread (`offload`: another way to run
        it off the loop; greps use their own threads): its staging file while this
        replica is still uploading it, else its bytes in the bucket (waiting for another
        replica's upload first). From the bucket, the bytes of `window` are fetched first,
        here: a read that stays within them (a page of lines, a byte range) holds a thread
        only while it scans, never while it waits for the network."""
        run = offload or asyncio.to_thread
        ref, staged = found
        if staged is not None:
            path = await self._uploaded_or_local(ref.id, staged)
            if path is not None:
                try:
                    return await run(functools.partial(_read_file, path, fn))
                except FileNotFoundError:
                    pass  # uploaded and deleted since: read the bucket
                except OSError as exc:
                    raise ManagedStoreError(
                        f"could not read managed object {ref.id}: {exc}") from exc
        key = self._settings.key(ref.id)
        reader = RangedReader(self._client, key, ref.size_bytes)
        try:
            if window is not None and (clipped := reader.window(*window)) is not None:
                data = await obstore.get_range_async(self._client, key, start=clipped[0],
                                                     end=clipped[1])

                def fn_on_data(reader: RangedReader) -> _T:
                    reader.install(clipped[0], data)
                    return fn(reader)

                return await run(functools.partial(fn_on_data, reader))
            return await run(functools.partial(fn, reader))
        except FileNotFoundError:
            raise _not_found(ref.id) from None  # evicted between the lookup and the read
        except (ObjectStoreError, OSError) as exc:
            raise ManagedStoreError(
                f"could not read managed object {ref.id}: {describe(exc)}") from exc

    async def _uploaded_or_local(self, ref_id: str, staged: Staged) -> Path | None:
        """The staging file when the object is being uploaded from here; else wait until
        its upload completed (None), bounded by `read_wait_seconds`."""
        if self._staging is not None and staged.staging == self._staging.staging_id:
            path = self._staging.local_path(ref_id)
            if path is not None:
                return path
        await wait_for_upload(ref_id, staged,
                              lambda: self._on_index(self._index.staging_of(ref_id)),
                              read_wait=self._read_wait,
                              stale_after=_STALE_BEATS * self._heartbeat)
        return None


def _read_file(path: Path, fn: Callable[[ObjectReader], _T]) -> _T:
    with open(path, "rb", buffering=READ_BUFFER) as file:
        return fn(file)

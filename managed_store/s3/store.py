"""`S3TextStore`: complete texts on S3-compatible object storage, indexed in PostgreSQL, shared
by every replica of a fleet. Imports its `managed_store` siblings; exports `S3TextStore` (how
it reads, writes and forgets: its docstring). It keeps the local store's contract
(`managed_store.protocol.TextStore`) with the same errors and result types. This module opens
and closes the store, writes and forgets; its reads are `s3.reads.S3Reads`, its base class.

    store = await S3TextStore.open(pool, S3Settings.from_url("s3://bucket/prefix", os.environ))
    async with store:
        ref = await store.put(text)               # on replica A
        page = await store.read_lines(ref.id, 1)  # on replica B, same bucket and database
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import os
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, NoReturn, Self

import asyncpg
import obstore
from obstore.exceptions import BaseError as ObjectStoreError

from managed_store.errors import ManagedStoreError, RetentionError, StoreClosed
from managed_store.index import StoreStats
from managed_store.refs import ManagedRef, new_ref_id
from managed_store.retention import OwnerLimits, RetentionPolicy
from managed_store.s3.index import LOCK_MANAGED_CLEANUP, PostgresIndex
from managed_store.s3.objects import S3Sink, describe
from managed_store.s3.reads import DB_ERRORS, S3Reads
from managed_store.s3.settings import S3Settings
from managed_store.s3.spool import S3Spool
from managed_store.s3.staging import StagedSink, Staging, Upload
from managed_store.search import Searches, SearchLimits
from managed_store.spool import SpoolWriter, WrittenObject, to_the_end
from managed_store.store import _check_namespace, _check_owner

if TYPE_CHECKING:
    from obstore.store import S3Store

    from managed_store.protocol import TextStore

logger = logging.getLogger(__name__)

_SWEEP_BATCH = 1000


class S3TextStore(S3Reads):
    """The `TextStore` on S3 + PostgreSQL. Create with `await S3TextStore.open(pool, settings)`.

    Any number of stores (replicas) may be open on one location at once. The pool is the
    caller's and stays open when the store closes.

    It keeps the local store's contract (`managed_store.protocol.TextStore`) with the same errors
    and result types, and the same spool: the UTF-8 checks, line counts and line marks are computed
    while the bytes stream out as a multipart upload (`objects.S3Sink`). Reads fetch what they need
    with ranged GETs: a line range costs one GET of at most the lines plus two `MARK_BYTES`, found
    from the marks in the index; grep streams the object through RE2 in a worker thread.

    Writes are write-behind when the store has a staging directory (`s3.staging`; the daemon's
    default): a spool writes a local file while its upload follows part by part, and the commit
    returns once the file is complete and the row is written, marked as staged; reads on this
    replica use the file until the upload ends, reads on others wait for it. Without one they are
    write-through: the commit returns once the multipart upload completed.

    Life of an object: its id is recorded as pending before its first byte is uploaded; the commit
    (one transaction) evicts what the quota needs gone, adds its row and marks and drops the pending
    row. Evicted rows leave pending rows behind, and a cleanup deletes those keys' bytes, then the
    rows. A key is never forgotten while it may still hold bytes: an upload interrupted by a crash
    is deleted once its pending row is older than `spool_grace_seconds`. See `s3.index`.
    """

    def __init__(self, pool: asyncpg.Pool, settings: S3Settings, client: S3Store,
                 policy: RetentionPolicy, *, cleanup_interval: float, part_bytes: int,
                 upload_concurrency: int, spool_grace_seconds: float, replica: str,
                 staging_bytes: int, read_wait: float, close_wait: float,
                 heartbeat: float) -> None:
        # Private: `open()` checks the arguments, migrates and reaches the bucket first.
        self._pool = pool
        self._settings = settings
        self._client = client
        self._index = PostgresIndex(pool, settings.location)
        self._policy = policy
        self._cleanup_interval = cleanup_interval
        self._part_bytes = part_bytes
        self._upload_concurrency = upload_concurrency
        self._spool_grace = spool_grace_seconds
        self._replica = replica
        self._staging: Staging | None = None
        self._staging_bytes = staging_bytes
        self._read_wait = read_wait
        self._close_wait = close_wait
        self._heartbeat = heartbeat
        # The environment's search limits (`SearchLimits.from_environ`), as the local store.
        self._searches = Searches(SearchLimits.from_environ(os.environ))
        self._spools: set[SpoolWriter] = set()
        self._commits: set[asyncio.Task[ManagedRef]] = set()
        self._cleanup_task: asyncio.Task[None] | None = None
        self._closed = False
        self._evicted_expired = 0
        self._evicted_quota = 0

    @classmethod
    async def open(
        cls,
        pool: asyncpg.Pool,
        settings: S3Settings,
        *,
        ttl_seconds: float = 7 * 86400,
        quota_bytes: int = 2 * 1024**3,
        cleanup_interval: float = 3600.0,
        part_bytes: int = 8 * 1024 * 1024,
        upload_concurrency: int = 4,
        spool_grace_seconds: float = 86400.0,
        owner_share: float = 0.5,
        staging_dir: Path | None = None,
        replica: str = "",
        staging_bytes: int = 1024**3,
        read_wait_seconds: float = 120.0,
        close_wait_seconds: float = 20.0,
        heartbeat_seconds: float = 5.0,
        owner_limits: OwnerLimits | None = None,
    ) -> Self:
        """Migrate the index, check that the bucket answers, run a first `cleanup()`.

        `quota_bytes` bounds the whole location (every replica's objects together).
        `part_bytes` (>= 5 MiB, S3's smallest part) is the multipart part size and the most
        a spool buffers per upload besides `upload_concurrency` parts in flight. A spool whose
        upload is not committed within `spool_grace_seconds` is taken for a crashed one and
        deleted. `owner_share` is the part of the quota one owner may hold, fleet-wide (see
        `put`); `owner_limits` replace it for the owners they cover. Raises
        `ManagedStoreError` when the database or the bucket cannot be used.

        With a `staging_dir` (under the replica's state directory) writes are write-behind:
        see `s3.staging`. `replica` names this replica in the rows of objects it is still
        uploading (and in the error another replica's read gets if it stops before the upload
        ends). At most `staging_bytes` of committed objects wait for their upload; past that a
        commit waits for its own upload. A read of an object another replica is still
        uploading waits up to `read_wait_seconds`; one whose replica renewed nothing for three
        `heartbeat_seconds` fails at once. `aclose` waits up to `close_wait_seconds` for the
        uploads, and the next store opened on the same directory resumes the rest. Without a
        staging directory, writes are write-through.
        """
        policy = RetentionPolicy(ttl_seconds=ttl_seconds, quota_bytes=quota_bytes,
                                 owner_share=owner_share, limits=owner_limits or OwnerLimits())
        if not cleanup_interval > 0:
            raise ValueError(f"cleanup_interval must be > 0, got {cleanup_interval!r}")
        if part_bytes < 5 * 1024 * 1024:
            raise ValueError(f"part_bytes must be >= 5 MiB, got {part_bytes!r}")
        if upload_concurrency < 1:
            raise ValueError(f"upload_concurrency must be >= 1, got {upload_concurrency!r}")
        if not spool_grace_seconds > 0:
            raise ValueError(f"spool_grace_seconds must be > 0, got {spool_grace_seconds!r}")
        for name, value in (("read_wait_seconds", read_wait_seconds),
                            ("close_wait_seconds", close_wait_seconds),
                            ("staging_bytes", staging_bytes)):
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be >= 0, got {value!r}")
        if not 0 < heartbeat_seconds < math.inf:
            raise ValueError(f"heartbeat_seconds must be > 0, got {heartbeat_seconds!r}")
        client = settings.open_client()
        store = cls(pool, settings, client, policy, cleanup_interval=cleanup_interval,
                    part_bytes=part_bytes, upload_concurrency=upload_concurrency,
                    spool_grace_seconds=spool_grace_seconds, replica=replica,
                    staging_bytes=staging_bytes, read_wait=read_wait_seconds,
                    close_wait=close_wait_seconds, heartbeat=heartbeat_seconds)
        where = f"s3://{settings.location}"
        try:
            await store._index.migrate()
        except DB_ERRORS as exc:
            raise ManagedStoreError(f"cannot open the index of {where}: {exc}") from exc
        try:
            await obstore.head_async(client, settings.key("reachable"))
        except FileNotFoundError:
            pass  # the bucket answered
        except (ObjectStoreError, OSError) as exc:
            raise ManagedStoreError(f"cannot reach the object store {where}: "
                                    f"{describe(exc)}") from exc
        try:
            if staging_dir is not None:
                await store._open_staging(staging_dir)
            await store.cleanup()
        except BaseException:
            await store.aclose()
            raise
        if not math.isinf(cleanup_interval):
            store._cleanup_task = asyncio.create_task(store._cleanup_forever(),
                                                      name=f"managed-store-cleanup {where}")
        return store

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()

    async def _open_staging(self, directory: Path) -> None:
        try:
            self._staging = await Staging.open(
                directory, self._settings.location, client=self._client,
                key_of=self._settings.key, index=self._index, part_bytes=self._part_bytes,
                upload_concurrency=self._upload_concurrency, heartbeat=self._heartbeat,
                replica=self._replica, delete_bytes=self._delete_bytes)
            lost = await self._staging.resume()
            if lost:
                logger.warning("managed store: %d objects committed in %s were never uploaded "
                               "and their staging files are gone; dropping them", len(lost),
                               self._staging.root)
                await self._index.drop(lost)
        except DB_ERRORS as exc:
            raise ManagedStoreError(f"cannot resume the uploads of s3://"
                                    f"{self._settings.location}: {exc}") from exc

    async def aclose(self) -> None:
        """Stop the cleanup task, abort open spools, let running commits end, then give the
        uploads still running (write-behind) up to `close_wait_seconds`. Idempotent.

        Returns once all that is done (staging directory released, no commit using the pool),
        also to a caller cancelled meanwhile, whose cancellation is raised after."""
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
            if self._commits:
                await asyncio.wait(list(self._commits))
        finally:
            if self._staging is not None:
                await self._staging.close(self._close_wait)

    # -- writing -------------------------------------------------------------------------

    async def put(
        self, text: str, *, namespace: str = "default", owner: str | None = None
    ) -> ManagedRef:
        """Store `text` whole and return its ref; `RetentionError` if it cannot be stored.

        `owner` names who the text counts against (None: nobody in particular), with the
        local store's rules applied to the whole location: an owner holds at most
        `owner_share` of the quota (or its own limit, `owner_limits`) and storing for it first
        evicts its own oldest objects; when the quota is full, the largest holder's oldest go
        first. An object over the share raises `OwnerShareExceeded` (a `RetentionError`), over
        the owner's own limit `OwnerLimitExceeded` (a subclass).
        """
        if not isinstance(text, str):
            raise TypeError(f"put() takes str, not {type(text).__name__}")
        _check_namespace(namespace)
        _check_owner(owner)
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
        ref_id = new_ref_id()
        if self._staging is None:
            return S3Spool(
                S3Sink(self._client, self._settings.key(ref_id), part_bytes=self._part_bytes,
                       max_concurrency=self._upload_concurrency),
                ref_id=ref_id, index=self._index, namespace=namespace,
                max_bytes=self._policy.quota_bytes,
                commit=functools.partial(self._commit, ref_id, owner=owner),
                live=self._spools, abandon=None)
        upload = self._staging.new(ref_id)
        spool = S3Spool(StagedSink(upload), ref_id=ref_id, index=self._index,
                         namespace=namespace, max_bytes=self._policy.quota_bytes,
                         commit=functools.partial(self._commit, ref_id, owner=owner,
                                                  upload=upload),
                         live=self._spools,
                         abandon=functools.partial(self._staging.abandon, [ref_id]))
        spool.begin_upload = functools.partial(self._staging.begin, upload)
        return spool

    async def _commit(self, ref_id: str, written: WrittenObject, namespace: str, *,
                      owner: str | None = None, upload: Upload | None = None) -> ManagedRef:
        if self._closed:
            await self._abandon([ref_id])
            raise StoreClosed("managed store is closed")
        # Once started, a commit runs to its end so the index and the bucket agree; a
        # cancelled caller just never learns the id (the object ages out like any other).
        # A shield (not `to_the_end`) by design: only `aclose` waits (for all `_commits`).
        job = asyncio.create_task(self._commit_job(ref_id, written, namespace, owner, upload))
        self._commits.add(job)
        job.add_done_callback(self._commits.discard)
        return await asyncio.shield(job)

    async def _commit_job(self, ref_id: str, written: WrittenObject, namespace: str,
                          owner: str | None, upload: Upload | None) -> ManagedRef:
        staged: tuple[str, str] | None = None
        try:
            self._policy.check_fits(written.size_bytes)
            self._policy.check_owner_fits(written.size_bytes, owner)
            if upload is not None and self._staging is not None:
                if (self._staging.staged_bytes + written.size_bytes > self._staging_bytes
                        and not upload.uploaded.is_set()):
                    # Over the staging cap: this object is written through.
                    await self._staging.wait_uploaded(upload)
                if not upload.uploaded.is_set():
                    staged = (self._staging.staging_id, self._replica)
            ref, victims = await self._index.commit(
                ref_id, namespace, written.size_bytes, written.lines, written.marks,
                self._policy, owner, staged)
        except BaseException as exc:
            await self._abandon([ref_id])
            _raise_as_retention_error(exc)
        if upload is not None and self._staging is not None:
            self._staging.committed(upload, staged=staged is not None)
        self._evicted_quota += len(victims)
        await self._abandon(victims)
        return ref

    async def _abandon(self, ref_ids: Sequence[str]) -> None:
        """Stop the uploads of these objects (if still uploading here), delete their bytes."""
        if self._staging is not None:
            await self._staging.abandon(ref_ids)
        await self._delete_bytes(ref_ids)

    async def _delete_bytes(self, ref_ids: Sequence[str]) -> None:
        """Delete these keys' bytes, then their pending rows; on failure both stay, for the
        next cleanup's sweep."""
        if not ref_ids:
            return
        try:
            await obstore.delete_async(self._client, [self._settings.key(i) for i in ref_ids])
            async with self._pool.acquire() as conn:
                await self._index.forget_all(conn, ref_ids)
        except (ObjectStoreError, *DB_ERRORS) as exc:  # OSError among them
            logger.warning("managed store: deleting %d objects failed (retried at the next "
                           "cleanup): %s", len(ref_ids), describe(exc))

    # -- the location's figures -------------------------------------------------------

    async def stats(self) -> StoreStats:
        """Objects and bytes of the whole location (every replica's); evictions counted by
        this store since it opened; the bytes of the index tables; writing behind, what this
        store staged and has not uploaded yet (`staged`; None when it writes through)."""
        self._check_open()
        totals = await self._on_index(self._index.totals())
        return StoreStats(count=totals.count, bytes=totals.bytes,
                          evicted_expired=self._evicted_expired,
                          evicted_quota=self._evicted_quota, index_bytes=totals.index_bytes,
                          staged=self._staging.report() if self._staging is not None else None)

    @property
    def owner_limits(self) -> OwnerLimits:
        """The owners' own byte limits (in place of the share); `set` them at any time (each
        replica applies its own, as each loads the same manifest)."""
        return self._policy.limits

    async def owner_usage(self) -> dict[str, tuple[int, int]]:
        """(bytes held in the whole location, limit) of each owner with its own limit."""
        self._check_open()
        return self._policy.limits.usage(await self._on_index(self._index.holdings()))

    # -- retention -----------------------------------------------------------------------

    async def cleanup(self) -> int:
        """Evict expired objects, then the oldest until the location is within its quota, and
        delete the bytes of every evicted (or abandoned) key. Runs on one replica at a time:
        returns 0 at once when another holds the cleanup lock; else how many it evicted."""
        self._check_open()
        try:
            async with self._pool.acquire() as conn:
                if not await conn.fetchval("SELECT pg_try_advisory_lock($1)",
                                           LOCK_MANAGED_CLEANUP):
                    return 0
                # A session-level lock (the sweep deletes objects between its transactions),
                # so this connection goes back to the pool only once it is unlocked: the
                # daemon's pool does not reset clean-looking connections. When the unlock
                # cannot run (cancelled mid-query, connection lost) the connection is closed,
                # which releases the lock with the session.
                unlocked = False
                try:
                    evicted = await self._index.evict(conn, self._policy, self._spool_grace)
                    self._evicted_expired += len(evicted.expired)
                    self._evicted_quota += len(evicted.over_quota)
                    if self._staging is not None:  # stop uploading what was just evicted
                        await self._staging.abandon([*evicted.expired, *evicted.over_quota])
                    await self._sweep(conn)
                finally:
                    try:
                        await conn.execute("SELECT pg_advisory_unlock($1)",
                                           LOCK_MANAGED_CLEANUP)
                        unlocked = True
                    finally:
                        if not unlocked:
                            conn.terminate()
        except DB_ERRORS as exc:
            raise ManagedStoreError(f"managed store cleanup failed: {exc}") from exc
        return len(evicted.expired) + len(evicted.over_quota)

    async def _sweep(self, conn: Any) -> None:
        while ids := await self._index.pending_before(conn, self._spool_grace, _SWEEP_BATCH):
            try:
                await obstore.delete_async(self._client, [self._settings.key(i) for i in ids])
            except (ObjectStoreError, OSError) as exc:
                logger.warning("managed store: deleting %d objects failed (retried at the "
                               "next cleanup): %s", len(ids), describe(exc))
                return
            await self._index.forget_all(conn, ids)
            if len(ids) < _SWEEP_BATCH:
                return

    async def _cleanup_forever(self) -> None:
        while True:
            await asyncio.sleep(self._cleanup_interval)
            try:
                evicted = await self.cleanup()
            except StoreClosed:
                return
            except Exception:
                logger.exception("managed store cleanup failed; retrying in %ss",
                                 self._cleanup_interval)
            else:
                if evicted:
                    logger.info("managed store evicted %d objects", evicted)

    # -- internals -----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosed("managed store is closed")


def _raise_as_retention_error(exc: BaseException) -> NoReturn:
    if isinstance(exc, ManagedStoreError) or not isinstance(exc, Exception):
        raise exc
    if isinstance(exc, DB_ERRORS):
        raise RetentionError(f"could not record the object in the index: {exc}") from exc
    raise RetentionError(f"could not store the object: {exc!r}") from exc


if TYPE_CHECKING:

    def _is_a_text_store(store: S3TextStore) -> TextStore:
        # mypy proves here that the S3 engine keeps the exact shape of the seam.
        return store


__all__ = ["S3TextStore"]

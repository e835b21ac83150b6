"""Write-behind: an object is committed from a local staging file and uploaded in the background.
Imports its `managed_store` siblings; exports `Staging` (the upload's life, retries, closing:
its docstring), `Upload`, `StagedSink` and `wait_for_upload`.

    staging = await Staging.open(directory, location, ...)
    upload = staging.new(ref_id)          # a spool opens: it writes `StagedSink(upload)`
    staging.begin(upload)                  # entered: the upload follows the file
    staging.committed(upload, staged=True) # the index row is written, marked as staged
    ...                                    # the upload ends: `mark_uploaded`, file deleted

Layout: `<directory>/<sha256(location)[:16]>/` (0700): `lock` (one store per directory at a
time), `id` (the staging id rows name, kept across restarts), `objects/<ref id>` (0600).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import fcntl
import hashlib
import logging
import os
import secrets
import threading
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import asyncpg
import obstore

from managed_store.errors import ManagedStoreError, RetentionError
from managed_store.index import StagedStats
from managed_store.layout import describe_os_error, fsync_dir, private_opener, unlink_quietly
from managed_store.refs import validate_ref_id
from managed_store.s3.index import Found, Staged
from managed_store.s3.objects import describe
from managed_store.sink import FileSink
from managed_store.spool import to_the_end
from managed_store.store import _not_found

if TYPE_CHECKING:
    from obstore import AsyncWritableFile
    from obstore.store import S3Store

    from managed_store.s3.index import PostgresIndex

logger = logging.getLogger(__name__)

HEAD_START = 0.5
"""Seconds a spool writes before its parts start to go up. A spool that ends sooner (100 MB
from a fast producer takes 0.1-0.2 s) is sent in one go after its commit: uploading while it
writes would only take the CPU from the spool (and, with the S3 server on the same machine,
from the commit), and sending the finished file was faster too (measured: 0.9 s instead of
1.1-2.1 s for 100 MB with SeaweedFS on the same 2 cores). A longer spool (a tool streaming its
output) sends its parts while it writes."""
UPLOADS_AT_ONCE = 4
"""Uploads running at a time per store (each with its own parts in flight); more wait."""
_RETRY_FIRST = 0.5
_RETRY_MAX = 30.0
_ABORT_WAIT = 5.0
_WAIT_FIRST = 0.05
_WAIT_MAX = 0.25
# InternalClientError: a pooled connection whose server process just ended (a database
# restart) fails a statement so for about a millisecond (sidecar.backends.postgres.pool.failures)
_DB_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
              asyncpg.exceptions.InternalClientError)


class UploadState(enum.Enum):
    SPOOLING = "spooling"  # the spool still writes; no row yet
    STAGED = "staged"  # committed; the row says the bytes are in this staging directory
    THROUGH = "through"  # committed after its upload ended; the row says it is in the bucket
    ABANDONED = "abandoned"  # aborted, refused, evicted or lost


class Upload:
    """One object's upload from its staging file. The spool's threads report progress
    (`wrote`, `completed`); everything else runs on the event loop."""

    def __init__(self, ref_id: str, key: str, path: Path, part_bytes: int,
                 loop: asyncio.AbstractEventLoop) -> None:
        self.ref_id = ref_id
        self.key = key
        self.path = path
        self.state = UploadState.SPOOLING
        self.outcome: asyncio.Future[UploadState] = loop.create_future()
        self.uploaded = asyncio.Event()
        """Set once the bytes are in the bucket."""
        self.failed = asyncio.Event()
        self.failure = ""
        self.failed_at = 0.0
        self.task: asyncio.Task[None] | None = None
        self.begun = time.monotonic()
        self.staged_at: float | None = None
        """When its commit wrote its row (`time.monotonic()`); None before."""
        self._loop = loop
        self._part_bytes = part_bytes
        self._lock = threading.Lock()
        self._size = 0
        self._finished = False
        self._wake_at = part_bytes
        self._wake = asyncio.Event()

    # -- the spool's threads -------------------------------------------------------------

    def wrote(self, count: int) -> None:
        with self._lock:
            self._size += count
            wake = self._size >= self._wake_at
            if wake:
                self._wake_at = self._size + self._part_bytes
        if wake:
            self._signal()

    def completed(self) -> None:
        with self._lock:
            self._finished = True
        self._signal()

    def _signal(self) -> None:
        with contextlib.suppress(RuntimeError):  # the loop is closed: nobody uploads any more
            self._loop.call_soon_threadsafe(self._wake.set)

    # -- the event loop ------------------------------------------------------------------

    @property
    def size(self) -> int:
        with self._lock:
            return self._size

    def restored(self, size: int) -> None:
        """A file left complete by an earlier store (resumed at open)."""
        with self._lock:
            self._size = size
            self._finished = True

    def progress(self) -> tuple[int, bool]:
        self._wake.clear()
        with self._lock:
            return self._size, self._finished

    async def changed(self) -> None:
        await self._wake.wait()


class StagedSink:
    """The `ObjectSink` of a write-behind spool: the staging file (`FileSink`), reporting to
    its `Upload` what is written. `finish` also makes the file's name durable."""

    def __init__(self, upload: Upload) -> None:
        self._upload = upload
        self._file = FileSink(upload.path)

    @property
    def path(self) -> Path:
        return self._upload.path

    def create(self) -> None:
        self._file.create()

    def write(self, data: bytes) -> None:
        self._file.write(data)
        self._file.flush()  # the upload reads the file with its own descriptor
        self._upload.wrote(len(data))

    def finish(self) -> None:
        self._file.finish()
        fsync_dir(self._upload.path.parent)
        self._upload.completed()

    def discard(self) -> None:
        self._file.discard()


class Staging:
    """The staging directory of one store and the uploads from it. Create with `open`.

    A spool writes its bytes to `objects/<ref id>` under the staging directory (private, written
    back to disk as it grows and fsynced at the end, as the local store's temp files are) while a
    task on the event loop reads what is written and sends it as a multipart upload, a part at a
    time, once the spool has written for `HEAD_START` seconds (a shorter spool is sent whole
    after its commit). The commit returns once the file is complete and the index row is
    written with `staged_in` = this directory's id: the object is then as durable as in the
    local directory store, and readable on this replica (from the file). Other replicas wait
    until the row says the upload completed; the uploader renews `touched_at` of its rows every
    `heartbeat` seconds, so a reader can tell a replica that stopped from a slow upload.

    An upload that fails is tried again from the start of the file (backoff up to 30 s) for as long
    as the store is open. Evicting or dropping an object still uploading cancels its upload (the
    multipart upload is aborted) and deletes its file. Closing waits a bounded time for the
    uploads, then cancels the rest and keeps their files: the next store opened on the same
    directory uploads them again. Files nobody committed (a spool cut short by a crash) are
    deleted then.
    """

    def __init__(self, root: Path, staging_id: str, lock_fd: int, *, client: S3Store,
                 key_of: Callable[[str], str],
                 index: PostgresIndex, part_bytes: int, upload_concurrency: int,
                 heartbeat: float, replica: str,
                 delete_bytes: Callable[[Sequence[str]], Awaitable[None]]) -> None:
        self.root = root
        self.staging_id = staging_id
        self._lock_fd: int | None = lock_fd
        self._client = client
        self._key_of = key_of
        self._index = index
        self._part_bytes = part_bytes
        self._concurrency = upload_concurrency
        self._heartbeat = heartbeat
        self._replica = replica
        self._delete_bytes = delete_bytes
        self._uploads: dict[str, Upload] = {}
        self._slots = asyncio.Semaphore(UPLOADS_AT_ONCE)
        self._loop = asyncio.get_running_loop()
        self._heartbeat_task: asyncio.Task[None] | None = None

    @classmethod
    async def open(cls, directory: Path, location: str, *, client: S3Store,
                   key_of: Callable[[str], str],
                   index: PostgresIndex, part_bytes: int, upload_concurrency: int,
                   heartbeat: float, replica: str,
                   delete_bytes: Callable[[Sequence[str]], Awaitable[None]]) -> Staging:
        """Create (or take over) the directory of `location` under `directory`. Raises
        `ManagedStoreError` when it cannot be used or another store holds it."""
        root = Path(directory) / hashlib.sha256(location.encode()).hexdigest()[:16]
        staging_id, lock_fd = await asyncio.to_thread(_prepare, root)
        staging = cls(root, staging_id, lock_fd, client=client, key_of=key_of, index=index,
                      part_bytes=part_bytes, upload_concurrency=upload_concurrency,
                      heartbeat=heartbeat, replica=replica, delete_bytes=delete_bytes)
        staging._heartbeat_task = asyncio.create_task(
            staging._heartbeat_forever(), name=f"managed-store-heartbeat {root}")
        return staging

    @property
    def staged_bytes(self) -> int:
        """Bytes committed from here and not uploaded yet."""
        return sum(u.size for u in self._uploads.values() if u.state is UploadState.STAGED)

    def report(self) -> StagedStats:
        """What waits here for its upload: objects committed as staged whose row is not
        marked uploaded yet (as `staged_bytes` counts them), the age of the oldest commit,
        and the uploads that failed an attempt (tried again) with the last failure."""
        staged = [u for u in self._uploads.values() if u.state is UploadState.STAGED]
        now = time.monotonic()
        oldest = min((u.staged_at for u in staged if u.staged_at is not None), default=now)
        retrying = [u for u in staged if u.failed.is_set() and not u.uploaded.is_set()]
        return StagedStats(
            objects=len(staged), bytes=sum(u.size for u in staged),
            oldest_seconds=round(max(0.0, now - oldest), 1), retrying=len(retrying),
            last_error=max(retrying, key=lambda u: u.failed_at).failure if retrying else None)

    def new(self, ref_id: str) -> Upload:
        """The upload of a new spool's object; `begin` it once the spool is entered."""
        return Upload(ref_id, self._key_of(ref_id), self.root / "objects" / ref_id,
                      self._part_bytes, self._loop)

    def begin(self, upload: Upload) -> None:
        """Start following the staging file: the first part goes up once it is written."""
        self._uploads[upload.ref_id] = upload
        upload.task = asyncio.create_task(self._run(upload),
                                          name=f"managed-store-upload {upload.ref_id}")

    def local_path(self, ref_id: str) -> Path | None:
        """The staging file of an object committed here and not uploaded yet (it may be
        deleted at any moment once the upload ends: then read the bucket)."""
        upload = self._uploads.get(ref_id)
        if upload is None or upload.state not in (UploadState.STAGED, UploadState.THROUGH):
            return None
        return upload.path

    async def wait_uploaded(self, upload: Upload) -> None:
        """Until the bytes are in the bucket; `RetentionError` at the first failed attempt
        (the object is then refused: a write-through commit)."""
        if upload.uploaded.is_set():
            return
        uploaded = asyncio.ensure_future(upload.uploaded.wait())
        failed = asyncio.ensure_future(upload.failed.wait())
        try:
            await asyncio.wait([uploaded, failed], return_when=asyncio.FIRST_COMPLETED)
        finally:
            uploaded.cancel()
            failed.cancel()
        if not upload.uploaded.is_set():
            raise RetentionError(f"could not upload the object: {upload.failure}")

    def committed(self, upload: Upload, *, staged: bool) -> None:
        """The commit wrote the row: as staged (the upload marks it uploaded once done), or
        as uploaded (the upload had ended)."""
        upload.state = UploadState.STAGED if staged else UploadState.THROUGH
        upload.staged_at = time.monotonic()
        if not upload.outcome.done():
            upload.outcome.set_result(upload.state)

    async def abandon(self, ref_ids: Sequence[str]) -> None:
        """Stop the uploads of these objects (aborting their multipart uploads) and delete
        their files. Ids without an upload here are ignored. The caller deletes the keys.

        Returns once the uploads ended and the files are gone, also to a caller cancelled
        meanwhile (a cleanup stopped by `aclose`, a cancel scope), whose cancellation is raised
        after: `close` no longer sees these uploads, so none may still read its file then."""
        await to_the_end(self._abandon(ref_ids))

    async def _abandon(self, ref_ids: Sequence[str]) -> None:
        stopped = []
        for ref_id in ref_ids:
            upload = self._uploads.pop(ref_id, None)
            if upload is None:
                continue
            upload.state = UploadState.ABANDONED
            if not upload.outcome.done():
                upload.outcome.set_result(UploadState.ABANDONED)
            if upload.task is not None:
                upload.task.cancel()
                stopped.append(upload.task)
        if stopped:
            await asyncio.wait(stopped)
        for ref_id in ref_ids:
            await asyncio.to_thread(unlink_quietly, self.root / "objects" / ref_id)

    async def resume(self) -> list[str]:
        """At open: upload again what an earlier store on this directory committed and did
        not upload; delete files nobody committed. Returns the ids of rows whose file is
        missing or incomplete (their bytes are lost: the caller drops them)."""
        rows = await self._index.staged_in(self.staging_id)
        files = await asyncio.to_thread(_files, self.root / "objects")
        lost = []
        for name in files:
            if name not in rows:
                await asyncio.to_thread(unlink_quietly, self.root / "objects" / name)
        now, wall = time.monotonic(), time.time()
        for ref_id, size in rows.items():
            if files.get(ref_id, (None, 0.0))[0] != size:
                lost.append(ref_id)
                await asyncio.to_thread(unlink_quietly, self.root / "objects" / ref_id)
                continue
            upload = Upload(ref_id, self._key_of(ref_id), self.root / "objects" / ref_id,
                            self._part_bytes, self._loop)
            upload.restored(size)
            upload.state = UploadState.STAGED
            # committed when its file was last written (an earlier store's commit)
            upload.staged_at = now - max(0.0, wall - files[ref_id][1])
            upload.outcome.set_result(UploadState.STAGED)
            self.begin(upload)
        if len(rows) > len(lost):
            # Renewed at once: replicas waiting for these took this one for stopped.
            await self._index.touch(self.staging_id, self._replica)
            logger.info("managed store: resuming %d uploads from %s", len(rows) - len(lost),
                        self.root)
        return lost

    async def close(self, wait: float) -> None:
        """Let running uploads end within `wait` seconds, then stop the rest (their files stay
        for the next store on this directory) and release the directory.

        Returns once the directory is released, also to a caller cancelled meanwhile, whose
        cancellation is raised after (another store may open the directory then)."""
        await to_the_end(self._close(wait))

    async def _close(self, wait: float) -> None:
        running = [u.task for u in self._uploads.values() if u.task is not None
                   and not u.task.done()]
        if running and wait > 0:
            await asyncio.wait(running, timeout=wait)
        left = {u.ref_id: u.task for u in self._uploads.values()
                if u.task is not None and not u.task.done()}
        for ref_id, task in left.items():
            logger.warning(
                "managed store: the upload of %s (%d bytes) did not end within %g s of "
                "closing; it resumes when a store opens on %s", ref_id,
                self._uploads[ref_id].size, wait, self.root)
            task.cancel()
        if left:
            await asyncio.wait(left.values())
        if self._heartbeat_task is not None:
            self._heartbeat_task.cancel()
            await asyncio.wait([self._heartbeat_task])
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None

    # -- internals -----------------------------------------------------------------------

    async def _run(self, upload: Upload) -> None:
        delay = _RETRY_FIRST
        while True:
            try:
                async with self._slots:
                    await self._upload_once(upload)
                break
            except Exception as exc:
                upload.failure = describe(exc)
                upload.failed_at = time.monotonic()
                upload.failed.set()
                logger.warning("managed store: uploading %s failed (trying again in %g s): %s",
                               upload.ref_id, delay, upload.failure)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        upload.uploaded.set()
        state = await upload.outcome
        if state is UploadState.STAGED:
            await self._mark_uploaded(upload)
        if self._uploads.get(upload.ref_id) is upload:
            del self._uploads[upload.ref_id]
            await asyncio.to_thread(unlink_quietly, upload.path)

    async def _mark_uploaded(self, upload: Upload) -> None:
        delay = _RETRY_FIRST
        while True:
            try:
                present = await self._index.mark_uploaded(upload.ref_id, self.staging_id)
                break
            except _DB_ERRORS as exc:
                logger.warning("managed store: could not mark %s uploaded (trying again in "
                               "%g s): %s", upload.ref_id, delay, exc)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RETRY_MAX)
        if not present:  # evicted while it was uploading: its bytes must not outlive it
            await self._delete_bytes([upload.ref_id])

    async def _upload_once(self, upload: Upload) -> None:
        """Send the file as it grows: a part goes up once `part_bytes` are buffered, a
        small object is one PUT at the end. Any failure aborts the multipart upload."""
        writer = obstore.open_writer_async(self._client, upload.key,
                                           buffer_size=self._part_bytes,
                                           max_concurrency=self._concurrency)
        fd: int | None = None
        sent = 0
        try:
            await _head_start(upload)
            while True:
                size, finished = upload.progress()
                if sent < size:
                    if fd is None:
                        fd = await asyncio.to_thread(os.open, upload.path, os.O_RDONLY)
                    data = await asyncio.to_thread(
                        os.pread, fd, min(self._part_bytes, size - sent), sent)
                    if not data:
                        raise OSError(f"the staging file {upload.path} ends at {sent} bytes, "
                                      f"{size} were written")
                    await writer.write(data)
                    sent += len(data)
                elif finished:
                    break
                else:
                    await upload.changed()
            await writer.close()
        except BaseException:
            await _abort(writer)
            raise
        finally:
            if fd is not None:
                os.close(fd)

    async def _heartbeat_forever(self) -> None:
        while True:
            await asyncio.sleep(self._heartbeat)
            staged = [u for u in self._uploads.values() if u.state is UploadState.STAGED]
            if not staged:
                continue
            try:
                alive = await self._index.touch(self.staging_id, self._replica)
                # Rows evicted by another replica while their bytes were still uploading here.
                gone = [u.ref_id for u in staged
                        if u.ref_id not in alive and not u.uploaded.is_set()]
                if gone:
                    await self.abandon(gone)
                    await self._delete_bytes(gone)
            except _DB_ERRORS as exc:
                logger.warning("managed store: could not renew the uploads of %s: %s",
                               self.root, exc)
            except Exception:  # the renewals must go on: readers elsewhere count on them
                logger.exception("managed store: renewing the uploads of %s failed", self.root)


async def wait_for_upload(ref_id: str, staged: Staged,
                          lookup: Callable[[], Awaitable[Found | None]], *, read_wait: float,
                          stale_after: float) -> None:
    """On a replica that is not uploading `ref_id`: poll its row (`lookup`, backing off from
    50 ms to 250 ms) until the upload completed. `ManagedStoreError` once `read_wait` seconds
    passed, or at once when the uploading replica renewed nothing for `stale_after` seconds
    (it stopped: the bytes are only in its staging directory); `ManagedNotFound` if the object
    is evicted meanwhile. Cancellable between polls."""
    deadline = time.monotonic() + read_wait
    delay = _WAIT_FIRST
    current: Staged | None = staged
    while current is not None:
        if current.idle > stale_after:
            raise ManagedStoreError(
                f"managed object {ref_id} cannot be read: its replica {current.replica} "
                f"stopped before its upload completed (no sign of it for {current.idle:.0f} s);"
                " it is readable again only if that replica restarts with the same state "
                "directory")
        if time.monotonic() >= deadline:
            raise ManagedStoreError(
                f"managed object {ref_id} is still being uploaded by replica "
                f"{current.replica} after {read_wait:g} s; try again later")
        await asyncio.sleep(min(delay, max(0.0, deadline - time.monotonic())))
        delay = min(delay * 2, _WAIT_MAX)
        found = await lookup()
        if found is None:
            raise _not_found(ref_id)
        current = found[1]


async def _head_start(upload: Upload) -> None:
    """Until the spool finished or wrote for `HEAD_START` seconds."""
    while not upload.progress()[1]:
        left = upload.begun + HEAD_START - time.monotonic()
        if left <= 0:
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(upload.changed(), left)


async def _abort(writer: AsyncWritableFile) -> None:
    """Leave the writer with an error, which aborts its multipart upload; bounded, and kept
    going in the background when the caller is cancelled meanwhile.

    A shield (not `to_the_end`) by design: nothing waits for the abort (an upload that did
    not complete leaves no object under its key; its parts are left to the bucket's lifecycle
    rules after `_ABORT_WAIT` anyway), and the upload task running this must end promptly
    when `abandon` or `close` cancels it again."""
    job = asyncio.ensure_future(writer.__aexit__(RetentionError, RetentionError("abandoned"),
                                                 None))
    try:
        await asyncio.wait_for(asyncio.shield(job), _ABORT_WAIT)
    except TimeoutError:
        logger.warning("managed store: aborting an upload took over %g s; left to the bucket's "
                       "lifecycle rules", _ABORT_WAIT)
    except Exception as exc:
        logger.debug("managed store: aborting an upload failed: %s", describe(exc))


def _prepare(root: Path) -> tuple[str, int]:
    """Make the directory (private), lock it, read or create its id."""
    try:
        (root / "objects").mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(root, 0o700)
        os.chmod(root / "objects", 0o700)
        lock_fd = os.open(root / "lock", os.O_RDWR | os.O_CREAT, 0o600)
    except OSError as exc:
        raise ManagedStoreError(f"cannot use the staging directory {root}: "
                                f"{describe_os_error(exc)}") from exc
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(lock_fd)
        raise ManagedStoreError(f"the staging directory {root} is in use by another "
                                "store") from None
    try:
        id_path = root / "id"
        try:
            staging_id = id_path.read_text().strip()
        except FileNotFoundError:
            staging_id = ""
        if not staging_id:
            staging_id = "st_" + secrets.token_hex(12)
            temp = root / "id.tmp"
            with open(temp, "w", opener=private_opener) as f:
                f.write(staging_id)
                f.flush()
                os.fsync(f.fileno())
            os.replace(temp, id_path)
            fsync_dir(root)
    except OSError as exc:
        os.close(lock_fd)
        raise ManagedStoreError(f"cannot use the staging directory {root}: "
                                f"{describe_os_error(exc)}") from exc
    return staging_id, lock_fd


def _files(directory: Path) -> dict[str, tuple[int, float]]:
    """The staging files by name: (size, modification time)."""
    found = {}
    for entry in os.scandir(directory):
        try:
            validate_ref_id(entry.name)
        except (ValueError, ManagedStoreError):
            unlink_quietly(Path(entry.path))  # a stray name: nothing of ours
            continue
        stat = entry.stat()
        found[entry.name] = (stat.st_size, stat.st_mtime)
    return found

"""The S3 engine's spool: a `SpoolWriter` whose key is recorded in the index as pending before
its first byte goes up, and forgotten again when the spool is aborted (with its upload): by the
time `abort()` returns, or a cancelled spool's task is seen to end, the upload is aborted and
the pending row is gone."""

from __future__ import annotations

import logging
from collections.abc import Callable, Coroutine
from typing import TYPE_CHECKING, Any, Self

import asyncpg

from managed_store.errors import RetentionError
from managed_store.spool import SpoolWriter, WrittenObject, _SpoolState, to_the_end

if TYPE_CHECKING:
    from managed_store.s3.index import PostgresIndex
    from managed_store.s3.objects import S3Sink
    from managed_store.s3.staging import StagedSink

logger = logging.getLogger(__name__)

# InternalClientError: a pooled connection whose server process just ended (a database
# restart) fails a statement so for about a millisecond (sidecar.backends.postgres.pool.failures)
_DB_ERRORS = (OSError, asyncpg.PostgresError, asyncpg.InterfaceError,
              asyncpg.exceptions.InternalClientError)


class S3Spool(SpoolWriter):
    """A `SpoolWriter` whose key is recorded as pending before its first byte goes up, and
    forgotten again when the spool is aborted (its upload was aborted with it). A write-behind
    spool starts its upload (`begin_upload`) once entered and abandons it when aborted."""

    def __init__(self, sink: S3Sink | StagedSink, *, ref_id: str, index: PostgresIndex,
                 namespace: str, max_bytes: int, commit: Callable[[WrittenObject, str], Any],
                 live: set[SpoolWriter],
                 abandon: Callable[[], Coroutine[Any, Any, None]] | None) -> None:
        super().__init__(sink, namespace=namespace, max_bytes=max_bytes, commit=commit,
                         live=live)
        self._ref_id = ref_id
        self._index = index
        self._pending = False
        self._abandon = abandon
        self.begin_upload: Callable[[], None] | None = None

    async def __aenter__(self) -> Self:
        if self._state is _SpoolState.NEW:
            try:
                await self._index.begin(self._ref_id)
            except _DB_ERRORS as exc:
                raise RetentionError(f"could not record the upload in the index: {exc}") from exc
            self._pending = True
        try:
            entered = await super().__aenter__()
        except BaseException:
            await self._forget()
            raise
        if self.begin_upload is not None:
            begin, self.begin_upload = self.begin_upload, None
            begin()
        return entered

    async def _discard(self) -> None:
        await super()._discard()
        if self._abandon is not None:  # the background upload of the staging file
            abandon, self._abandon = self._abandon, None
            await abandon()
        await self._drop_pending()

    async def _forget(self) -> None:
        await to_the_end(self._drop_pending())

    async def _drop_pending(self) -> None:
        if not self._pending:
            return
        self._pending = False
        try:
            await self._index.forget(self._ref_id)
        except _DB_ERRORS as exc:  # the sweep drops it after the grace period
            logger.warning("managed store: could not drop a pending upload: %s", exc)

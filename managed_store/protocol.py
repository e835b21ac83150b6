"""The seam other engines implement: `TextStore` (and the `TextSpool` it hands out).

`ManagedStore` is the local-disk implementation. An engine on S3-compatible storage or
PostgreSQL implements the same methods with the same errors (`InvalidRef`, `ManagedNotFound`,
`RetentionError`, `ValueError` for bad arguments) and the same result types.
"""

from __future__ import annotations

from types import TracebackType
from typing import Protocol, Self, runtime_checkable

from managed_store.index import StoreStats
from managed_store.line_chars import LineChars
from managed_store.reading import GrepResult, TextSlice
from managed_store.refs import ManagedRef
from managed_store.retention import OwnerLimits
from managed_store.spool import Drained


class TextSpool(Protocol):
    """Streams one object in; see `SpoolWriter` for the semantics an engine must keep."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def write(self, chunk: str | bytes) -> None: ...

    async def commit(self) -> ManagedRef: ...

    async def abort(self) -> None: ...


@runtime_checkable
class FdSpool(TextSpool, Protocol):
    """A spool that can also read a file descriptor itself, off the event loop (optional: a
    producer checks with `isinstance` and writes chunks otherwise); see
    `SpoolWriter.write_from`."""

    async def write_from(self, fd: int, drained: Drained) -> None: ...


class TextStore(Protocol):
    """Complete texts kept out of a model's context, read back in ranges or by grep."""

    async def __aenter__(self) -> Self: ...

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None: ...

    async def aclose(self) -> None: ...

    async def put(
        self, text: str, *, namespace: str = "default", owner: str | None = None
    ) -> ManagedRef:
        """`owner`: who the text counts against (None: nobody in particular). An engine
        that enforces per-owner shares (the local one: at most `owner_share` of the quota per
        owner, or the owner's own limit from `owner_limits`, its own oldest evicted first)
        raises `OwnerShareExceeded` for an object over the share (`OwnerLimitExceeded` over
        the owner's limit); one that does not ignores it."""
        ...

    def open_spool(self, *, namespace: str = "default", owner: str | None = None) -> TextSpool: ...

    async def read_lines(self, ref_id: str, offset: int = 1, limit: int = 2000) -> TextSlice: ...

    async def read_bytes(self, ref_id: str, offset: int = 0, limit: int = 65536) -> TextSlice: ...

    async def read_chars(
        self, ref_id: str, line: int = 1, start: int = 0, length: int = 20_000
    ) -> LineChars: ...

    async def grep(
        self, ref_id: str, pattern: str, *, max_matches: int = 100, context: int = 0,
        owner: str | None = None, time_limit: float | None = None,
    ) -> GrepResult: ...

    async def stat(self, ref_id: str) -> ManagedRef: ...

    async def stats(self) -> StoreStats: ...

    @property
    def owner_limits(self) -> OwnerLimits:
        """Byte limits of single owners in place of the share, replaceable at any time."""
        ...

    async def owner_usage(self) -> dict[str, tuple[int, int]]:
        """(bytes held, limit) of each owner `owner_limits` covers (`OwnerLimits.usage`)."""
        ...

    async def cleanup(self) -> int: ...

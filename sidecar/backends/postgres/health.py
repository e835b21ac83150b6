"""Whether the fleet database answers (`sidecar.stores.database_check.DatabaseCheck`), for
`/v1/health`. Imports this package (and `asyncpg` for types only); exports `PoolCheck`.

A replica that cannot reach its database cannot settle durable calls, share snapshots or
list the fleet's asks: health then says so (`status` "unavailable", `database.error`), and
`/v1/health` answers 503 so a readiness probe takes the replica out of rotation until the
database is back (docs/fleet.md, "Health").
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from sidecar.backends.postgres.pool import failures

if TYPE_CHECKING:
    import asyncpg

__all__ = ["PoolCheck"]

CHECK_TIMEOUT = 3.0
"""Seconds the check waits for a connection and `SELECT 1` before it calls the database
unreachable (the probes' own timeout is longer: 5 s)."""
FRESH_SECONDS = 1.0
"""A result this young is reused: health asked by several probes at once checks once."""


class PoolCheck:
    """`SELECT 1` on a connection of the replica's pool. `label` names the database in the
    reason (host, port and database name: never a user or password)."""

    def __init__(self, pool: asyncpg.Pool, label: str, *,
                 timeout: float = CHECK_TIMEOUT) -> None:
        self._pool = pool
        self._label = label
        self._timeout = timeout
        self._checking: asyncio.Task[str | None] | None = None
        self._checked_at = -FRESH_SECONDS
        self._selecting: asyncio.Task[None] | None = None

    @property
    def label(self) -> str:
        """`host:port/name`: how answers name the database (`sidecar.stores.database_down`)."""
        return self._label

    async def unreachable(self) -> str | None:
        loop = asyncio.get_running_loop()
        task = self._checking
        if task is None or (task.done() and loop.time() - self._checked_at > FRESH_SECONDS):
            task = self._checking = loop.create_task(self._check())
            self._checked_at = loop.time()
        return await asyncio.shield(task)

    async def _check(self) -> str | None:
        # The SELECT runs on in the background past the timeout: giving its connection back
        # after a hung statement waits for asyncpg's cancel (SIDECAR_DATABASE_TIMEOUT), which
        # the answer must not. One at a time: a later check waits on the same one.
        if self._selecting is None or self._selecting.done():
            self._selecting = asyncio.get_running_loop().create_task(self._select())
            self._selecting.add_done_callback(_read)
        try:
            async with asyncio.timeout(self._timeout):
                await asyncio.shield(self._selecting)
        except TimeoutError:  # no connection could be had, or the query got no answer
            return (f"the fleet database {self._label} did not answer within "
                    f"{self._timeout:g} s (or every connection of this replica's pool stayed "
                    "busy that long)")
        except failures() as exc:
            return f"the fleet database {self._label} cannot be reached: {exc}"
        return None

    async def _select(self) -> None:
        async with self._pool.acquire() as conn:
            await conn.fetchval("SELECT 1")


def _read(task: asyncio.Task[None]) -> None:
    """A background SELECT's failure was answered by `_check` (or is moot): read it."""
    if not task.cancelled():
        task.exception()

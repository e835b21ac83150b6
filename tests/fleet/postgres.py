"""A real PostgreSQL server for the tests: Debian's binaries (`scripts/bootstrap-system`
installs them), a throw-away cluster on 127.0.0.1 and a free port, run as the `postgres` user
(initdb and postgres refuse root), fsync off. One per test session; each test gets a
database of its own. The class lives in `bench/fleet_servers.py`, which the fleet benchmark
shares."""

from __future__ import annotations

from typing import Any

import asyncpg

from bench.fleet_servers import PostgresServer

__all__ = ["FailsOnce", "PostgresServer"]

INTERNAL_CLIENT_ERROR = asyncpg.InternalClientError(
    "cannot switch to state 15; another operation (None) is in progress")
"""What asyncpg raises for about a millisecond on a connection whose server process ended."""


class FailsOnce:
    """A store's pool whose next `acquire`, `fetch` or `execute` raises `error`, once; then
    the real pool. For the background loops of the fleet stores: the error their statement
    meets is injected, because the real one (asyncpg's `InternalClientError`) lives for a
    millisecond, and an unforeseen one cannot be made to happen."""

    def __init__(self, pool: asyncpg.Pool, error: Exception) -> None:
        self.pool = pool
        self.error: Exception | None = error

    @property
    def spent(self) -> bool:
        return self.error is None

    def _raise_once(self) -> None:
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def acquire(self) -> Any:
        self._raise_once()
        return self.pool.acquire()

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self._raise_once()
        return await self.pool.fetch(*args, **kwargs)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        self._raise_once()
        return await self.pool.execute(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.pool, name)

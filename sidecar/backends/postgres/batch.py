"""Group commit for the fleet's per-call statements: the requests many tasks make at once go
to PostgreSQL as one statement, in one round trip and one transaction (the contract is
`Batcher`'s docstring). Imports `asyncpg` and `sidecar.backends.postgres.pool`; exports
`Batcher`, `IDLE_SECONDS` and `MAX_BATCH`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

import asyncpg

from sidecar.backends.postgres.pool import connection_lost

__all__ = ["IDLE_SECONDS", "MAX_BATCH", "Batcher"]

Item = TypeVar("Item")
Result = TypeVar("Result")

IDLE_SECONDS = 0.05
"""A batcher gives its connection back after this long without a request."""
MAX_BATCH = 256
"""Requests per statement, at most."""


class Batcher(Generic[Item, Result]):
    """Sends the requests queued at once as one statement. `send(conn, items)` runs one
    statement for `items` on `conn` and returns one result per item, in order; `key(item)`
    names the row an item touches; `prepare(conn)` runs once on each connection the batcher
    takes from the pool.

    A worker task runs while requests are queued, on one connection of the pool that it keeps
    between batches. A request queued while no batch is in flight is sent at once (a lone
    sequential caller waits for nothing but its own round trip); requests queued while a
    batch is in flight go together in the next one (at most `max_batch`). What each caller
    may rely on:

    - Its own result: each caller gets the result `send` returned for its item.
    - Error isolation: when a batch of several fails with an error the server reported (the
      transaction rolled back: a value one request carries, a deadlock with another replica),
      each request is sent again alone, so only the request at fault fails. An error of the
      connection (the server gone) fails every request of that batch, as it would alone.
    - Cancellation: a caller cancelled while its request waits in the queue is dropped before
      anything is sent; a caller cancelled while its request is in flight gets its
      `CancelledError` at once, and the statement still completes for the others: the
      worker's task is never cancelled by a caller. The abandoned result goes to `abandoned`
      (e.g. a claim won for a caller that is gone is given back).
    - Two requests with the same `key` never share a batch (one statement may touch a row
      once): the later one waits for the next batch.

    The connection goes back to the pool once the worker has had nothing to do for
    `idle_seconds`, so a small pool is not starved by an idle batcher."""

    def __init__(self, pool: asyncpg.Pool,
                 send: Callable[[Any, list[Item]], Awaitable[list[Result]]], *,
                 key: Callable[[Item], Hashable], name: str,
                 abandoned: Callable[[Item, Result], None] | None = None,
                 prepare: Callable[[Any], Awaitable[None]] | None = None,
                 max_batch: int = MAX_BATCH, idle_seconds: float = IDLE_SECONDS) -> None:
        self._pool = pool
        self._prepare = prepare
        self._send = send
        self._key = key
        self._name = name
        self._abandoned = abandoned
        self._max_batch = max_batch
        self._idle_seconds = idle_seconds
        self._queue: collections.deque[tuple[Item, asyncio.Future[Result]]] = (
            collections.deque())
        self._worker: asyncio.Task[None] | None = None
        self._inflight: list[tuple[Item, asyncio.Future[Result]]] = []
        self._conn: Any = None  # held between batches, until idle
        self._last_used = 0.0
        self._idle: asyncio.TimerHandle | None = None
        self._giving_back: set[asyncio.Task[None]] = set()
        self._closed = False
        self.batches = 0
        """Statements sent (a request retried alone counts once more)."""
        self.requests = 0
        """Requests answered or failed by a statement."""

    async def submit(self, item: Item) -> Result:
        """Send `item` with whatever else is queued; its result, or the error of its
        statement."""
        if self._closed:
            raise asyncpg.InterfaceError(f"{self._name}: closed")
        future: asyncio.Future[Result] = asyncio.get_running_loop().create_future()
        self._queue.append((item, future))
        if self._worker is None:
            self._worker = asyncio.create_task(self._work(), name=self._name)
        try:
            return await future
        except asyncio.CancelledError:
            # Cancelled after the answer came but before this task ran again: the answer is
            # abandoned all the same.
            if (future.done() and not future.cancelled() and future.exception() is None
                    and self._abandoned is not None):
                self._abandoned(item, future.result())
            raise

    async def aclose(self) -> None:
        """Refuse new requests, let the queued and in-flight ones finish, give the
        connection back."""
        self._closed = True
        if self._worker is not None:
            await asyncio.wait([self._worker])
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None
        self._give_back()
        if self._giving_back:
            await asyncio.wait(list(self._giving_back))

    # --- the worker: runs while requests are queued ----------------------------------------

    async def _work(self) -> None:
        try:
            while batch := self._take():
                self._inflight = batch
                conn = self._conn
                if conn is None or connection_lost(conn):
                    conn = await self._connection(batch)
                    if conn is None:
                        continue  # the pool failed: the batch got its error
                await self._run(conn, batch)
                self._inflight = []
        except BaseException:  # cancelled (its loop closing) mid-statement: a suspect connection
            self._give_back()
            raise
        finally:
            self._worker = None  # before any await: a request from now on starts a worker
            self._fail_left()
            if self._conn is not None:
                self._last_used = asyncio.get_running_loop().time()
                if self._idle is None:
                    self._idle = asyncio.get_running_loop().call_later(
                        self._idle_seconds, self._idle_check)

    def _take(self) -> list[tuple[Item, asyncio.Future[Result]]]:
        """The next batch: queued requests whose caller still waits, in order, one per key
        (a request under a key already taken stays queued, in its place)."""
        batch: list[tuple[Item, asyncio.Future[Result]]] = []
        keys: set[Hashable] = set()
        later: list[tuple[Item, asyncio.Future[Result]]] = []
        queue = self._queue
        while queue and len(batch) < self._max_batch:
            request = queue.popleft()
            if request[1].done():  # its caller was cancelled before anything was sent
                continue
            key = self._key(request[0])
            if key in keys:
                later.append(request)
                continue
            keys.add(key)
            batch.append(request)
        if later:
            queue.extendleft(reversed(later))
        return batch

    async def _connection(self, batch: list[tuple[Item, asyncio.Future[Result]]]) -> Any:
        """A connection from the pool (a closed one given back), or None when the pool fails:
        then `batch` fails with its error."""
        self._give_back()
        try:
            conn = await self._pool.acquire()
        except Exception as exc:
            for request in batch:
                self._settle(request, exc)
            return None
        self._conn = conn
        if self._prepare is not None:
            try:
                await self._prepare(conn)
            except Exception as exc:
                self._give_back()
                for request in batch:
                    self._settle(request, exc)
                return None
        return conn

    async def _run(self, conn: Any, batch: list[tuple[Item, asyncio.Future[Result]]]) -> None:
        """Send `batch`; after an error the server reported, each request alone."""
        try:
            self.batches += 1
            results = await self._send(conn, [request[0] for request in batch])
        except asyncpg.PostgresError as exc:
            if len(batch) == 1:
                self._settle(batch[0], exc)
                return
            for request in batch:  # the transaction rolled back: each alone, to isolate
                try:
                    self.batches += 1
                    alone = await self._send(conn, [request[0]])
                except asyncpg.PostgresError as exc_alone:
                    self._settle(request, exc_alone)
                except Exception as exc_alone:
                    self._settle(request, exc_alone)
                    self._give_back()
                    return
                else:
                    self._settle(request, alone[0])
            return
        except Exception as exc:  # the connection failed: so does every request on it
            for request in batch:
                self._settle(request, exc)
            self._give_back()
            return
        for request, result in zip(batch, results, strict=True):
            self._settle(request, result)

    def _settle(self, request: tuple[Item, asyncio.Future[Result]],
                result: Result | Exception) -> None:
        item, future = request
        self.requests += 1
        if future.done():  # the caller was cancelled while the statement ran
            if self._abandoned is not None and not isinstance(result, Exception):
                self._abandoned(item, result)
            return
        if isinstance(result, Exception):
            future.set_exception(result)
        else:
            future.set_result(result)

    def _fail_left(self) -> None:
        """The worker ended: what it had in flight or queued when it stopped (cancelled with
        its loop) gets an error, as nobody will send it."""
        left, self._inflight = [*self._inflight, *self._queue], []
        self._queue.clear()
        for _, future in left:
            if not future.done():
                future.set_exception(asyncpg.InterfaceError(f"{self._name}: stopped"))

    # --- the held connection ---------------------------------------------------------------

    def _idle_check(self) -> None:
        self._idle = None
        if self._conn is None or self._worker is not None:
            return
        left = self._last_used + self._idle_seconds - asyncio.get_running_loop().time()
        if left > 0:
            self._idle = asyncio.get_running_loop().call_later(left, self._idle_check)
            return
        self._give_back()

    def _give_back(self) -> None:
        """The held connection goes back to the pool (in a task of its own)."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        task = asyncio.get_running_loop().create_task(self._release(conn))
        self._giving_back.add(task)
        task.add_done_callback(self._giving_back.discard)

    async def _release(self, conn: Any) -> None:
        with contextlib.suppress(Exception):
            await self._pool.release(conn)

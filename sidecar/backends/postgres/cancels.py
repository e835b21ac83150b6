"""Cancel requests between the replicas of a fleet, on PostgreSQL:
`sidecar.stores.cancels.SharedCancels` for one Location (`PostgresCancels`). Table
`sidecar_cancels`, channel `sidecar_cancels`.

Imports `sidecar.model`, `asyncpg` and this package. Exports `PostgresCancels` and `CHANNEL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import asyncpg

from sidecar.backends.postgres.pool import Carried, Listening, failures, migrate
from sidecar.model.replica import replica_id

__all__ = ["CHANNEL", "PostgresCancels"]

log = logging.getLogger("sidecar.backends.postgres.cancels")

COMPONENT = "cancels"
CHANNEL = "sidecar_cancels"
"""Payloads: `cancel <replica>` (a request for that replica), `answer <row id>`."""
SCHEMA_VERSION = 1
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_cancels (
    id           BIGSERIAL PRIMARY KEY,
    location     TEXT NOT NULL,
    call_id      TEXT NOT NULL,
    replica      TEXT NOT NULL,
    requested_at TIMESTAMPTZ NOT NULL DEFAULT now(),
    answer       TEXT
);
CREATE INDEX sidecar_cancels_open ON sidecar_cancels (replica, location) WHERE answer IS NULL;
""",
}
STALE_SECONDS = 60.0
"""A request nobody deleted (its requester died) is deleted this long after it was made."""
_REQUEST = f"""
WITH made AS (INSERT INTO sidecar_cancels (location, call_id, replica) VALUES ($1, $2, $3)
              RETURNING id)
SELECT id, pg_notify('{CHANNEL}', 'cancel ' || $3) FROM made
"""
_OPEN = """
SELECT id, call_id, extract(epoch FROM now() - requested_at)::float8 AS age FROM sidecar_cancels
WHERE replica = $1 AND location = $2 AND answer IS NULL ORDER BY id
"""
LATE_SECONDS = 2.0
"""An answer written this long after its request is logged (its requester may have given up:
`/v1` waits 5 s), naming the request's age."""
_ANSWER = f"""
WITH done AS (UPDATE sidecar_cancels SET answer = $2 WHERE id = $1 AND answer IS NULL
              RETURNING id)
SELECT pg_notify('{CHANNEL}', 'answer ' || id) FROM done
"""
_SWEEP = """
DELETE FROM sidecar_cancels WHERE requested_at < now() - make_interval(secs => $1)
"""
_FAILURES = failures()

CancelHere = Callable[[str], Awaitable[str]]


class PostgresCancels:
    """The fleet's `SharedCancels`. Build it with `await PostgresCancels.on_pool(pool,
    location)`; the pool (the replica's) stays open when this closes.

    A call runs on the replica that holds its claim; `DELETE /v1/calls/{id}` may reach any
    replica. The replica that gets it writes a request row (location, call id, the replica
    addressed) and `NOTIFY sidecar_cancels` naming that replica, in one statement. Every
    replica LISTENs (`Listening`) and, as a fallback for lost notifications, looks for
    requests addressed to it every `poll_interval` seconds (1 s). The addressed replica
    cancels the call exactly as a local `DELETE` does (its `cancel_here`, which waits a moment
    for the call to end and release its claim), writes its answer into the row and NOTIFYs;
    the requesting replica, waiting on the same channel (and reading the row every half
    second), deletes the row and answers the client. No answer within the wait (the addressed
    replica is dead, stalled or cut off from the database): `request` returns None and the
    row is deleted, so a replica that comes back later does not cancel a retried call. Rows
    left by a requester that died are deleted after `STALE_SECONDS` by whichever replica
    looks next."""

    def __init__(self, pool: asyncpg.Pool, location: str, *, poll_interval: float,
                 replica: str | None = None) -> None:
        self._pool = pool
        self._location = location
        self._poll_interval = poll_interval
        self.replica = replica or replica_id()
        self._cancel_here: CancelHere | None = None
        self._listening = Listening(pool, CHANNEL, self._notified, what="cancel requests",
                                    poll_interval=poll_interval, log=log)
        self._requested = asyncio.Event()
        self._answers: dict[int, asyncio.Event] = {}
        self._server: asyncio.Task[None] | None = None
        self._carried = Carried()

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, location: str, *, poll_interval: float = 1.0,
                      replica: str | None = None) -> PostgresCancels:
        async with pool.acquire() as conn:
            await migrate(conn, COMPONENT, MIGRATIONS, SCHEMA_VERSION)
        return cls(pool, location, poll_interval=poll_interval, replica=replica)

    # --- SharedCancels -------------------------------------------------------------------

    async def start(self, cancel_here: CancelHere) -> None:
        self._cancel_here = cancel_here
        await self._listening.start()
        self._server = asyncio.create_task(self._serve_forever(), name="cancels-serve")

    async def request(self, call_id: str, replica: str, *, wait: float) -> str | None:
        if self._listening.lost:  # answers come faster with LISTEN; the row is read anyway
            with contextlib.suppress(*_FAILURES):
                await self._listening.restart()
        written = asyncio.ensure_future(
            self._pool.fetchval(_REQUEST, self._location, call_id, replica))
        try:
            row_id = int(await asyncio.shield(written))
        except asyncio.CancelledError:  # the row may land all the same: withdrawn once it has
            await self._carried.run(self._withdraw(written))
            raise
        answered = self._answers[row_id] = asyncio.Event()
        try:
            loop = asyncio.get_running_loop()
            deadline = loop.time() + wait
            while True:
                answer = await self._pool.fetchval(
                    "SELECT answer FROM sidecar_cancels WHERE id = $1", row_id)
                remaining = deadline - loop.time()
                if answer is not None or remaining <= 0:
                    return None if answer is None else str(answer)
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(0.5, remaining)):
                        await answered.wait()
        finally:
            del self._answers[row_id]
            # carried to its end: a client gone mid-wait still leaves no request behind
            await self._carried.run(self._forget(row_id))

    async def aclose(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.cancel()
            await asyncio.wait([server])
        await self._carried.drain()
        await self._listening.stop()

    # --- serving the requests addressed to this replica ----------------------------------

    def _notified(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        kind, _, rest = str(payload).partition(" ")
        if kind == "cancel" and rest == self.replica:
            self._requested.set()
        elif kind == "answer" and rest.isdigit():
            answered = self._answers.get(int(rest))
            if answered is not None:
                answered.set()

    async def _serve_forever(self) -> None:
        rounds = 0
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._poll_interval):
                    await self._requested.wait()
            self._requested.clear()
            rounds += 1
            try:
                if self._listening.lost:
                    await self._listening.restart()
                await self._carried.run(self._serve_open(sweep=rounds % 60 == 0))
            except _FAILURES as exc:
                log.warning("reading the cancel requests for this replica failed (retrying "
                            "in %g s): %s", self._poll_interval, exc)
            except Exception:  # never ends the loop: other replicas' cancels wait on it
                log.exception("reading the cancel requests for this replica failed "
                              "unexpectedly (retrying in %g s)", self._poll_interval)

    async def _serve_open(self, *, sweep: bool) -> None:
        rows = await self._pool.fetch(_OPEN, self.replica, self._location)
        if rows:
            answers = await asyncio.gather(*(self._answer(r["call_id"]) for r in rows))
            for row, answer in zip(rows, answers, strict=True):
                await self._pool.execute(_ANSWER, row["id"], answer)
                if row["age"] > LATE_SECONDS:
                    log.warning("answered the cancel request for call %s (%s) %.1f s after it "
                                "was made", row["call_id"], answer, row["age"])
        if sweep:
            await self._pool.execute(_SWEEP, STALE_SECONDS)

    async def _answer(self, call_id: str) -> str:
        if self._cancel_here is None:
            return "not_running"
        try:
            return await self._cancel_here(call_id)
        except Exception:
            log.exception("cancelling call %s for another replica failed", call_id)
            return "not_running"

    async def _withdraw(self, written: asyncio.Future[Any]) -> None:
        """Forget the row of a request whose client was cancelled while it was written."""
        try:
            row_id = await written
        except _FAILURES:  # not written
            return
        await self._forget(int(row_id))

    async def _forget(self, row_id: int) -> None:
        try:
            await self._pool.execute("DELETE FROM sidecar_cancels WHERE id = $1", row_id)
        except _FAILURES as exc:
            log.warning("deleting a cancel request failed (it is swept within %g s): %s",
                        STALE_SECONDS, exc)

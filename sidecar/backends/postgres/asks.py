"""Pending permission asks on PostgreSQL: `sidecar.stores.asks.SharedAsks` for one Location,
shared by the replicas of a fleet (`PostgresAsks`). Table `sidecar_asks`, channel
`sidecar_asks`.

Imports `sidecar.stores`, `sidecar.model`, `asyncpg` and this package. Exports `PostgresAsks`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import secrets
from collections.abc import Callable
from typing import Any

import asyncpg

from sidecar.backends.postgres.pool import LOCK_PRUNE_ASKS, Carried, Listening, failures, migrate
from sidecar.model.permissions import PendingAsk, Reply
from sidecar.model.replica import replica_id
from sidecar.stores.asks import SharedAnswer

log = logging.getLogger("sidecar.backends.postgres.asks")

SCHEMA_VERSION = 1
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_asks (
    location   TEXT NOT NULL,
    id         TEXT NOT NULL,
    replica    TEXT NOT NULL,
    session_id TEXT NOT NULL,
    action     TEXT NOT NULL,
    body       TEXT NOT NULL,
    created_at DOUBLE PRECISION NOT NULL,
    seen_at    DOUBLE PRECISION NOT NULL,
    expires_at DOUBLE PRECISION,
    reply      TEXT,
    scope      TEXT,
    feedback   TEXT,
    PRIMARY KEY (location, id)
);
CREATE INDEX sidecar_asks_by_replica ON sidecar_asks (replica);
""",
}
COMPONENT = "asks"
CHANNEL = "sidecar_asks"
_NOW = "extract(epoch from clock_timestamp())"
_REPLIES: dict[str, Reply] = {"once": "once", "always": "always", "reject": "reject"}
_FAILURES = failures()


class PostgresAsks:
    """The fleet's `SharedAsks`. Build it with `await PostgresAsks.on_pool(pool, location)`;
    the pool (the replica's) stays open when this closes.

    An ask raised on replica A is a row of `sidecar_asks` (owned by A) until A's call stops
    waiting; every replica lists those rows, and any may answer one: the first answer is
    stored in the row (`UPDATE ... WHERE reply IS NULL`) and announced with
    `pg_notify('sidecar_asks', ...)` in the same transaction. Every replica LISTENs: the
    owner resolves its waiting call (reading the row, which holds the feedback), the others
    apply what an answer means for their own asks (an `always` rule for the session, or a
    rejection of the session's other asks). When notifications are lost, the owner still finds
    its answered asks by polling every `poll_interval` seconds.

    An owner keeps its rows alive by refreshing `seen_at` on each poll; rows of a replica that
    stopped doing so (killed) are no longer listed after `stale_after` seconds and are deleted
    by one replica at a time (`LOCK_PRUNE_ASKS`). An ask raised with a timeout is not listed
    past it. Times are the database's clock."""

    def __init__(self, pool: asyncpg.Pool, location: str, *, poll_interval: float,
                 stale_after: float) -> None:
        self._pool = pool
        self._location = location
        self._poll_interval = poll_interval
        self._stale_after = stale_after
        # the replica's name, plus a suffix: two processes misconfigured with one
        # SIDECAR_REPLICA_ID still own their asks apart
        self.owner = f"{replica_id()}/{secrets.token_hex(4)}"
        self._answered: Callable[[SharedAnswer], None] | None = None
        self._listening = Listening(pool, CHANNEL, self._notified, what="answers",
                                    poll_interval=poll_interval, log=log)
        self._poller: asyncio.Task[None] | None = None
        self._fetching: set[asyncio.Task[None]] = set()
        self._carried = Carried()

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, location: str, *, poll_interval: float = 2.0,
                      stale_after: float = 30.0) -> PostgresAsks:
        async with pool.acquire() as conn:
            await migrate(conn, COMPONENT, MIGRATIONS, SCHEMA_VERSION)
        return cls(pool, location, poll_interval=poll_interval, stale_after=stale_after)

    # --- SharedAsks ----------------------------------------------------------------------

    async def start(self, answered: Callable[[SharedAnswer], None]) -> None:
        self._answered = answered
        await self._listening.start()
        self._poller = asyncio.create_task(self._poll_forever(), name="asks-poll")

    async def raised(self, ask: PendingAsk, expires_in: float | None) -> None:
        r = ask.request
        await self._pool.execute(
            f"INSERT INTO sidecar_asks (location, id, replica, session_id, action, body, "
            f"created_at, seen_at, expires_at) VALUES ($1, $2, $3, $4, $5, $6, $7, {_NOW}, "
            f"{_NOW} + $8::double precision)",
            self._location, ask.id, self.owner, r.session_id, r.action,
            json.dumps(ask.to_json(), ensure_ascii=False), ask.created_at, expires_in)

    async def finished(self, ask_id: str) -> None:
        await self._pool.execute(
            "DELETE FROM sidecar_asks WHERE location = $1 AND id = $2 AND replica = $3",
            self._location, ask_id, self.owner)

    async def pending(self, session_id: str | None = None) -> list[PendingAsk]:
        rows = await self._pool.fetch(
            f"SELECT body FROM sidecar_asks WHERE location = $1 AND reply IS NULL "
            f"AND ($2::text IS NULL OR session_id = $2) AND seen_at > {_NOW} - $3 "
            f"AND (expires_at IS NULL OR expires_at > {_NOW}) ORDER BY created_at, id",
            self._location, session_id, self._stale_after)
        return [PendingAsk.from_json(json.loads(row["body"])) for row in rows]

    async def answer(self, ask_id: str, reply: Reply, *, scope: str,
                     feedback: str | None) -> SharedAnswer | None:
        async with self._pool.acquire() as conn, conn.transaction():
            row = await conn.fetchrow(
                f"UPDATE sidecar_asks SET reply = $3, scope = $4, feedback = $5 "
                f"WHERE location = $1 AND id = $2 AND reply IS NULL AND seen_at > {_NOW} - $6 "
                f"AND (expires_at IS NULL OR expires_at > {_NOW}) "
                f"RETURNING replica, session_id, action",
                self._location, ask_id, reply, scope, feedback, self._stale_after)
            if row is None:
                return None
            # what the other replicas need, without the feedback (only the owner uses it,
            # from the row; a payload is limited to 8,000 bytes)
            note = {"location": self._location, "id": ask_id, "replica": row["replica"],
                    "session_id": row["session_id"], "action": row["action"],
                    "reply": reply, "scope": scope}
            await conn.execute("SELECT pg_notify($1, $2)", CHANNEL,
                               json.dumps(note, ensure_ascii=False))
        return SharedAnswer(ask_id, row["session_id"], row["action"], reply, scope, feedback,
                            mine=row["replica"] == self.owner)

    async def aclose(self) -> None:
        poller, self._poller = self._poller, None
        tasks = [t for t in (poller, *self._fetching) if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._carried.drain()
        await self._listening.stop()
        try:  # nobody waits for this replica's asks any more
            await self._pool.execute("DELETE FROM sidecar_asks WHERE replica = $1", self.owner)
        except _FAILURES as exc:
            log.warning("could not remove this replica's asks (they expire): %s", exc)

    # --- delivery ------------------------------------------------------------------------

    def _notified(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        try:
            note = json.loads(str(payload))
            if note["location"] != self._location:
                return
            reply = _REPLIES[note["reply"]]
            answer = SharedAnswer(str(note["id"]), str(note["session_id"]),
                                  str(note["action"]), reply, str(note["scope"]), None,
                                  mine=note["replica"] == self.owner)
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed notification on %s", CHANNEL)
            return
        if not answer.mine:
            self._deliver(answer)
            return
        # the owner's answer carries the feedback: read it from the row
        task = asyncio.get_running_loop().create_task(
            self._carried.run(self._fetch_answers(answer.ask_id)))
        self._fetching.add(task)
        task.add_done_callback(self._fetching.discard)

    def _deliver(self, answer: SharedAnswer) -> None:
        if self._answered is not None:
            self._answered(answer)

    async def _fetch_answers(self, ask_id: str | None = None) -> None:
        """Deliver the answered asks this replica owns (all, or `ask_id`)."""
        try:
            rows = await self._pool.fetch(
                "SELECT id, session_id, action, reply, scope, feedback FROM sidecar_asks "
                "WHERE replica = $1 AND location = $2 AND reply IS NOT NULL "
                "AND ($3::text IS NULL OR id = $3)", self.owner, self._location, ask_id)
        except _FAILURES as exc:
            log.warning("reading the answers to this replica's asks failed: %s", exc)
            return
        for row in rows:
            reply = _REPLIES.get(row["reply"])
            if reply is not None:
                self._deliver(SharedAnswer(row["id"], row["session_id"], row["action"], reply,
                                           row["scope"] or "session", row["feedback"],
                                           mine=True))

    async def _poll_forever(self) -> None:
        """The fallback when notifications are lost, and the owner's heartbeat."""
        while True:
            await asyncio.sleep(self._poll_interval)
            try:
                await self._carried.run(self._refresh())
            except _FAILURES as exc:
                log.warning("refreshing this replica's asks failed (retrying): %s", exc)
            except Exception as exc:  # never ends the poll: the waiting calls depend on it
                log.warning("refreshing this replica's asks failed (retrying): %s: %s",
                            type(exc).__name__, exc)

    async def _refresh(self) -> None:
        if self._listening.lost:
            await self._listening.restart()
        await self._pool.execute(
            f"UPDATE sidecar_asks SET seen_at = {_NOW} WHERE replica = $1", self.owner)
        await self._fetch_answers()
        await self._prune()

    async def _prune(self) -> None:
        """Delete the asks of replicas that stopped refreshing them, on one replica at a
        time."""
        async with self._pool.acquire() as conn, conn.transaction():
            if await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)", LOCK_PRUNE_ASKS):
                await conn.execute(f"DELETE FROM sidecar_asks WHERE seen_at < {_NOW} - $1",
                                   self._stale_after * 2)

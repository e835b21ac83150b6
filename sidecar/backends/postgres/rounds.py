"""Paused 2026-07-28 `/mcp` calls on PostgreSQL: `sidecar.stores.shared_rounds.SharedRounds`
for a fleet (`PostgresRounds`; the life of a row is its docstring). Tables `sidecar_rounds`
and `sidecar_round_notes` (`sidecar.backends.postgres.round_notes`), channel
`sidecar_rounds`.

Imports `sidecar.stores`, `sidecar.model`, `asyncpg` and this package. Exports
`PostgresRounds` and `CHANNEL`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Awaitable, Coroutine
from typing import Any

import asyncpg

from sidecar.backends.postgres.pool import Carried, Listening, failures, migrate
from sidecar.backends.postgres.round_notes import NOTES_MIGRATION, Outbox, write_notes
from sidecar.model.replica import replica_id
from sidecar.stores.shared_rounds import OnNote, Resume, RoundHolderGone, RoundLost, RoundUnknown

log = logging.getLogger("sidecar.backends.postgres.rounds")

__all__ = ["CHANNEL", "PostgresRounds"]

SCHEMA_VERSION = 2
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_rounds (
    location   TEXT NOT NULL,
    key        TEXT NOT NULL,
    holder     TEXT NOT NULL,
    request    TEXT NOT NULL,
    expires_at TIMESTAMPTZ NOT NULL,
    seen_at    TIMESTAMPTZ NOT NULL,
    responses  TEXT,
    resumed_by TEXT,
    taken      BOOLEAN NOT NULL DEFAULT false,
    cancelled  BOOLEAN NOT NULL DEFAULT false,
    reply      TEXT,
    replied_at TIMESTAMPTZ,
    PRIMARY KEY (location, key)
);
CREATE INDEX sidecar_rounds_by_holder ON sidecar_rounds (holder);
""",
    2: NOTES_MIGRATION,
}
COMPONENT = "rounds"
CHANNEL = "sidecar_rounds"
PRUNE_EVERY = 30
"""Polls between two prunings of the rows nobody will use."""
_NOW = "clock_timestamp()"
_SECS = "make_interval(secs => {})"
_FAILURES = failures()

_RESUMABLE = f"""
SELECT holder, request, responses IS NOT NULL AS used, expires_at > {_NOW} AS open,
       seen_at > {_NOW} - {_SECS.format("$3")} AS alive
FROM sidecar_rounds WHERE location = $1 AND key = $2 FOR UPDATE"""
_REPLY = f"""
WITH notes AS (DELETE FROM sidecar_round_notes WHERE location = $1 AND key = $2
               RETURNING seq, body),
     gone AS (DELETE FROM sidecar_rounds WHERE location = $1 AND key = $2
              AND reply IS NOT NULL RETURNING reply)
SELECT (SELECT reply FROM gone) AS reply, r.seen_at > {_NOW} - {_SECS.format("$3")} AS alive,
       r.taken, ARRAY(SELECT body FROM notes ORDER BY seq) AS notes
FROM (SELECT 1) AS one
LEFT JOIN sidecar_rounds r ON r.location = $1 AND r.key = $2"""
"""The notes written so far (read and deleted: they are handed on now), and the reply when
there is one (the row deleted with it). The holder writes its last notes in the reply's
transaction, so a reply seen here comes with every note before it."""
_PRUNE = f"""
DELETE FROM sidecar_rounds
WHERE (seen_at < {_NOW} - {_SECS.format("$1")} AND (responses IS NOT NULL OR expires_at < {_NOW}))
   OR (responses IS NULL AND expires_at < {_NOW} - {_SECS.format("$1")})
   OR replied_at < {_NOW} - {_SECS.format("$1")}"""
"""A gone holder's rows: resumed ones after a while, the others once expired (until then a
resume is told the holder is gone); expired rows; replies nobody read."""


class PostgresRounds:
    """The fleet's `SharedRounds`. Build it with `await PostgresRounds.on_pool(pool,
    location)`; the pool (the replica's) stays open when this closes.

    A paused call stays in the replica that paused it (its task waits for the client's
    input); what the fleet shares is a row of `sidecar_rounds` per paused state, written by
    that replica (the holder) before its `input_required` answer leaves:

        held     INSERT (location, key, holder, request digest, expires_at = now + ttl)
        resume   on another replica, in one transaction: the row FOR UPDATE; refused when
                 absent, already resumed, expired or for other arguments (`RoundUnknown`),
                 or when the holder went silent (`RoundHolderGone`); else the client's
                 responses are stored in it and `pg_notify('sidecar_rounds', ...)` names
                 the holder
        take     the holder marks the row taken (once, `UPDATE ... WHERE NOT taken`), runs
                 its `Resume` in a task, stores the value as the row's reply and NOTIFYs
        reply    the resuming replica reads the reply and deletes the row in one statement
        dropped  resumed by the holder itself, or expired there: the row is deleted in the
                 background (a resume elsewhere meanwhile gets `RoundUnknown` from the holder)
        stopped  a holder shutting down marks its rows silent: a resume elsewhere is told at
                 once
        notes    while the holder continues the call, what it emits for the resuming request
                 (the `relay` column says what that request wants) goes through
                 `sidecar_round_notes` (`Outbox`), read with the reply and deleted with the row

    Every replica LISTENs on the channel once it has held or resumed a call, and polls as the
    fallback when notifications are lost: the holder every `poll_interval` seconds while it
    holds rows (its heartbeat: `seen_at` of all its rows, then the rows resumed and not yet
    taken, or cancelled), a resuming replica every `poll_interval` seconds while it waits. A
    holder silent for `silent_after` seconds (the fleet's claim TTL, `SIDECAR_CLAIM_TTL`,
    default 30 s) is gone: a resume is refused at once, and a waiting one ends with
    `RoundHolderGone` instead of hanging. A cancelled wait marks the row cancelled and
    NOTIFYs; the holder cancels the continued call. Rows of gone holders, expired rows and
    replies nobody read are deleted by whichever replica polls (every `PRUNE_EVERY` polls).
    Times are the database's clock."""

    def __init__(self, pool: asyncpg.Pool, location: str, *, silent_after: float,
                 poll_interval: float) -> None:
        self._pool = pool
        self._location = location
        self.silent_after = silent_after
        self._poll = poll_interval
        # the replica's name, plus a suffix: a restarted replica (same SIDECAR_REPLICA_ID)
        # never takes the rows of the process it replaces
        self.holder = f"{replica_id()}/{secrets.token_hex(4)}"
        self._held: dict[str, Resume] = {}
        self._running: dict[str, asyncio.Task[None]] = {}  # resumed elsewhere, continuing here
        self._waiting: dict[str, asyncio.Event] = {}  # resumes of this replica, by key
        self._listening = Listening(pool, CHANNEL, self._notified, what="resumed calls",
                                    poll_interval=poll_interval, log=log)
        self._listen_lock = asyncio.Lock()
        self._listens = False
        self._poller: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[Any]] = set()
        self._carried = Carried()
        self._closed = False

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, location: str, *, silent_after: float = 30.0,
                      poll_interval: float | None = None) -> PostgresRounds:
        async with pool.acquire() as conn:
            await migrate(conn, COMPONENT, MIGRATIONS, SCHEMA_VERSION)
        poll = poll_interval if poll_interval is not None else min(2.0, silent_after / 3)
        return cls(pool, location, silent_after=silent_after, poll_interval=poll)

    # --- the holder's side ---------------------------------------------------------------

    async def held(self, key: str, request: str, resume: Resume, ttl: float) -> None:
        """See `SharedRounds.held`; when the database fails the call is not listed (a
        warning says so) and resumes only here."""
        try:
            await self._start()
            self._held[key] = resume
            await self._pool.execute(
                f"INSERT INTO sidecar_rounds (location, key, holder, request, expires_at, "
                f"seen_at) VALUES ($1, $2, $3, $4, {_NOW} + {_SECS.format('$5')}, {_NOW})",
                self._location, key, self.holder, request, ttl)
        except _FAILURES as exc:
            self._held.pop(key, None)
            log.warning("could not list a paused call for the fleet (it resumes only on this "
                        "replica): %s", exc)
        except BaseException:
            self._held.pop(key, None)
            raise

    def dropped(self, key: str) -> None:
        if self._held.pop(key, None) is None:
            return
        # a resume stored elsewhere meanwhile keeps its row: `_take` answers it "unknown"
        self._spawn(self._delete(key, unresumed=True))

    async def _delete(self, key: str, *, unresumed: bool = False) -> None:
        try:
            await self._pool.execute(
                "DELETE FROM sidecar_rounds WHERE location = $1 AND key = $2 AND holder = $3 "
                "AND (NOT $4 OR responses IS NULL)", self._location, key, self.holder,
                unresumed)
        except _FAILURES as exc:
            log.warning("could not unlist a paused call (it expires): %s", exc)

    async def _take(self, key: str) -> None:
        """A resume of a call held here reached another replica: continue the call (once)."""
        try:
            taken = await self._pool.fetchrow(
                "UPDATE sidecar_rounds SET taken = true WHERE location = $1 AND key = $2 AND "
                "holder = $3 AND responses IS NOT NULL AND NOT taken "
                "RETURNING responses, relay", self._location, key, self.holder)
        except _FAILURES as exc:
            log.warning("reading a resumed call's input failed (polling again): %s", exc)
            return
        if taken is None or key in self._running:
            return
        resume = self._held.pop(key, None)
        wants = None if taken["relay"] is None else json.loads(taken["relay"])
        outbox = Outbox(self._pool, self._location, key, wants,
                        notice=(CHANNEL, self._note(key, "noted")), spawn=self._task)
        task = asyncio.get_running_loop().create_task(
            self._continue(key, resume, taken["responses"], outbox), name="rounds-continue")
        self._running[key] = task
        task.add_done_callback(lambda _t: self._running.pop(key, None))

    async def _continue(self, key: str, resume: Resume | None, responses: str,
                        outbox: Outbox) -> None:
        try:
            value = None if resume is None else await resume(json.loads(responses), outbox)
            reply = {"unknown": True} if value is None else {"value": value}
        except asyncio.CancelledError:  # the resuming replica's request was cancelled
            outbox.close()
            self._spawn(self._delete(key))
            raise
        except Exception as exc:  # a defect of the continuation: the resumer gets its text
            log.exception("continuing a call resumed on another replica failed")
            reply = {"failed": f"{type(exc).__name__}: {exc}"}
        notes = await outbox.finish()
        await self._carried.run(self._reply(key, json.dumps(reply, ensure_ascii=False), notes))

    async def _reply(self, key: str, reply: str, notes: list[Any]) -> None:
        """Store the answer for the resuming replica; while the database fails, again every
        poll (until this closes): that replica waits as long as this one lives."""
        while True:
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    await write_notes(conn, self._location, key, notes)
                    await conn.execute(
                        f"UPDATE sidecar_rounds SET reply = $3, replied_at = {_NOW} "
                        "WHERE location = $1 AND key = $2", self._location, key, reply)
                    await conn.execute("SELECT pg_notify($1, $2)", CHANNEL,
                                       self._note(key, "replied"))
                return
            except _FAILURES as exc:
                if self._closed:
                    log.warning("could not hand a resumed call's answer back: %s", exc)
                    return
                log.warning("handing a resumed call's answer back failed (retrying): %s", exc)
            await asyncio.sleep(self._poll)

    # --- the resuming replica's side -----------------------------------------------------

    async def resume(self, key: str, request: str, responses: Any, *, wants: Any = None,
                     on_note: OnNote | None = None) -> Any:
        await self._start()
        woken = asyncio.Event()
        self._waiting[key] = woken
        handed = False
        holder = "?"
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                row = await conn.fetchrow(_RESUMABLE, self._location, key, self.silent_after)
                if row is None or row["used"] or not row["open"] or row["request"] != request:
                    raise RoundUnknown(key)
                holder = str(row["holder"])
                if not row["alive"]:
                    raise RoundHolderGone(_replica(holder), self.silent_after, before=True)
                await conn.execute(
                    "UPDATE sidecar_rounds SET responses = $3, resumed_by = $4, relay = $5 "
                    "WHERE location = $1 AND key = $2", self._location, key,
                    json.dumps(responses, ensure_ascii=False), self.holder,
                    None if wants is None else json.dumps(wants, ensure_ascii=False))
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL,
                                   self._note(key, "resumed", holder))
            handed = True
            loop = asyncio.get_running_loop()
            failing_since: float | None = None
            while True:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(self._poll):
                        await woken.wait()
                woken.clear()
                try:
                    replied: Any = await self._pool.fetchrow(_REPLY, self._location, key,
                                                             self.silent_after)
                except _FAILURES as exc:
                    failing_since = failing_since or loop.time()
                    if loop.time() - failing_since > self.silent_after:
                        raise RoundLost(
                            f"the fleet database failed for {self.silent_after:g} s while "
                            f"waiting for replica {_replica(holder)!r} to continue the paused "
                            f"call: {exc}") from exc
                    log.warning("waiting for a resumed call's answer (retrying): %s", exc)
                    continue
                failing_since = None
                for note in replied["notes"]:  # in order, before the answer
                    if on_note is not None:
                        await on_note(json.loads(note))
                if replied["reply"] is not None:
                    return _unwrap(json.loads(replied["reply"]))
                if not replied["alive"]:  # silent for too long, or its row pruned
                    raise RoundHolderGone(_replica(holder), self.silent_after,
                                          before=replied["taken"] is False)
        except asyncio.CancelledError:
            if handed:
                self._spawn(self._cancel(key, holder))
            raise
        finally:
            if self._waiting.get(key) is woken:
                del self._waiting[key]

    async def _cancel(self, key: str, holder: str) -> None:
        try:
            async with self._pool.acquire() as conn, conn.transaction():
                await conn.execute(
                    "UPDATE sidecar_rounds SET cancelled = true WHERE location = $1 AND key = $2",
                    self._location, key)
                await conn.execute("SELECT pg_notify($1, $2)", CHANNEL,
                                   self._note(key, "cancelled", holder))
        except _FAILURES as exc:
            log.warning("could not cancel a call resumed on another replica: %s", exc)

    # --- delivery ------------------------------------------------------------------------

    def _note(self, key: str, event: str, holder: str | None = None) -> str:
        return json.dumps({"l": self._location, "k": key, "e": event,
                           "h": holder or self.holder}, ensure_ascii=False)

    def _notified(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        try:
            note = json.loads(str(payload))
            location, key, event, holder = note["l"], note["k"], note["e"], note["h"]
        except (ValueError, KeyError, TypeError):
            log.warning("ignored a malformed notification on %s", CHANNEL)
            return
        if location != self._location:
            return
        if event in ("replied", "noted"):
            woken = self._waiting.get(key)
            if woken is not None:
                woken.set()
        elif holder == self.holder and event == "resumed":
            self._spawn(self._take(key))
        elif holder == self.holder and event == "cancelled":
            running = self._running.get(key)
            if running is not None:
                running.cancel()

    async def _start(self) -> None:
        """Listen and poll from the first call held or resumed here on."""
        if self._listens or self._closed:
            return
        async with self._listen_lock:
            if not self._listens:
                await self._listening.start()
                self._poller = asyncio.create_task(self._poll_forever(), name="rounds-poll")
                self._listens = True

    async def _poll_forever(self) -> None:
        polls = 0
        while True:
            await asyncio.sleep(self._poll)
            polls += 1
            try:
                await self._carried.run(self._refresh(prune=polls % PRUNE_EVERY == 0))
            except _FAILURES as exc:
                log.warning("refreshing this replica's paused calls failed (retrying): %s", exc)
            except Exception:  # never ends the poll: paused calls and resumes depend on it
                log.exception("refreshing this replica's paused calls failed unexpectedly "
                              "(retrying)")

    async def _refresh(self, *, prune: bool) -> None:
        if self._listens and self._listening.lost:
            await self._listening.restart()
        for woken in self._waiting.values():  # a reply whose notification was lost
            woken.set()
        if self._held or self._running:
            async with self._pool.acquire() as conn:
                await conn.execute(f"UPDATE sidecar_rounds SET seen_at = {_NOW} "
                                   "WHERE holder = $1", self.holder)
                rows = await conn.fetch(
                    "SELECT key, taken, cancelled FROM sidecar_rounds WHERE location = $1 "
                    "AND holder = $2 AND responses IS NOT NULL AND reply IS NULL",
                    self._location, self.holder)
            for row in rows:
                key = str(row["key"])
                if not row["taken"]:
                    self._spawn(self._take(key))
                elif row["cancelled"] and key in self._running:
                    self._running[key].cancel()
        if prune:
            await self._pool.execute(_PRUNE, max(self.silent_after * 2, 60.0))

    def _task(self, work: Awaitable[None]) -> asyncio.Future[None]:
        """`work` in a task whose database operations end even when it is cancelled."""
        task = asyncio.get_running_loop().create_task(self._carried.run(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)
        return task

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        if self._closed:
            work.close()
            return
        task = asyncio.get_running_loop().create_task(self._carried.run(work))
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def aclose(self) -> None:
        self._closed = True
        tasks = [t for t in (self._poller, *self._running.values(), *self._background)
                 if t is not None]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        await self._carried.drain()
        await self._listening.stop()
        try:  # its paused calls are gone: a resume elsewhere says so at once (then pruned)
            await self._pool.execute(
                "UPDATE sidecar_rounds SET seen_at = '-infinity' WHERE holder = $1", self.holder)
        except _FAILURES as exc:
            log.warning("could not unlist this replica's paused calls (they expire): %s", exc)


def _replica(holder: str) -> str:
    """The replica id in a holder name (`<replica id>/<suffix>`)."""
    return holder.rpartition("/")[0] or holder


def _unwrap(reply: Any) -> Any:
    if isinstance(reply, dict):
        if "value" in reply:
            return reply["value"]
        if "failed" in reply:
            raise RuntimeError(f"the replica holding the call failed: {reply['failed']}")
    raise RoundUnknown("the holder no longer had the paused call")

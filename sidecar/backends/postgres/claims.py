"""In-flight claims on PostgreSQL: one replica of a fleet runs a call id at a time
(`PostgresClaims`, a lease per call id in `sidecar_claims`; the protocol is its docstring, the
reasons are in this package's README.md). Owned by the fleet's outcome log
(`sidecar.backends.postgres.outcome_log`).

Imports `sidecar.model`, `sidecar.stores`, `asyncpg` and this package. Exports
`PostgresClaims`, `claim_ttl_from_env` (`SIDECAR_CLAIM_TTL`), `DEFAULT_CLAIM_TTL`, `claim_key`,
`CHANNEL` and `CLAIM_ONE`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import os
import sys
from typing import Any

import asyncpg

from sidecar.backends.postgres.batch import Batcher
from sidecar.backends.postgres.pool import connection_lost, failures
from sidecar.model.errors import CallIdConflict
from sidecar.model.outcome import Outcome
from sidecar.model.retention import parse_duration
from sidecar.stores.outcome_log import expired_outcome, replayed_outcome

__all__ = ["CHANNEL", "CLAIM_ONE", "DEFAULT_CLAIM_TTL", "PostgresClaims", "claim_key",
           "claim_ttl_from_env"]

log = logging.getLogger("sidecar.backends.postgres.claims")

DEFAULT_CLAIM_TTL = 30.0
"""Seconds a claim lives without renewal (`SIDECAR_CLAIM_TTL`)."""
MAX_POLL_SECONDS = 2.0
"""A waiting duplicate looks again at least this often, even when no notification came."""
LISTEN_RETRY_SECONDS = 60.0
"""After LISTEN failed, waiting duplicates poll alone this long before it is tried again."""
SWEEP_EVERY = 9
"""Every this many renewal rounds (3 TTLs), a replica deletes the claims that expired over a
TTL ago: those of replicas that died with no duplicate arriving to take the call over."""
CHANNEL = "sidecar_claims"
"""The NOTIFY channel: the payload is `claim_key(location, call_id)`."""

CLAIMS_MIGRATION = """
CREATE TABLE sidecar_claims (
    location    TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    replica     TEXT NOT NULL,
    claimed_at  TIMESTAMPTZ NOT NULL,
    expires_at  TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (location, call_id)
);
"""

CLAIM_FUNCTION = """
CREATE FUNCTION sidecar_claim(p_location TEXT, p_call_id TEXT, p_fingerprint TEXT,
                              p_replica TEXT, p_ttl DOUBLE PRECISION)
RETURNS TABLE (previous TEXT, body TEXT, settled_fp TEXT, expired_tool TEXT,
               settled_at DOUBLE PRECISION, claim_fp TEXT, expires_in DOUBLE PRECISION)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    taken TEXT;
BEGIN
    WITH old AS (SELECT c0.replica FROM sidecar_claims AS c0
                 WHERE c0.location = p_location AND c0.call_id = p_call_id)
    INSERT INTO sidecar_claims AS c (location, call_id, fingerprint, replica, claimed_at,
                                     expires_at)
    VALUES (p_location, p_call_id, p_fingerprint, p_replica, now(),
            now() + make_interval(secs => p_ttl))
    ON CONFLICT (location, call_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
        replica = EXCLUDED.replica, claimed_at = EXCLUDED.claimed_at,
        expires_at = EXCLUDED.expires_at
    WHERE c.expires_at < now()
    RETURNING coalesce((SELECT old.replica FROM old), '') INTO taken;
    -- A query of its own: in a VOLATILE function under READ COMMITTED it takes a new
    -- snapshot, so it sees every outcome committed before the claim was taken (recording
    -- deletes the claim in the transaction that stores the outcome).
    RETURN QUERY
    SELECT taken, o.body, o.fingerprint, e.tool, e.settled_at, c.fingerprint,
           EXTRACT(EPOCH FROM c.expires_at - now())::float8
    FROM (SELECT p_location AS location, p_call_id AS call_id) AS k
    LEFT JOIN sidecar_outcomes AS o USING (location, call_id)
    LEFT JOIN sidecar_expired AS e USING (location, call_id)
    LEFT JOIN sidecar_claims AS c USING (location, call_id);
END
$$;
"""
"""`sidecar_claim(...)`: take the claim (insert if absent, or take over an expired one), then
read the call's outcome, tombstone and claim: one round trip. `previous`: NULL when the claim
is held by another replica, '' when it was free, else the replica whose expired claim this
took over."""
CLAIMS_BATCH_MIGRATION = """
ALTER TABLE sidecar_claims ADD COLUMN waited BOOLEAN NOT NULL DEFAULT false;
CREATE FUNCTION sidecar_claim_one(p_location TEXT, p_call_id TEXT, p_fingerprint TEXT,
                                  p_wait BOOLEAN, p_replica TEXT, p_ttl DOUBLE PRECISION)
RETURNS TABLE (previous TEXT, body TEXT, settled_fp TEXT, expired_tool TEXT,
               settled_at DOUBLE PRECISION, claim_fp TEXT, expires_in DOUBLE PRECISION)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    taken TEXT;
BEGIN
    WITH old AS (SELECT c0.replica, c0.expires_at FROM sidecar_claims AS c0
                 WHERE c0.location = p_location AND c0.call_id = p_call_id)
    INSERT INTO sidecar_claims AS c (location, call_id, fingerprint, replica, claimed_at,
                                     expires_at)
    VALUES (p_location, p_call_id, p_fingerprint, p_replica, now(),
            now() + make_interval(secs => p_ttl))
    ON CONFLICT (location, call_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
        replica = EXCLUDED.replica, claimed_at = EXCLUDED.claimed_at,
        expires_at = EXCLUDED.expires_at
    WHERE c.expires_at < now()
    RETURNING coalesce((SELECT CASE WHEN old.expires_at < now() THEN old.replica ELSE '' END
                        FROM old), '') INTO taken;
    IF taken IS NULL AND p_wait THEN
        -- A duplicate about to wait marks the claim it waits for: the settle or release that
        -- deletes it then NOTIFYs. The INSERT above locked the row it found (even untaken),
        -- so the claim cannot be deleted between it and this mark.
        UPDATE sidecar_claims SET waited = true
        WHERE location = p_location AND call_id = p_call_id AND NOT waited;
    END IF;
    -- A query of its own: in a VOLATILE function under READ COMMITTED it takes a new
    -- snapshot, so it sees every outcome committed before the claim was taken (recording
    -- deletes the claim in the transaction that stores the outcome).
    RETURN QUERY
    SELECT taken, o.body, o.fingerprint, e.tool, e.settled_at, c.fingerprint,
           EXTRACT(EPOCH FROM c.expires_at - now())::float8
    FROM (SELECT p_location AS location, p_call_id AS call_id) AS k
    LEFT JOIN sidecar_outcomes AS o USING (location, call_id)
    LEFT JOIN sidecar_expired AS e USING (location, call_id)
    LEFT JOIN sidecar_claims AS c USING (location, call_id);
END
$$;
CREATE FUNCTION sidecar_claim_batch(p_locations TEXT[], p_call_ids TEXT[],
                                    p_fingerprints TEXT[], p_wait BOOLEAN[], p_replica TEXT,
                                    p_ttl DOUBLE PRECISION)
RETURNS TABLE (previous TEXT, body TEXT, settled_fp TEXT, expired_tool TEXT,
               settled_at DOUBLE PRECISION, claim_fp TEXT, expires_in DOUBLE PRECISION)
LANGUAGE plpgsql VOLATILE AS $$
#variable_conflict use_column
DECLARE
    taken_locations TEXT[];
    taken_call_ids TEXT[];
    taken_from TEXT[];
BEGIN
    -- The same steps as sidecar_claim_one, each one statement for every call (a LATERAL
    -- subquery per call, kept from being flattened into a join by OFFSET 0, makes every
    -- lookup a primary-key probe: a join would scan sidecar_claims, whose rows churn); the
    -- calls in key order, so replicas claiming the same calls lock them in the same order.
    WITH k AS (SELECT * FROM unnest(p_locations, p_call_ids, p_fingerprints)
               AS k(location, call_id, fingerprint)),
    old AS (SELECT k.location, k.call_id, c0.replica, c0.expires_at FROM k,
            LATERAL (SELECT c1.replica, c1.expires_at FROM sidecar_claims AS c1
                     WHERE c1.location = k.location AND c1.call_id = k.call_id
                     OFFSET 0) AS c0),
    taken AS (
        INSERT INTO sidecar_claims AS c (location, call_id, fingerprint, replica, claimed_at,
                                         expires_at)
        SELECT k.location, k.call_id, k.fingerprint, p_replica, now(),
               now() + make_interval(secs => p_ttl)
        FROM k ORDER BY k.location, k.call_id
        ON CONFLICT (location, call_id) DO UPDATE SET fingerprint = EXCLUDED.fingerprint,
            replica = EXCLUDED.replica, claimed_at = EXCLUDED.claimed_at,
            expires_at = EXCLUDED.expires_at
        WHERE c.expires_at < now()
        RETURNING c.location, c.call_id)
    SELECT array_agg(t.location), array_agg(t.call_id),
           array_agg(coalesce(CASE WHEN old.expires_at < now() THEN old.replica END, ''))
    INTO taken_locations, taken_call_ids, taken_from
    FROM taken AS t LEFT JOIN old ON old.location = t.location AND old.call_id = t.call_id;
    IF true = ANY(p_wait) THEN
        UPDATE sidecar_claims AS c SET waited = true
        FROM unnest(p_locations, p_call_ids, p_wait) AS w(location, call_id, wait)
        WHERE w.wait AND c.location = w.location AND c.call_id = w.call_id
              AND NOT c.waited;
    END IF;
    RETURN QUERY
    SELECT t.prev, o.body, o.fingerprint, e.tool, e.settled_at, c.fingerprint,
           EXTRACT(EPOCH FROM c.expires_at - now())::float8
    FROM unnest(p_locations, p_call_ids) WITH ORDINALITY AS k(location, call_id, n)
    LEFT JOIN unnest(taken_locations, taken_call_ids, taken_from) AS t(location, call_id, prev)
        ON t.location = k.location AND t.call_id = k.call_id
    LEFT JOIN LATERAL (SELECT o1.body, o1.fingerprint FROM sidecar_outcomes AS o1
                       WHERE o1.location = k.location AND o1.call_id = k.call_id
                       OFFSET 0) AS o ON true
    LEFT JOIN LATERAL (SELECT e1.tool, e1.settled_at FROM sidecar_expired AS e1
                       WHERE e1.location = k.location AND e1.call_id = k.call_id
                       OFFSET 0) AS e ON true
    LEFT JOIN LATERAL (SELECT c1.fingerprint, c1.expires_at FROM sidecar_claims AS c1
                       WHERE c1.location = k.location AND c1.call_id = k.call_id
                       OFFSET 0) AS c ON true
    ORDER BY k.n;
END
$$;
"""
"""Schema v4: `sidecar_claim_one(...)` takes one claim (insert if absent, or take over an
expired one), marks it `waited` if the caller is to wait for it, then reads the call's
outcome, tombstone and claim: one round trip; `sidecar_claim_batch(...)` does so for the
calls one replica claims at once (`sidecar.backends.postgres.batch`), one row each, in order.
`previous`: NULL when the claim is held by another replica, '' when it was free, else the
replica whose expired claim this took over. Only deleting a `waited` claim NOTIFYs (a NOTIFY
takes a lock that serialises every notifying commit of the cluster). (`sidecar_claim`, v3,
stays for replicas of the previous version while a fleet upgrades: their settles NOTIFY
always, and their duplicates, which do not mark, poll.)"""
CLAIM_ONE = "SELECT * FROM sidecar_claim_one($1, $2, $3, $4, $5, $6)"
_CLAIM_BATCH = "SELECT * FROM sidecar_claim_batch($1, $2, $3, $4, $5, $6)"
# A claim's commit does not wait for its WAL to reach the disk: the connection the claims go
# through has synchronous_commit=off for its session (`_asynchronous`; reset when it goes back
# to the pool; per statement, set_config(..., true) cost each claim ~25 µs of the server). A
# claim is a lease, and what a crash of the database could lose with it (the claims of the last
# moment) a replica stalled past the TTL loses as well. Outcomes stay synchronous.
_RELEASE = f"""
WITH gone AS (DELETE FROM sidecar_claims WHERE location = $1 AND call_id = $2
              AND replica = $3 RETURNING waited)
SELECT pg_notify('{CHANNEL}', $4) FROM gone WHERE waited
"""
# SKIP LOCKED: a claim being settled (its row locked by the settling statement) needs no
# renewal, and waiting for it could deadlock with a settle of several claims.
_RENEW = """
UPDATE sidecar_claims AS c SET expires_at = now() + make_interval(secs => $4)
WHERE (c.location, c.call_id) IN (
    SELECT c1.location, c1.call_id FROM sidecar_claims AS c1
    JOIN unnest($2::text[], $3::text[]) AS k(location, call_id)
      ON c1.location = k.location AND c1.call_id = k.call_id
    WHERE c1.replica = $1 FOR UPDATE OF c1 SKIP LOCKED)
"""
_SWEEP = """
DELETE FROM sidecar_claims WHERE expires_at < now() - make_interval(secs => $1)
"""


def claim_key(location: str, call_id: str) -> str:
    """The NOTIFY payload naming one call: short whatever the ids' length."""
    return hashlib.md5(f"{location}\n{call_id}".encode(), usedforsecurity=False).hexdigest()


def claim_ttl_from_env() -> float:
    """`$SIDECAR_CLAIM_TTL` (seconds, or 90s, 2m, ...), else 30 s. A bad value ends the
    command with a one-line message and exit status 2."""
    text = os.environ.get("SIDECAR_CLAIM_TTL", "").strip()
    try:
        return parse_duration(text) if text else DEFAULT_CLAIM_TTL
    except ValueError as exc:
        print(f"sidecar: SIDECAR_CLAIM_TTL: {exc}", file=sys.stderr, flush=True)
        raise SystemExit(2) from None


_DB_ERRORS = failures()

_Claim = tuple[str, str, str, bool]
"""One call to claim: location, call id, fingerprint, and whether its caller waits."""


def _claim_row(claim: _Claim) -> tuple[str, str]:
    return claim[0], claim[1]


async def _asynchronous(conn: Any) -> None:
    """The claims' connection: commits do not wait for the WAL flush (see `CLAIM_ONE`)."""
    set_for_session = getattr(conn, "set_for_session", None)
    if set_for_session is not None:  # a pool of `sidecar.backends.postgres.pool.open_pool`
        await set_for_session("synchronous_commit", "off")


class PostgresClaims:
    """The claims of one replica; owned by its outcome log. A claim is a row of
    `sidecar_claims` (location, call_id, fingerprint, replica, claimed_at, expires_at,
    waited), a lease:

        claim      INSERT ... ON CONFLICT: taken if absent, or taken over if its lease
                   expired; then the outcome is read again (a call settled just before the
                   claim was taken replays instead of running twice); both in the function
                   `sidecar_claim_batch`, one round trip for every call of this replica
                   claiming at that moment (`Batcher`: group commit)
        held       another replica's live claim: the same call waits, LISTENing on the
                   `sidecar_claims` channel and polling (every min(TTL/3, 2 s)) as a
                   fallback, then replays the outcome (`replayed: true`), or takes the claim
                   over once it expires; another call (fingerprint) under that id is a
                   `conflict` at once. Once listening, its looks mark the claim `waited`
        renew      one background task renews all this replica's live claims in one UPDATE
                   every TTL/3 (`start`)
        settle     recording the outcome deletes the claim in the same statement, and
                   NOTIFYs only if the claim was `waited` for
        release    a call cancelled before it settled deletes its claim (and NOTIFYs if it
                   was waited for), so a waiting duplicate runs it at once
        sweep      every 3 TTLs each replica deletes the claims that expired over a TTL ago
                   (a dead replica's call that no duplicate came to take over)

    A replica that dies stops renewing: its claims expire after the TTL (`SIDECAR_CLAIM_TTL`,
    default 30 s) and a waiting or later duplicate takes the call over and runs it. A replica
    stalled for longer than the TTL may find its call taken over, and then both run it; the
    outcome log still keeps only the first outcome, and both answer that one. Expiry is judged
    by the database's clock. A duplicate waits no longer than the first replica's run (bounded
    by the tool's own timeout); the waiting itself is cancellable like any call."""

    def __init__(self, pool: asyncpg.Pool, *, replica: str, ttl: float,
                 retention_seconds: float | None) -> None:
        self._pool = pool
        self.replica = replica
        self.ttl = ttl
        self._retention = retention_seconds
        self._poll = min(MAX_POLL_SECONDS, ttl / 3)
        self._live: set[tuple[str, str]] = set()
        self._waiting: dict[str, set[asyncio.Event]] = {}
        self._listener: Any = None  # a pool connection LISTENing on CHANNEL
        self._listening: asyncio.Task[None] | None = None
        self._listen_retry_at = 0.0
        self._releases: set[asyncio.Task[None]] = set()
        self._renewer: asyncio.Task[None] | None = None
        self._batcher: Batcher[_Claim, Any] = Batcher(
            pool, self._send, key=_claim_row, name="claims", abandoned=self._abandoned,
            prepare=_asynchronous)
        self.taken_over = 0
        """Claims this replica took over from an expired holder."""

    def start(self) -> None:
        """Start renewing this replica's live claims (every TTL/3)."""
        self._renewer = asyncio.create_task(self._renew_forever(), name="claims-renew")

    @property
    def live(self) -> frozenset[tuple[str, str]]:
        """(location, call id) of the claims this replica holds now."""
        return frozenset(self._live)

    async def claim(self, location: str, call_id: str, fingerprint: str) -> Outcome | None:
        """See `OutcomeLog.claim`."""
        key = claim_key(location, call_id)
        woken: asyncio.Event | None = None
        try:
            while True:
                state = await self._attempt(location, call_id, fingerprint,
                                            wait=woken is not None)
                if not isinstance(state, float):
                    return state
                if woken is None:
                    # Listen first, then look again: a settle in between is not missed.
                    woken = asyncio.Event()
                    self._waiting.setdefault(key, set()).add(woken)
                    await self._listen()
                    continue
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(min(self._poll, state) + 0.01):
                        await woken.wait()
                woken.clear()
        finally:
            if woken is not None:
                waiters = self._waiting.get(key)
                if waiters is not None:
                    waiters.discard(woken)
                    if not waiters:
                        del self._waiting[key]

    async def _attempt(self, location: str, call_id: str, fingerprint: str, *,
                       wait: bool) -> Outcome | float | None:
        """One look: the outcome, None (claimed), or seconds until the holder's claim
        expires (0.0: look again at once). `wait`: this caller listens for the claim's end,
        so the look marks the claim it finds held. A claim the database gave us after we
        were cancelled is given back (`_abandoned`)."""
        row: Any = await self._batcher.submit((location, call_id, fingerprint, wait))
        previous: str | None = row["previous"]
        won = previous is not None
        if won:
            self._live.add((location, call_id))
        if row["body"] is not None or row["expired_tool"] is not None:
            if won:  # settled just before our claim: replay it, run nothing
                await self.release(location, call_id)
            if row["body"] is not None:
                return replayed_outcome(call_id, (row["body"], row["settled_fp"]), fingerprint)
            return expired_outcome(call_id, row["expired_tool"], row["settled_at"],
                                   self._retention)
        if won:
            if previous:
                self.taken_over += 1
                log.warning("call %s: took over the expired claim of replica %s", call_id,
                            previous)
            return None
        if row["claim_fp"] is None:
            return 0.0  # settled or released between the two statements: look again
        if fingerprint and row["claim_fp"] and row["claim_fp"] != fingerprint:
            raise CallIdConflict(call_id)
        return max(0.0, float(row["expires_in"]))

    async def holder(self, location: str, call_id: str) -> str | None:
        """The replica whose live claim `call_id` is (any replica's, this one's included)."""
        async with self._pool.acquire() as conn:
            found = await conn.fetchval(
                "SELECT replica FROM sidecar_claims WHERE location = $1 AND call_id = $2 AND "
                "expires_at > now()", location, call_id)
        return None if found is None else str(found)

    async def _send(self, conn: Any, claims: list[_Claim]) -> list[Any]:
        """One statement claiming `claims` (see `sidecar.backends.postgres.batch`)."""
        if len(claims) == 1:
            return [await conn.fetchrow(CLAIM_ONE, *claims[0], self.replica, self.ttl)]
        # In key order: replicas claiming the same calls lock their rows in the same order.
        order = sorted(range(len(claims)), key=lambda n: claims[n][:2])
        sent = [claims[n] for n in order]
        rows = await conn.fetch(_CLAIM_BATCH, [c[0] for c in sent], [c[1] for c in sent],
                                [c[2] for c in sent], [c[3] for c in sent], self.replica,
                                self.ttl)
        answers: list[Any] = [None] * len(claims)
        for n, row in zip(order, rows, strict=True):  # one row per claim, in order
            answers[n] = row
        return answers

    def _abandoned(self, claim: _Claim, row: Any) -> None:
        """The caller of `claim` was cancelled while it was sent: a claim won for it goes
        back (unless another call of this process holds it)."""
        location, call_id = claim[0], claim[1]
        if row["previous"] is not None and (location, call_id) not in self._live:
            self._released(location, call_id)

    def settled(self, location: str, call_id: str) -> None:
        """The outcome was recorded (and the claim deleted with it): stop renewing it."""
        self._live.discard((location, call_id))

    async def release(self, location: str, call_id: str) -> None:
        """Delete this replica's claim without an outcome and wake the waiters. Runs to the
        end even when the caller is cancelled meanwhile; a database error is logged (the
        claim then expires)."""
        await asyncio.shield(self._released(location, call_id))

    def _released(self, location: str, call_id: str) -> asyncio.Task[None]:
        self._live.discard((location, call_id))
        task = asyncio.create_task(self._delete(location, call_id))
        self._releases.add(task)
        task.add_done_callback(self._releases.discard)
        return task

    async def _delete(self, location: str, call_id: str) -> None:
        try:
            async with self._pool.acquire() as conn:
                await conn.execute(_RELEASE, location, call_id, self.replica,
                                   claim_key(location, call_id))
        except _DB_ERRORS as exc:
            log.warning("releasing the claim on call %s failed (it expires in at most %g s): "
                        "%s", call_id, self.ttl, exc)

    async def _listen(self) -> None:
        """LISTEN on one pool connection, once (again if that connection closed); polling
        alone for a while when the database refuses (e.g. a pooler in transaction mode).
        Carried to its end when the waiting caller is cancelled: cancelling asyncpg while it
        opens a connection leaves that connection's error unread."""
        loop = asyncio.get_running_loop()
        if loop.time() < self._listen_retry_at or (self._listener is not None
                                                   and not connection_lost(self._listener)):
            return
        if self._listening is None or self._listening.done():
            self._listening = asyncio.create_task(self._start_listening(),
                                                  name="claims-listen")
        await asyncio.shield(self._listening)

    async def _start_listening(self) -> None:
        if self._listener is not None:  # its connection closed
            closed, self._listener = self._listener, None
            await self._pool.release(closed)
        conn: Any = None
        try:
            conn = await self._pool.acquire()
            await conn.add_listener(CHANNEL, self._notified)
        except _DB_ERRORS as exc:
            self._listen_retry_at = asyncio.get_running_loop().time() + LISTEN_RETRY_SECONDS
            log.warning("LISTEN %s failed; duplicates of a running call poll every %g s "
                        "instead (next try in %g s): %s", CHANNEL, self._poll,
                        LISTEN_RETRY_SECONDS, exc)
            if conn is not None:
                await self._pool.release(conn)
            return
        except BaseException:
            if conn is not None:
                await self._pool.release(conn)
            raise
        self._listener = conn

    def _notified(self, _conn: Any, _pid: int, _channel: str, payload: object) -> None:
        for woken in self._waiting.get(str(payload), ()):
            woken.set()

    async def _renew_forever(self) -> None:
        rounds = 0
        while True:
            await asyncio.sleep(self.ttl / 3)
            rounds += 1
            try:
                if self._live:
                    locations, call_ids = zip(*self._live, strict=True)
                    async with self._pool.acquire() as conn:
                        await conn.execute(_RENEW, self.replica, list(locations),
                                           list(call_ids), self.ttl)
                if rounds % SWEEP_EVERY == 0:
                    async with self._pool.acquire() as conn:
                        await conn.execute(_SWEEP, self.ttl)
            except _DB_ERRORS as exc:
                log.warning("renewing this replica's claims failed (retrying in %g s): %s",
                            self.ttl / 3, exc)
            except Exception:  # never ends the renewal: the running calls' claims need it
                log.exception("renewing this replica's claims failed unexpectedly (retrying "
                              "in %g s)", self.ttl / 3)

    async def aclose(self) -> None:
        if self._renewer is not None:
            self._renewer.cancel()
            await asyncio.wait([self._renewer])
        await self._batcher.aclose()
        if self._releases:
            await asyncio.wait(list(self._releases))
        for location, call_id in list(self._live):  # calls still running at shutdown
            await self.release(location, call_id)
        if self._listening is not None:
            await asyncio.wait([self._listening])
        if self._listener is not None:
            listener, self._listener = self._listener, None
            with contextlib.suppress(*_DB_ERRORS):
                await listener.remove_listener(CHANNEL, self._notified)
            await self._pool.release(listener)

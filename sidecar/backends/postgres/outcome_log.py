"""The outcome log on PostgreSQL: `sidecar.stores.outcome_log.OutcomeLog` shared by every
replica of a fleet, one durable outcome per (Location, call id), with in-flight claims
(`sidecar.backends.postgres.claims`) so one replica runs a call id at a time.

Imports `sidecar.stores`, `sidecar.model`, `asyncpg` and this package. Exports `PostgresOutcomeLog`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any

import asyncpg

from sidecar.backends.postgres.batch import Batcher
from sidecar.backends.postgres.claims import (
    CHANNEL,
    CLAIM_FUNCTION,
    CLAIMS_BATCH_MIGRATION,
    CLAIMS_MIGRATION,
    PostgresClaims,
    claim_key,
    claim_ttl_from_env,
)
from sidecar.backends.postgres.pool import (
    LOCK_PRUNE_OUTCOMES,
    failures,
    migrate,
    open_pool,
)
from sidecar.model.outcome import Outcome
from sidecar.model.replica import replica_id
from sidecar.model.tool import ToolContext
from sidecar.stores.errors import DatabaseError
from sidecar.stores.outcome_log import (
    OutcomeLogError,
    OutcomeLogStats,
    expired_outcome,
    replayed_outcome,
)

log = logging.getLogger("sidecar.backends.postgres.outcome_log")
_FAILURES = failures()

SETTLE_FUNCTION = f"""
CREATE FUNCTION sidecar_settle_batch(p_locations TEXT[], p_call_ids TEXT[],
                                     p_session_ids TEXT[], p_agents TEXT[],
                                     p_message_ids TEXT[], p_tools TEXT[], p_statuses TEXT[],
                                     p_bodies TEXT[], p_created_at DOUBLE PRECISION[],
                                     p_fingerprints TEXT[], p_woken_by TEXT[])
RETURNS SETOF BOOLEAN LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    i INTEGER;
    stored BOOLEAN;
    waited_for BOOLEAN;
BEGIN
    -- One outcome after the other: each statement is a primary-key lookup, whatever the
    -- size of sidecar_claims (its rows churn: a join would scan it).
    FOR i IN 1 .. coalesce(cardinality(p_call_ids), 0) LOOP
        INSERT INTO sidecar_outcomes (location, call_id, session_id, agent, message_id, tool,
                                      status, body, created_at, fingerprint)
        VALUES (p_locations[i], p_call_ids[i], p_session_ids[i], p_agents[i],
                p_message_ids[i], p_tools[i], p_statuses[i], p_bodies[i], p_created_at[i],
                p_fingerprints[i])
        ON CONFLICT (location, call_id) DO NOTHING;
        stored := FOUND;
        DELETE FROM sidecar_claims
        WHERE location = p_locations[i] AND call_id = p_call_ids[i] RETURNING waited
        INTO waited_for;
        IF waited_for THEN
            PERFORM pg_notify('{CHANNEL}', p_woken_by[i]);
        END IF;
        RETURN NEXT stored;
    END LOOP;
END
$$;
"""
"""Schema v4 (with `CLAIMS_BATCH_MIGRATION`): `sidecar_settle_batch(...)` records the outcomes
one replica records at once in one round trip and one transaction
(`sidecar.backends.postgres.batch`):
each outcome is stored if absent and its call's claim deleted together, and the duplicates
waiting for that claim (`waited`) are woken. One row per outcome: stored, or False when one
was already."""
GENERIC_PLANS_MIGRATION = """
ALTER FUNCTION sidecar_claim_batch(TEXT[], TEXT[], TEXT[], BOOLEAN[], TEXT, DOUBLE PRECISION)
    SET plan_cache_mode = force_generic_plan;
ALTER FUNCTION sidecar_settle_batch(TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[], TEXT[],
                                    TEXT[], DOUBLE PRECISION[], TEXT[], TEXT[])
    SET plan_cache_mode = force_generic_plan;
"""
"""Schema v5: the batch functions' statements keep one generic plan per connection. Each is a
primary-key probe whatever the arrays hold, and PostgreSQL would otherwise plan them again at
every call (a custom plan for each new set of values): that planning was 30-55 % of the
server's CPU per call (measured with batches of 16 and of 4, 2026-12-05). `sidecar_claim_one`
keeps the default (a generic plan made its single-row statements slower)."""
SCHEMA_VERSION = 5
MIGRATIONS: dict[int, str] = {
    1: """
CREATE TABLE sidecar_outcomes (
    location    TEXT NOT NULL,
    call_id     TEXT NOT NULL,
    session_id  TEXT NOT NULL,
    agent       TEXT NOT NULL,
    message_id  TEXT NOT NULL,
    tool        TEXT NOT NULL,
    status      TEXT NOT NULL,
    body        TEXT NOT NULL,
    created_at  DOUBLE PRECISION NOT NULL,
    fingerprint TEXT NOT NULL DEFAULT '',
    PRIMARY KEY (location, call_id)
);
CREATE INDEX sidecar_outcomes_by_age ON sidecar_outcomes (created_at);
CREATE TABLE sidecar_expired (
    location   TEXT NOT NULL,
    call_id    TEXT NOT NULL,
    tool       TEXT NOT NULL,
    settled_at DOUBLE PRECISION NOT NULL,
    PRIMARY KEY (location, call_id)
);
""",
    2: CLAIMS_MIGRATION,
    3: CLAIM_FUNCTION,
    4: CLAIMS_BATCH_MIGRATION + SETTLE_FUNCTION,
    5: GENERIC_PLANS_MIGRATION,
}
COMPONENT = "outcome_log"
PRUNE_LOCK = LOCK_PRUNE_OUTCOMES
"""The advisory lock key the replicas take to prune (one at a time)."""
PRUNE_BATCH = 500

_RECORD_BATCH = """
SELECT sidecar_settle_batch($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11) AS stored
"""
RECORD_ONE = f"""
WITH stored AS (
    INSERT INTO sidecar_outcomes (location, call_id, session_id, agent, message_id, tool,
                                  status, body, created_at, fingerprint)
    VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)
    ON CONFLICT (location, call_id) DO NOTHING RETURNING 1
), settled AS (
    DELETE FROM sidecar_claims WHERE location = $1 AND call_id = $2 RETURNING waited
)
SELECT EXISTS (SELECT 1 FROM stored) AS stored,
       (SELECT count(pg_notify('{CHANNEL}', $11)) FROM settled WHERE waited) AS woken
"""
"""One outcome: the same as `sidecar_settle_batch` in one plain statement."""

_Settle = tuple[str, str, str, str, str, str, str, str, float, str, str]
"""One outcome to record: the columns of `_RECORD`'s arrays, in order."""


def _settle_row(settle: _Settle) -> tuple[str, str]:
    return settle[0], settle[1]


async def _send_settles(conn: Any, settles: list[_Settle]) -> list[bool]:
    """One statement recording `settles`: for each, whether its outcome was stored (False:
    one was already). In key order, so replicas lock rows in the same order."""
    if len(settles) == 1:
        return [await conn.fetchval(RECORD_ONE, *settles[0])]
    order = sorted(range(len(settles)), key=lambda n: settles[n][:2])
    columns = zip(*(settles[n] for n in order), strict=True)
    rows = await conn.fetch(_RECORD_BATCH, *(list(column) for column in columns))
    stored = [False] * len(settles)
    for n, row in zip(order, rows, strict=True):
        stored[n] = row["stored"]
    return stored


class PostgresOutcomeLog:
    """The fleet's `OutcomeLog`, with the embedded log's semantics. Build it with
    `await PostgresOutcomeLog.open(dsn)`.

    `record` inserts if absent (`INSERT ... ON CONFLICT DO NOTHING`), so when two replicas
    settle the same call id only the first outcome is kept and both return it; a different
    call under a used id (another fingerprint) is a `CallIdConflict`; pruned outcomes leave
    tombstones that replay as `expired`. Pruning runs on at most one replica at a time (a
    transaction-level advisory lock: a replica that does not get it skips that round), in
    batches. `open` applies the migrations this code knows, in one transaction, and refuses a
    database whose schema is newer (`OutcomeLogError`). In-flight claims (`claim`,
    `release`; `PostgresClaims`) make one replica run a call id at a time: a duplicate on
    another replica waits for the outcome and replays it, or takes the call over once the
    running replica's claim expires."""

    def __init__(self, pool: asyncpg.Pool, retention_seconds: float | None, *,
                 owns_pool: bool, replica: str | None = None,
                 claim_ttl: float | None = None) -> None:
        self._pool = pool
        self._owns_pool = owns_pool
        self.retention_seconds = retention_seconds
        self.claims = PostgresClaims(pool, replica=replica or replica_id(),
                                     ttl=claim_ttl or claim_ttl_from_env(),
                                     retention_seconds=retention_seconds)
        self._pruned = 0
        self._pruner: asyncio.Task[None] | None = None
        self._settles: Batcher[_Settle, bool] = Batcher(pool, _send_settles, key=_settle_row,
                                                        name="outcome-settles")

    @classmethod
    async def open(cls, dsn: str, *, retention_seconds: float | None = None,
                   prune_interval: float | None = None, min_size: int = 1,
                   max_size: int = 10, replica: str | None = None,
                   claim_ttl: float | None = None) -> PostgresOutcomeLog:
        """A log on a pool of its own (closed with the log). `replica` names the claims this
        log takes (default `sidecar.model.replica.replica_id()`); `claim_ttl`: seconds a claim lives
        without renewal (default `SIDECAR_CLAIM_TTL`, else 30 s)."""
        try:
            pool = await open_pool(dsn, min_size=min_size, max_size=max_size)
        except DatabaseError as exc:
            raise OutcomeLogError(f"cannot reach the outcome database: {exc.__cause__}") from exc
        try:
            return await cls.on_pool(pool, retention_seconds=retention_seconds,
                                     prune_interval=prune_interval, owns_pool=True,
                                     replica=replica, claim_ttl=claim_ttl)
        except BaseException:
            await pool.close()
            raise

    @classmethod
    async def on_pool(cls, pool: asyncpg.Pool, *, retention_seconds: float | None = None,
                      prune_interval: float | None = None, owns_pool: bool = False,
                      replica: str | None = None,
                      claim_ttl: float | None = None) -> PostgresOutcomeLog:
        """A log on the replica's shared pool (`sidecar.backends.postgres.pool.open_pool`); the
        pool stays
        open when the log closes unless `owns_pool`."""
        async with pool.acquire() as conn:
            await migrate(conn, COMPONENT, MIGRATIONS, SCHEMA_VERSION, error=OutcomeLogError)
        log_ = cls(pool, retention_seconds, owns_pool=owns_pool, replica=replica,
                   claim_ttl=claim_ttl)
        log_.claims.start()
        if retention_seconds is not None:
            interval = prune_interval or min(600.0, max(1.0, retention_seconds / 10))
            log_._pruner = asyncio.create_task(log_._prune_forever(interval),
                                               name="outcome-log-prune")
        return log_

    async def record(
        self, location: str, outcome: Outcome, context: ToolContext, fingerprint: str = ""
    ) -> Outcome:
        body = json.dumps(outcome.to_json(include_output=False), ensure_ascii=False)
        try:
            if await self._settles.submit((
                    location, outcome.call_id, context.session_id, context.agent,
                    context.message_id, outcome.tool, outcome.status, body, time.time(),
                    fingerprint, claim_key(location, outcome.call_id))):
                return outcome
            async with self._pool.acquire() as conn:
                found = await conn.fetchrow(
                    "SELECT body, fingerprint FROM sidecar_outcomes WHERE location = $1 AND "
                    "call_id = $2", location, outcome.call_id)
        except _FAILURES as exc:
            raise OutcomeLogError(f"recording the outcome of {outcome.call_id!r}: {exc}") from exc
        finally:
            self.claims.settled(location, outcome.call_id)
        if found is None:  # pruned between the two statements: the first outcome is gone
            return expired_outcome(outcome.call_id, outcome.tool, time.time(),
                                   self.retention_seconds)
        return replayed_outcome(outcome.call_id, (found["body"], found["fingerprint"]),
                                fingerprint)

    async def claim(self, location: str, call_id: str, fingerprint: str = "",
                    tool: str = "") -> Outcome | None:
        try:
            return await self.claims.claim(location, call_id, fingerprint)
        except _FAILURES as exc:
            raise OutcomeLogError(f"claiming call {call_id!r}: {exc}") from exc

    async def release(self, location: str, call_id: str) -> None:
        await self.claims.release(location, call_id)

    async def holder(self, location: str, call_id: str) -> str | None:
        try:
            return await self.claims.holder(location, call_id)
        except _FAILURES as exc:
            raise OutcomeLogError(f"reading the claim on call {call_id!r}: {exc}") from exc

    async def get(self, location: str, call_id: str, fingerprint: str = "") -> Outcome | None:
        try:
            async with self._pool.acquire() as conn:
                found = await conn.fetchrow(
                    "SELECT body, fingerprint FROM sidecar_outcomes WHERE location = $1 AND "
                    "call_id = $2", location, call_id)
                if found is not None:
                    return replayed_outcome(call_id, (found["body"], found["fingerprint"]),
                                            fingerprint)
                gone = await conn.fetchrow(
                    "SELECT tool, settled_at FROM sidecar_expired WHERE location = $1 AND "
                    "call_id = $2", location, call_id)
        except (OSError, asyncpg.PostgresError) as exc:
            raise OutcomeLogError(f"reading the outcome of {call_id!r}: {exc}") from exc
        if gone is None:
            return None
        return expired_outcome(call_id, gone["tool"], gone["settled_at"],
                               self.retention_seconds)

    async def prune(self, cutoff: float, batch: int = PRUNE_BATCH) -> int:
        """Prune outcomes settled before `cutoff`, keeping tombstones, in batches; 0 when
        another replica holds the pruning lock."""
        total = 0
        while True:
            try:
                async with self._pool.acquire() as conn, conn.transaction():
                    if not await conn.fetchval("SELECT pg_try_advisory_xact_lock($1)",
                                               PRUNE_LOCK):
                        return total
                    moved = await conn.fetch(
                        "WITH gone AS (DELETE FROM sidecar_outcomes WHERE (location, call_id) "
                        "IN (SELECT location, call_id FROM sidecar_outcomes WHERE created_at "
                        "< $1 ORDER BY created_at LIMIT $2) RETURNING location, call_id, tool, "
                        "created_at) INSERT INTO sidecar_expired SELECT * FROM gone "
                        "ON CONFLICT DO NOTHING RETURNING 1", cutoff, batch)
            except _FAILURES as exc:
                raise OutcomeLogError(f"pruning the outcome log: {exc}") from exc
            total += len(moved)
            self._pruned += len(moved)
            if len(moved) < batch:
                return total

    async def _prune_forever(self, interval: float) -> None:
        assert self.retention_seconds is not None
        while True:
            try:
                await self.prune(time.time() - self.retention_seconds)
            except OutcomeLogError as exc:
                log.warning("pruning the outcome log failed (retrying in %ss): %s", interval,
                            exc)
            except Exception:  # never ends the pruning: the log would grow without bound
                log.exception("pruning the outcome log failed unexpectedly (retrying in %ss)",
                              interval)
            await asyncio.sleep(interval)

    async def stats(self) -> OutcomeLogStats:
        async with self._pool.acquire() as conn:
            row: Any = await conn.fetchrow(
                "SELECT (SELECT count(*) FROM sidecar_outcomes) AS outcomes, "
                "(SELECT count(*) FROM sidecar_expired) AS expired, "
                "pg_total_relation_size('sidecar_outcomes') + "
                "pg_total_relation_size('sidecar_expired') AS bytes")
        return OutcomeLogStats(outcomes=int(row["outcomes"]), expired=int(row["expired"]),
                               pruned=self._pruned, disk_bytes={"outcomes": int(row["bytes"])})

    async def aclose(self) -> None:
        await self._settles.aclose()
        await self.claims.aclose()
        if self._pruner is not None:
            self._pruner.cancel()
            await asyncio.wait([self._pruner])
        if self._owns_pool:
            await self._pool.close()

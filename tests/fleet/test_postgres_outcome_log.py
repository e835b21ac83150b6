"""The PostgreSQL outcome log as a fleet shares it: two logs on one database stand for two
replicas (real PostgreSQL, tests/fleet/postgres.py)."""

from __future__ import annotations

import asyncio
import time

import asyncpg
import pytest

from sidecar.backends.postgres.outcome_log import SCHEMA_VERSION, PostgresOutcomeLog
from sidecar.model.content import TextContent
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.stores.outcome_log import OutcomeLogError
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio


def completed(call_id: str, text: str) -> Outcome:
    return Outcome(call_id=call_id, tool="echo", status="completed", content=(TextContent(text),))


def ctx(call_id: str) -> ToolContext:
    return ToolContext(session_id="s", agent="a", message_id="m", call_id=call_id)


async def test_one_outcome_per_call_id_across_replicas(postgres_server: PostgresServer) -> None:
    dsn = await postgres_server.new_database()
    a, b = await PostgresOutcomeLog.open(dsn), await PostgresOutcomeLog.open(dsn)
    try:
        for i in range(50):  # both replicas settle the same call at once
            first, second = await asyncio.gather(
                a.record("loc", completed(f"c{i}", "from a"), ctx(f"c{i}"), "fp"),
                b.record("loc", completed(f"c{i}", "from b"), ctx(f"c{i}"), "fp"),
            )
            assert first.content == second.content  # whoever came first, both answer it
            stored_a, stored_b = await a.get("loc", f"c{i}", "fp"), await b.get("loc", f"c{i}")
            assert stored_a is not None and stored_b is not None
            assert stored_a.content == stored_b.content == first.content
        assert (await a.stats()).outcomes == 50
    finally:
        await a.aclose()
        await b.aclose()


async def test_pruning_runs_once_for_the_fleet(postgres_server: PostgresServer) -> None:
    dsn = await postgres_server.new_database()
    a, b = await PostgresOutcomeLog.open(dsn), await PostgresOutcomeLog.open(dsn)
    try:
        for i in range(1200):
            await a.record("loc", completed(f"c{i}", "x"), ctx(f"c{i}"))
        pruned = await asyncio.gather(a.prune(time.time() + 1, batch=100),
                                      b.prune(time.time() + 1, batch=100))
        assert sum(pruned) == 1200  # every outcome once, whichever replica held the lock
        expired = await b.get("loc", "c7")
        assert expired is not None and expired.error is not None
        assert expired.error.kind.value == "expired"
    finally:
        await a.aclose()
        await b.aclose()


async def test_a_newer_schema_is_refused(postgres_server: PostgresServer) -> None:
    dsn = await postgres_server.new_database()
    log = await PostgresOutcomeLog.open(dsn)
    await log.aclose()
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE sidecar_schema SET version = $1 WHERE component = "
                           "'outcome_log'", SCHEMA_VERSION + 1)
    finally:
        await conn.close()
    with pytest.raises(OutcomeLogError, match="newer than this sidecar knows"):
        await PostgresOutcomeLog.open(dsn)


async def test_an_unreachable_database_is_a_clear_error() -> None:
    with pytest.raises(OutcomeLogError, match="cannot reach the outcome database"):
        await PostgresOutcomeLog.open("postgresql://nobody@127.0.0.1:9/none")

"""Retention runs once for the fleet: two `sidecar serve` replicas on one PostgreSQL database
with a one-second `SIDECAR_RETENTION` prune the outcome log one at a time (an advisory lock).

Shown with the database's own statement log (`log_statement = all` for this database only):
while the test holds the pruning lock, both replicas try it (their connections are named
`sidecar <replica id>` in `pg_stat_activity`) and neither deletes anything; once it is
released, every outcome is pruned exactly once: the replicas' `outcomes_pruned` counters add up
to the number of calls and each call id has one tombstone.
"""

from __future__ import annotations

import asyncio
import re
import secrets
import time
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from sidecar.backends.postgres.pool import LOCK_PRUNE_OUTCOMES
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop

CALLS = 12
RETENTION = 1.0
NAMES = ("replica-a", "replica-b")
LINE = re.compile(r"\[(\d+)\] LOG:\s+(?:statement|execute [^:]*):\s+(.*)")


class StatementLog:
    """The statements PostgreSQL logged after a point, with the replica that sent each."""

    def __init__(self, server: PostgresServer) -> None:
        self.path = server.root / "log"
        self.offset = 0

    def mark(self) -> None:
        self.offset = self.path.stat().st_size

    async def since_mark(self, conn: Any) -> list[tuple[str, str]]:
        """(application name, statement) of every statement logged since `mark`."""
        with self.path.open("rb") as f:
            f.seek(self.offset)
            text = f.read().decode("utf-8", "replace")
        names = {row["pid"]: row["application_name"] for row in await conn.fetch(
            "SELECT pid, application_name FROM pg_stat_activity")}
        found = []
        for line in text.splitlines():
            match = LINE.search(line)
            if match:
                found.append((names.get(int(match[1]), "?"), match[2]))
        return found


async def until(check: Any, what: str, seconds: float = 30.0) -> None:
    """Poll `check()` (a hang guard, not a speed assertion)."""
    deadline = time.monotonic() + seconds
    while not await check():
        assert time.monotonic() < deadline, f"waited {seconds:g} s for {what}"
        await asyncio.sleep(0.1)


async def calls(url: str, token: str, prefix: str, count: int) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=30,
                                 headers={"authorization": f"Bearer {token}"}) as http:
        snapshot = (await http.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
        for i in range(count):
            res = await http.post(f"/v1/snapshots/{snapshot}/calls", json={
                "name": "stamp", "input": {"line": f"{prefix}{i}"},
                "context": {"session_id": "s", "agent": "a", "message_id": "m",
                            "call_id": f"{prefix}{i}"}})
            assert res.json()["status"] == "completed", res.text


async def pruned_by(url: str, token: str) -> int:
    async with httpx.AsyncClient(base_url=url, timeout=30,
                                 headers={"authorization": f"Bearer {token}"}) as http:
        health = (await http.get("/v1/health")).json()
    return int(health["state"]["upkeep"]["outcomes_pruned"])


def test_two_replicas_prune_the_outcome_log_once(tmp_path: Path,
                                                 postgres_server: PostgresServer) -> None:
    asyncio.run(_prune_once(tmp_path, postgres_server))


async def _prune_once(tmp_path: Path, server: PostgresServer) -> None:
    dsn = await server.new_database()
    conn = await asyncpg.connect(dsn)
    database = await conn.fetchval("SELECT current_database()")
    await conn.execute(f"ALTER DATABASE \"{database}\" SET log_statement = 'all'")
    await conn.execute("SELECT pg_advisory_lock($1)", LOCK_PRUNE_OUTCOMES)  # a pruner "busy"
    token = secrets.token_urlsafe(32)
    started: list[Any] = []
    try:
        urls = []
        for name in NAMES:
            proc, url = start_replica(tmp_path / name, dsn, token, tmp_path / "runs.txt",
                                      name=name, env_extra={"SIDECAR_RETENTION": "1s"})
            started.append(proc)
            urls.append(url)
        await calls(urls[0], token, "on-a-", CALLS // 2)
        await calls(urls[1], token, "on-b-", CALLS // 2)
        await asyncio.sleep(RETENTION + 0.2)  # every outcome is now older than the retention
        log = StatementLog(server)
        log.mark()

        async def both_tried() -> bool:
            tried = {who for who, sql in await log.since_mark(conn)
                     if "pg_try_advisory_xact_lock" in sql}
            return tried >= {f"sidecar {n}" for n in NAMES}

        await until(both_tried, "both replicas to try the pruning lock")
        statements = await log.since_mark(conn)
        assert not [s for _, s in statements if "DELETE FROM sidecar_outcomes" in s]
        assert await conn.fetchval("SELECT count(*) FROM sidecar_outcomes") == CALLS

        await conn.execute("SELECT pg_advisory_unlock($1)", LOCK_PRUNE_OUTCOMES)

        async def all_pruned() -> bool:
            return await conn.fetchval("SELECT count(*) FROM sidecar_outcomes") == 0

        await until(all_pruned, "the outcomes to be pruned")
        assert await conn.fetchval("SELECT count(*) FROM sidecar_expired") == CALLS
        counts = [await pruned_by(url, token) for url in urls]
        assert sum(counts) == CALLS, counts
        deleting = {who for who, sql in await log.since_mark(conn)
                    if "DELETE FROM sidecar_outcomes" in sql}
        assert deleting and deleting <= {f"sidecar {n}" for n in NAMES}
    finally:
        for proc in started:
            stop(proc)
        await conn.close()

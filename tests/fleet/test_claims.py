"""In-flight claims between two `sidecar serve` processes (replicas A and B) on one real
PostgreSQL database: the same call id sent to both at once runs once, and the claim of a
replica killed mid-call expires so that the other runs the call."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import SIDECAR, stop

# `hold` appends its shell's pid to STARTED, runs while the file BLOCK exists, then appends
# the line to RUNS: the test decides when a run ends, and counts the runs that ended.
HOLD = """echo $$ >> STARTED
while [ -e BLOCK ]; do sleep 0.02; done
echo "$1" >> RUNS
echo "$1"
"""
MANIFEST = """
[tools.hold]
kind = "command"
description = "Note the start, wait while a file exists, then append a line to a file"
input = { type = "object", properties = { line = { type = "string" } }, required = ["line"] }
argv = ["sh", "HOLD", "{line}"]
"""
CLAIM_TTL = "2"


@dataclass
class Fleet:
    dsn: str
    token: str
    block: Path
    started: Path
    runs: Path
    a: subprocess.Popen[str]
    url_a: str
    b: subprocess.Popen[str]
    url_b: str


def start(root: Path, name: str, dsn: str, token: str, files: dict[str, Path],
          ) -> tuple[subprocess.Popen[str], str]:
    (root / "manifests").mkdir(parents=True)
    script = HOLD
    for placeholder, path in files.items():
        script = script.replace(placeholder, str(path))
    (root / "hold.sh").write_text(script)
    manifest = MANIFEST.replace("HOLD", str(root / "hold.sh"))
    (root / "manifests" / "tools.toml").write_text(manifest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_MANIFESTS=str(root / "manifests"),
               SIDECAR_TOKEN=token, SIDECAR_DATABASE_URL=dsn, SIDECAR_REPLICA_ID=name,
               SIDECAR_CLAIM_TTL=CLAIM_TTL)
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env, text=True,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, f"replica {name} exited early: {''.join(lines)}"
        lines.append(line)
        if "listening on " in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, line.split("listening on ", 1)[1].strip()


@pytest.fixture
def fleet(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Fleet]:
    import anyio

    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    files = {name: tmp_path / name.lower() for name in ("BLOCK", "STARTED", "RUNS")}
    a, url_a = start(tmp_path / "a", "replica-a", dsn, token, files)
    try:
        b, url_b = start(tmp_path / "b", "replica-b", dsn, token, files)
        try:
            yield Fleet(dsn, token, files["BLOCK"], files["STARTED"], files["RUNS"], a, url_a,
                        b, url_b)
        finally:
            stop(b)
    finally:
        stop(a)  # closes its pipe, killed or not


async def call(url: str, token: str, call_id: str, line: str) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=60) as client:
        snap = (await client.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
        response = await client.post(f"/v1/snapshots/{snap}/calls", json={
            "name": "hold", "input": {"line": line},
            "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
        return dict(response.json())


def lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


async def until(condition: Any, what: str) -> None:
    deadline = time.monotonic() + 60
    while not await condition():
        assert time.monotonic() < deadline, f"gave up waiting: {what}"
        await asyncio.sleep(0.05)


async def fetch(dsn: str, query: str) -> list[asyncpg.Record]:
    conn = await asyncpg.connect(dsn)
    try:
        return list(await conn.fetch(query))
    finally:
        await conn.close()


def test_the_same_call_id_sent_to_both_at_once_runs_once(fleet: Fleet) -> None:
    async def both() -> list[dict[str, Any]]:
        fleet.block.touch()
        calls = [asyncio.create_task(call(url, fleet.token, "race-1", "raced"))
                 for url in (fleet.url_a, fleet.url_b)]

        async def one_running_one_waiting() -> bool:
            listening = await fetch(fleet.dsn, "SELECT 1 FROM pg_stat_activity WHERE datname "
                                    "= current_database() AND query LIKE 'LISTEN %sidecar_claims%'")
            return len(lines(fleet.started)) == 1 and len(listening) == 1

        await until(one_running_one_waiting, "one replica runs the call, the other waits")
        fleet.block.unlink()
        return list(await asyncio.gather(*calls))

    answers = asyncio.run(both())
    assert lines(fleet.runs) == ["raced"] and len(lines(fleet.started)) == 1  # ran once
    assert [a["status"] for a in answers] == ["completed", "completed"]
    assert answers[0]["content"] == answers[1]["content"]
    assert sorted(a["replayed"] for a in answers) == [False, True]
    assert asyncio.run(fetch(fleet.dsn, "SELECT * FROM sidecar_claims")) == []


def test_a_replica_killed_mid_call_leaves_no_stuck_claim(fleet: Fleet) -> None:
    async def scenario() -> dict[str, Any]:
        fleet.block.touch()
        on_a = asyncio.create_task(call(fleet.url_a, fleet.token, "kill-1", "survived"))

        async def running_on_a() -> bool:
            return bool(lines(fleet.started))

        await until(running_on_a, "A runs the call")
        [claim] = await fetch(fleet.dsn, "SELECT replica FROM sidecar_claims")
        assert claim["replica"] == "replica-a"
        fleet.a.send_signal(signal.SIGKILL)  # A and its tool die mid-call: nobody settles it
        os.kill(int(lines(fleet.started)[0]), signal.SIGKILL)
        fleet.a.wait(timeout=30)
        with pytest.raises(httpx.HTTPError):
            await on_a
        fleet.block.unlink()
        return await call(fleet.url_b, fleet.token, "kill-1", "survived")

    answer = asyncio.run(scenario())
    assert answer["status"] == "completed" and not answer["replayed"]  # B ran it
    assert lines(fleet.runs) == ["survived"] and len(lines(fleet.started)) == 2
    assert asyncio.run(fetch(fleet.dsn, "SELECT * FROM sidecar_claims")) == []
    [stored] = asyncio.run(fetch(fleet.dsn, "SELECT status FROM sidecar_outcomes "
                                            "WHERE call_id = 'kill-1'"))
    assert stored["status"] == "completed"


def test_a_bad_claim_ttl_stops_serve_with_one_line(tmp_path: Path,
                                                    postgres_server: PostgresServer) -> None:
    import anyio

    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"), SIDECAR_TOKEN=secrets.token_urlsafe(32),
               SIDECAR_DATABASE_URL=anyio.run(postgres_server.new_database),
               SIDECAR_CLAIM_TTL="soon")
    ended = subprocess.run([*SIDECAR, "serve", "--port", "0"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert ended.returncode == 2
    assert ended.stderr.strip().splitlines() == [
        "sidecar: SIDECAR_CLAIM_TTL: not a duration: 'soon' (use seconds, or 90s, 30m, 12h, 7d)"]

"""Two `sidecar serve` replicas keeping managed texts on one S3 location (SeaweedFS) indexed in
one PostgreSQL database (`SIDECAR_OBJECT_STORE` + `SIDECAR_DATABASE_URL`): a large output
bounded into a managed ref on A is read through B (by line offsets, inside a line, by
pattern, with `managed_read`), retention runs once for the fleet, deleting the objects and
their index rows together, and an upload cut short by kill -9 (write-behind) resumes when the
replica starts again on its state directory."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import obstore
import pytest

from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server
from tests.fleet.test_replicas import start_replica, stop

ROWS = 100_000  # about 2.3 MB of output
BIG = f"""
[tools.big]
kind = "command"
description = "Print many numbered rows"
input = {{ type = "object", properties = {{}} }}
argv = ["awk",
        "BEGIN {{ for (i = 1; i <= {ROWS}; i++) printf \\"row %d of the output\\\\n\\", i }}"]
"""


@dataclass
class Fleet:
    url_a: str
    url_b: str
    token: str
    dsn: str
    s3: S3Server
    location: str

    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


def _fleet(tmp_path: Path, postgres: PostgresServer, s3: S3Server,
           retention: str | None) -> Iterator[Fleet]:
    import anyio

    dsn = anyio.run(postgres.new_database)
    location = s3.new_location()
    manifests = tmp_path / "big"
    manifests.mkdir()
    (manifests / "big.toml").write_text(BIG)
    env = {**s3.env(location), "SIDECAR_MANIFESTS": str(manifests)}
    if retention is not None:
        env["SIDECAR_RETENTION"] = retention
    token = secrets.token_urlsafe(32)
    runs = tmp_path / "runs.txt"
    procs: list[subprocess.Popen[str]] = []
    try:
        a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a",
                                 env_extra=env)
        procs.append(a)
        b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b",
                                 env_extra=env)
        procs.append(b)
        yield Fleet(url_a, url_b, token, dsn, s3, location)
    finally:
        for proc in reversed(procs):
            stop(proc)


@pytest.fixture
def fleet(tmp_path: Path, postgres_server: PostgresServer, s3_server: S3Server
          ) -> Iterator[Fleet]:
    yield from _fleet(tmp_path, postgres_server, s3_server, retention=None)


@pytest.fixture
def short_lived_fleet(tmp_path: Path, postgres_server: PostgresServer, s3_server: S3Server
                      ) -> Iterator[Fleet]:
    """Retention 2 s: each replica tries a cleanup every second."""
    yield from _fleet(tmp_path, postgres_server, s3_server, retention="2s")


async def _call(client: httpx.AsyncClient, name: str, arguments: dict[str, Any],
                call_id: str) -> dict[str, Any]:
    snap = (await client.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
    response = await client.post(f"/v1/snapshots/{snap}/calls", json={
        "name": name, "input": arguments,
        "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _row(n: int) -> str:
    return f"row {n} of the output"


async def _read_through_b(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url_a, headers=fleet.headers(),
                                 timeout=60) as a, \
            httpx.AsyncClient(base_url=fleet.url_b, headers=fleet.headers(), timeout=60) as b:
        made = await _call(a, "big", {}, "big-1")
        assert made["status"] == "completed", made
        [managed] = made["managed"]
        ref = managed["ref"]
        assert managed["lines"] == ROWS
        assert (await b.get("/v1/health")).headers["sidecar-replica"] == "replica-b"

        page = (await b.get(f"/v1/managed/{ref}", params={"offset": 77_777, "limit": 3})).json()
        assert page["text"] == "".join(f"{_row(n)}\n" for n in range(77_777, 77_780))
        inside = (await b.get(f"/v1/managed/{ref}", params={
            "offset": 99_999, "start": 4, "length": 5})).json()
        assert inside["text"] == "99999" and not inside["end_of_line"]
        found = (await b.get(f"/v1/managed/{ref}", params={
            "pattern": r"^row 5000[0-2] ", "context": 1})).json()
        assert [m["line"] for m in found["matches"]] == [50_000, 50_001, 50_002]
        assert found["matches"][0]["before"] == [_row(49_999)]

        tool = await _call(b, "managed_read", {"ref": ref, "offset": 60_001, "limit": 2}, "r1")
        text = tool["content"][0]["text"]
        assert f"{_row(60_001)}\n{_row(60_002)}" in text and _row(60_003) not in text
        grep = await _call(b, "managed_read", {"ref": ref, "pattern": r"row 99999 "}, "r2")
        assert _row(99_999) in grep["content"][0]["text"]


def test_a_ref_created_through_a_is_read_through_b(fleet: Fleet) -> None:
    asyncio.run(_read_through_b(fleet))


async def _expire(fleet: Fleet) -> None:
    async with httpx.AsyncClient(base_url=fleet.url_a, headers=fleet.headers(),
                                 timeout=60) as a, \
            httpx.AsyncClient(base_url=fleet.url_b, headers=fleet.headers(), timeout=60) as b:
        refs = []
        for i, client in enumerate((a, b, a)):
            made = await _call(client, "big", {}, f"expiring-{i}")
            refs.append(made["managed"][0]["ref"])
        conn = await asyncpg.connect(fleet.dsn)
        try:
            async with asyncio.timeout(60):  # a hang guard: both replicas clean every second
                while True:
                    indexed = await conn.fetchval(
                        "SELECT (SELECT count(*) FROM sidecar_managed_objects)"
                        " + (SELECT count(*) FROM sidecar_managed_pending)")
                    if not indexed:
                        break
                    await asyncio.sleep(0.1)
            assert await conn.fetchval("SELECT count(*) FROM sidecar_managed_marks") == 0
        finally:
            await conn.close()
        prefix = fleet.location.split("/", 3)[3]
        left = [o["path"] for batch in obstore.list(fleet.s3.client(), prefix=prefix)  # type: ignore[arg-type]
                for o in batch]
        assert left == []  # no bytes without a row, no row without its bytes
        for ref in refs:
            assert (await b.get(f"/v1/managed/{ref}")).status_code == 404
        evicted = []
        for client in (a, b):
            health = (await client.get("/v1/health")).json()
            evicted.append(health["state"]["upkeep"]["managed_evicted_expired"])
        assert sum(evicted) == len(refs)  # each object evicted once, by one replica


def test_retention_runs_once_and_deletes_objects_with_their_rows(
    short_lived_fleet: Fleet,
) -> None:
    asyncio.run(_expire(short_lived_fleet))


async def _resume_after_kill(tmp_path: Path, postgres: PostgresServer, s3: S3Server) -> None:
    dsn = await postgres.new_database()
    location = s3.new_location()
    manifests = tmp_path / "big"
    manifests.mkdir()
    (manifests / "big.toml").write_text(BIG)
    env = {**s3.env(location), "SIDECAR_MANIFESTS": str(manifests)}
    token = secrets.token_urlsafe(32)
    runs = tmp_path / "runs.txt"
    headers = {"authorization": f"Bearer {token}"}
    procs: list[subprocess.Popen[str]] = []
    try:
        a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a",
                                 env_extra=env)
        procs.append(a)
        b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b",
                                 env_extra=env)
        procs.append(b)
        staging = tmp_path / "a" / "state" / "managed-s3"
        os.kill(s3.process.pid, signal.SIGSTOP)  # no upload can end: the bucket is paused
        try:
            async with httpx.AsyncClient(base_url=url_a, headers=headers, timeout=60) as client:
                made = await _call(client, "big", {}, "big-1")
            ref = made["managed"][0]["ref"]
            assert [p.name for p in staging.glob("*/objects/*")] == [ref]
            a.kill()  # kill -9: no shutdown, the upload never ended
            a.wait()
            assert a.stderr is not None
            a.stderr.close()
        finally:
            os.kill(s3.process.pid, signal.SIGCONT)
        # A again, on the same state directory: it uploads the object again
        again, _ = start_replica(tmp_path / "a-again", dsn, token, runs, name="replica-a",
                                 env_extra={**env, "SIDECAR_STATE_DIR": str(tmp_path / "a" /
                                                                            "state")})
        procs.append(again)
        async with httpx.AsyncClient(base_url=url_b, headers=headers, timeout=60) as client:
            page = (await client.get(f"/v1/managed/{ref}",
                                     params={"offset": 77_777, "limit": 2})).json()
        assert page["text"] == f"{_row(77_777)}\n{_row(77_778)}\n"
        conn = await asyncpg.connect(dsn)
        try:
            assert await conn.fetchval(
                "SELECT staged_in FROM sidecar_managed_objects WHERE id = $1", ref) is None
        finally:
            await conn.close()
    finally:
        for proc in reversed(procs):
            if proc.poll() is None:
                stop(proc)
    assert list(staging.glob("*/objects/*")) == []


def test_a_replica_killed_before_its_upload_ended_uploads_it_when_restarted(
        tmp_path: Path, postgres_server: PostgresServer, s3_server: S3Server) -> None:
    """Write-behind across a crash: A bounds a large output into a ref while the bucket is
    paused (the commit does not wait for the upload), is killed with SIGKILL, and started
    again on the same state directory; the upload resumes and B reads the ref."""
    asyncio.run(_resume_after_kill(tmp_path, postgres_server, s3_server))

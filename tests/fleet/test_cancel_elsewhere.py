"""`DELETE /v1/calls/{id}` on any replica of a fleet: two `sidecar serve` processes (A and B)
on one real PostgreSQL database. A call running on A is cancelled through B exactly as a
DELETE on A cancels it (202 `cancelling`, the waiting caller gets 409 `cancelled`, nothing is
recorded); when A is dead (kill -9) B answers 409 `running_elsewhere` after a bounded wait
instead of hanging. `sidecar/backends/postgres/cancels.py` carries the request."""

from __future__ import annotations

import asyncio
import secrets
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest

from sidecar.serve.api import CANCEL_WAIT
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop

Fleet = tuple[str, str, str, Path, str, Any]


@pytest.fixture
def fleet(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Fleet]:
    import anyio

    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    runs = tmp_path / "runs.txt"
    a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a")
    try:
        b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b")
        try:
            yield url_a, url_b, token, runs, dsn, a
        finally:
            stop(b)
    finally:
        if a.poll() is None:
            stop(a)
        elif a.stderr is not None:  # killed by the test
            a.stderr.close()


def gated_call(call_id: str) -> dict[str, Any]:
    """The body of a `wait_open` call (it runs until RUNS.open exists)."""
    return {"name": "wait_open", "input": {}, "context": {
        "session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}}


async def snapshot(client: httpx.AsyncClient) -> str:
    made = await client.post("/v1/snapshots", json={"session_id": "s"})
    return str(made.json()["id"])


async def seen_running_on_b(b: httpx.AsyncClient, call_id: str) -> dict[str, Any]:
    deadline = time.monotonic() + 30  # a hang guard: the claim is taken as the call starts
    while (seen := await b.get(f"/v1/calls/{call_id}")).status_code == 404:
        assert time.monotonic() < deadline, seen.text
        await asyncio.sleep(0.05)
    return dict(seen.json())


async def cancel_rows(dsn: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(await conn.fetchval("SELECT count(*) FROM sidecar_cancels"))
    finally:
        await conn.close()


def test_a_call_running_on_one_replica_is_cancelled_through_the_other(fleet: Fleet) -> None:
    url_a, url_b, token, runs, dsn, _ = fleet
    headers = {"authorization": f"Bearer {token}"}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=url_a, headers=headers, timeout=60) as a, \
                httpx.AsyncClient(base_url=url_b, headers=headers, timeout=60) as b:
            snap = await snapshot(a)
            # an asynchronous call on A, cancelled through B
            started = await a.post(f"/v1/snapshots/{snap}/calls",
                                   headers={"prefer": "respond-async"},
                                   json=gated_call("gone-async"))
            assert started.status_code == 202
            assert await seen_running_on_b(b, "gone-async") == {
                "call_id": "gone-async", "status": "running", "replica": "replica-a"}
            cancel = await b.delete("/v1/calls/gone-async")
            assert cancel.status_code == 202, cancel.text
            assert cancel.json() == {"call_id": "gone-async", "status": "cancelling",
                                     "replica": "replica-a"}
            assert cancel.headers["sidecar-replica"] == "replica-b"
            # as after a local cancel: nothing was recorded, on either replica
            deadline = time.monotonic() + 30
            while (after := await a.get("/v1/calls/gone-async")).status_code != 404:
                assert time.monotonic() < deadline, after.text
                await asyncio.sleep(0.05)
            assert (await b.get("/v1/calls/gone-async")).status_code == 404
            again = await b.delete("/v1/calls/gone-async")
            assert again.status_code == 404 and again.json()["error"]["code"] == "unknown_call"

            # a synchronous caller waiting on A gets what a local cancel gives it
            waiting = asyncio.create_task(a.post(f"/v1/snapshots/{snap}/calls",
                                                 json=gated_call("gone-sync")))
            await seen_running_on_b(b, "gone-sync")
            assert (await b.delete("/v1/calls/gone-sync")).status_code == 202
            answer = await waiting
            assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"

            # the call id is free again: a retry runs, settles, and is no longer cancellable
            await asyncio.to_thread(Path(f"{runs}.open").touch)
            retried = await b.post(f"/v1/snapshots/{snap}/calls",
                                   json=gated_call("gone-sync"))
            assert retried.json()["status"] == "completed", retried.text
            settled = await a.delete("/v1/calls/gone-sync")
            assert settled.status_code == 409
            assert settled.json()["error"]["code"] == "already_settled"
        assert await cancel_rows(dsn) == 0  # every request was withdrawn once answered

    asyncio.run(scenario())


def test_a_cancel_for_a_dead_replica_answers_after_a_bounded_wait(fleet: Fleet) -> None:
    """A killed mid-call keeps its claim until it expires: B cannot deliver the cancel and
    says so (409 `running_elsewhere`, naming A) once A stayed silent for `CANCEL_WAIT`."""
    url_a, url_b, token, _, dsn, proc_a = fleet
    headers = {"authorization": f"Bearer {token}"}

    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=url_a, headers=headers, timeout=60) as a, \
                httpx.AsyncClient(base_url=url_b, headers=headers, timeout=60) as b:
            snap = await snapshot(a)
            started = await a.post(f"/v1/snapshots/{snap}/calls",
                                   headers={"prefer": "respond-async"},
                                   json=gated_call("orphan"))
            assert started.status_code == 202
            await seen_running_on_b(b, "orphan")
            proc_a.send_signal(signal.SIGKILL)
            proc_a.wait(timeout=30)
            began = time.monotonic()
            cancel = await b.delete("/v1/calls/orphan")
            waited = time.monotonic() - began
            assert cancel.status_code == 409, cancel.text
            error = cancel.json()["error"]
            assert error["code"] == "running_elsewhere"
            assert "replica-a" in error["message"] and "did not answer" in error["message"]
            assert waited >= CANCEL_WAIT  # it waited for A's answer, and then gave up
        assert await cancel_rows(dsn) == 0

    asyncio.run(scenario())

"""Two `sidecar serve` processes on one real PostgreSQL database, with a manifest rule that
makes the `stamp` tool ask: a call on A asks, the ask appears in B's pending list and in B's
`/v1/events` stream, the reply is sent to B, and the call on A completes with the tool's
output. The events of both replicas are numbered in one sequence; an `always` given on B
lets the session's later calls run unasked on both."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop

POLICY = """
[[permissions.rules]]
action = "stamp"
decision = "ask"
"""


@pytest.fixture
def asking_replicas(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[
        tuple[str, str, str, Path]]:
    import anyio

    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    runs = tmp_path / "runs.txt"
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "permissions.toml").write_text(POLICY)

    def manifests(root: Path) -> dict[str, str]:
        both = os.pathsep.join([str(root / "manifests"), str(tmp_path / "policy")])
        return {"SIDECAR_MANIFESTS": both}

    a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a",
                             env_extra=manifests(tmp_path / "a"))
    try:
        b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b",
                                 env_extra=manifests(tmp_path / "b"))
        try:
            yield url_a, url_b, token, runs
        finally:
            stop(b)
    finally:
        stop(a)


async def _events(client: httpx.AsyncClient) -> AsyncIterator[tuple[int, str, dict[str, Any]]]:
    """(id, name, data) of each event of the client's `/v1/events`, from the first kept."""
    async with client.stream("GET", "/v1/events", params={"last_event_id": "0"}) as stream:
        fields: dict[str, str] = {}
        async for line in stream.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
            elif "event" in fields:
                yield int(fields["id"]), fields["event"], json.loads(fields["data"])
                fields = {}
            else:
                fields = {}


async def _asked_on_b(url_a: str, url_b: str, token: str, runs: Path) -> None:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url_a, headers=headers, timeout=30) as on_a, \
            httpx.AsyncClient(base_url=url_b, headers=headers, timeout=30) as on_b:
        events = _events(on_b)
        snap = (await on_a.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
        call = asyncio.ensure_future(on_a.post(f"/v1/snapshots/{snap}/calls", json={
            "name": "stamp", "input": {"line": "approved"},
            "context": {"session_id": "s", "agent": "a", "message_id": "m",
                        "call_id": "asked-1"}}))
        async with asyncio.timeout(20):  # hang guard: the ask reaches B's stream
            async for _, name, data in events:
                if name == "permission.asked" and data["ask"]["action"] == "stamp":
                    asked = data["ask"]
                    break
        assert asked["source"]["call_id"] == "asked-1" and not call.done()
        # the command has not run: it waits for the answer
        assert not await asyncio.to_thread(runs.exists)

        pending = (await on_b.get("/v1/permissions", params={"session_id": "s"})).json()
        assert [p["id"] for p in pending["pending"]] == [asked["id"]]
        answered = await on_b.post(f"/v1/permissions/{asked['id']}/reply",
                                   json={"reply": "once"})
        assert answered.status_code == 200, answered.text
        async with asyncio.timeout(20):
            outcome = (await call).json()
        assert outcome["status"] == "completed", outcome
        assert outcome["content"] == [{"type": "text", "text": "approved\n"}]
        assert (await asyncio.to_thread(runs.read_text)).splitlines() == ["approved"]

        # A published the reply and the settled call: B's stream has them, numbered after
        # the ask, as B's own events would be
        seen: list[tuple[int, str]] = []
        async with asyncio.timeout(20):
            async for event_id, name, data in events:
                seen.append((event_id, name))
                if name == "call.settled" and data["call_id"] == "asked-1":
                    break
        assert "permission.replied" in {n for _, n in seen}
        assert [i for i, _ in seen] == sorted(i for i, _ in seen)
        gone = (await on_a.get("/v1/permissions")).json()["pending"]
        assert gone == [] and (await on_b.get("/v1/permissions")).json()["pending"] == []

        # `always` given on B: the session's later calls run on either replica unasked (one
        # that asked would wait for an answer nobody gives, and the guard would fail it)
        call = asyncio.ensure_future(_call(on_a, snap, "asked-2", "always"))
        async with asyncio.timeout(20):
            async for _, name, data in events:
                if name == "permission.asked" and data["ask"]["source"]["call_id"] == "asked-2":
                    ask_id = data["ask"]["id"]
                    break
        await events.aclose()  # type: ignore[attr-defined]
        answered = await on_b.post(f"/v1/permissions/{ask_id}/reply", json={"reply": "always"})
        assert answered.status_code == 200, answered.text
        async with asyncio.timeout(20):
            assert (await call)["status"] == "completed"
            snap_b = (await on_b.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
            for client, snapshot, call_id in ((on_a, snap, "asked-3"),
                                              (on_b, snap_b, "asked-4")):
                assert (await _call(client, snapshot, call_id, "unasked"))["status"] == \
                    "completed"


async def _call(client: httpx.AsyncClient, snap: str, call_id: str, line: str
                ) -> dict[str, Any]:
    response = await client.post(f"/v1/snapshots/{snap}/calls", json={
        "name": "stamp", "input": {"line": line},
        "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    return dict(response.json())


def test_an_ask_raised_on_a_is_answered_on_b_and_the_call_on_a_proceeds(
    asking_replicas: tuple[str, str, str, Path],
) -> None:
    url_a, url_b, token, runs = asking_replicas
    asyncio.run(_asked_on_b(url_a, url_b, token, runs))

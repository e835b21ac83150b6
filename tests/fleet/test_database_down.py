"""Two `sidecar serve` replicas (A and B) on a real PostgreSQL server of their own, which the
tests stop (connections refused) and freeze (SIGSTOP: connections hang), then bring back.

While the database is down, every route that needs it answers a clear error within the
bound (`SIDECAR_DATABASE_TIMEOUT`, 2 s here; the asserts only check "answers within 30 s"):
/v1 503 `unavailable` naming the database (`host:port/name`, never the user) and what could
not be done, /mcp (both protocol eras) a JSON-RPC -32603 error saying the same; a durable call
that cannot be claimed does not run, and one whose outcome could not be recorded is recorded
once the database is back (the retry with its call id replays it). Health says
"unavailable". Once the database is back the replicas serve again without a restart: calls,
the cross-replica event stream, asks answered on the other replica, and cancels."""

from __future__ import annotations

import asyncio
import json
import os
import secrets
import subprocess
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import SIDECAR, start_replica, stop

BOUND = "2"  # SIDECAR_DATABASE_TIMEOUT of the replicas, in seconds
HANG_GUARD = 30.0  # "does not hang": generous beside the bound

EXTRA = """
[tools.asked]
kind = "command"
description = "Print a line, once a person allowed it"
input = { type = "object", properties = { line = { type = "string" } }, required = ["line"] }
argv = ["echo", "{line}"]
"""
POLICY = """
[[permissions.rules]]
action = "asked"
decision = "ask"
"""
CONTEXT = {"session_id": "s", "agent": "a", "message_id": "m"}


@dataclass
class Fleet:
    server: PostgresServer
    a: str
    b: str
    headers: dict[str, str]
    runs: Path
    database: str  # host:port/name, as the answers name it
    scoped: str  # a token of profile "default", kept in the database (`sidecar token`)


@pytest.fixture
def fleet(tmp_path: Path) -> Iterator[Fleet]:
    server = PostgresServer.start()  # its own: the tests stop it
    try:
        dsn = anyio.run(server.new_database)
        token = secrets.token_urlsafe(32)
        runs = tmp_path / "runs.txt"
        (tmp_path / "extra").mkdir()
        (tmp_path / "extra" / "asked.toml").write_text(EXTRA)
        (tmp_path / "extra" / "permissions.toml").write_text(POLICY)

        def env(root: Path) -> dict[str, str]:
            dirs = os.pathsep.join([str(root / "manifests"), str(tmp_path / "extra")])
            return {"SIDECAR_MANIFESTS": dirs, "SIDECAR_DATABASE_TIMEOUT": BOUND}

        env_cli = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        env_cli.update(SIDECAR_DATABASE_URL=dsn, SIDECAR_STATE_DIR=str(tmp_path / "cli"))
        made = subprocess.run([*SIDECAR, "token", "create", "--profile", "default", "--json"],
                              env=env_cli, text=True, capture_output=True, timeout=60,
                              check=False)
        assert made.returncode == 0, made.stderr
        scoped = json.loads(made.stdout)["token"]
        a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a",
                                 env_extra=env(tmp_path / "a"))
        try:
            b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b",
                                     env_extra=env(tmp_path / "b"))
            try:
                yield Fleet(server, url_a, url_b, {"authorization": f"Bearer {token}"}, runs,
                            f"127.0.0.1:{server.port}/{dsn.rsplit('/', 1)[1]}", scoped)
            finally:
                stop(b)
        finally:
            stop(a)
    finally:
        server.stop()


def body(name: str, call_id: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "input": arguments, "context": {**CONTEXT, "call_id": call_id}}


async def snapshot(client: httpx.AsyncClient) -> str:
    made = await client.post("/v1/snapshots", json={"session_id": "s"})
    assert made.status_code == 201, made.text
    return str(made.json()["id"])


def ran(fleet: Fleet) -> list[str]:
    return fleet.runs.read_text().splitlines() if fleet.runs.exists() else []


def unavailable(fleet: Fleet, answer: httpx.Response, *said: str) -> str:
    assert answer.status_code == 503, answer.text
    error = answer.json()["error"]
    assert error["code"] == "unavailable", error
    message = str(error["message"])
    assert message.startswith(f"the fleet database {fleet.database} is unavailable: "), message
    assert "test@" not in message  # never the user (or a password)
    for words in said:
        assert words in message, message
    return message


@asynccontextmanager
async def mcp_client(url: str, fleet: Fleet, mode: str) -> AsyncIterator[Client]:
    async with httpx.AsyncClient(headers=fleet.headers, timeout=HANG_GUARD) as http:
        transport = streamable_http_client(f"{url}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None,  # type: ignore[arg-type]
                          read_timeout_seconds=HANG_GUARD) as client:
            yield client


async def mcp_call(client: Client, call_id: str, line: str) -> types.CallToolResult:
    params = types.CallToolRequestParams(name="stamp", arguments={"line": line},
                                         _meta={"io.mcp-sidecar/call_id": call_id})
    return await client.session.send_request(types.CallToolRequest(params=params),
                                             types.CallToolResult)


async def answers_while_down(fleet: Fleet, snap: str, tag: str) -> None:
    """Every route needing the database answers the clear error, within the guard."""
    async with httpx.AsyncClient(base_url=fleet.a, headers=fleet.headers,
                                 timeout=HANG_GUARD) as a:
        health = await a.get("/v1/health")
        assert health.status_code == 503, health.text
        assert health.json()["status"] == "unavailable"
        assert health.json()["database"]["reachable"] is False
        assert fleet.database in health.json()["database"]["error"]

        called = await a.post(f"/v1/snapshots/{snap}/calls", json=body(
            "stamp", f"{tag}-1", line=f"{tag}-1"))
        unavailable(fleet, called, f"call '{tag}-1' could not be claimed, so stamp did not run",
                    "retry with the same call id")
        unavailable(fleet, await a.post("/v1/snapshots", json={"session_id": "s"}),
                    "could not be kept")
        unavailable(fleet, await a.get("/v1/calls"), "the call history could not be read")
        unavailable(fleet, await a.delete("/v1/calls/nothing"),
                    "the call's state could not be read or changed")
        unavailable(fleet, await a.get("/v1/permissions"),
                    "the pending asks could not be listed")
        unavailable(fleet, await a.post("/v1/permissions/ask_unknown/reply",
                                        json={"reply": "once"}), "the reply could not be given")
        for path in ("/v1/tools", "/metrics"):  # need no database (metrics: what is known)
            answer = await a.get(path)
            assert answer.status_code == 200, answer.text
        # the web console: a page reading the database says so (503), as HTML
        token = fleet.headers["authorization"].removeprefix("Bearer ")
        async with httpx.AsyncClient(base_url=fleet.a, timeout=HANG_GUARD) as console:
            logged_in = await console.post("/ui/login", data={"token": token})
            assert logged_in.status_code == 303, logged_in.text
            page = await console.get("/ui/calls")
            assert page.status_code == 503, page.text
            assert f"the fleet database {fleet.database} is unavailable" in page.text
        # a scoped token is checked against the database (not used before: not cached)
        scoped = {"authorization": f"Bearer {fleet.scoped}"}
        unavailable(fleet, await a.get("/v1/tools", headers=scoped),
                    "the bearer token could not be checked")

    for mode in ("legacy", "2026-07-28"):
        async with mcp_client(fleet.a, fleet, mode) as client:
            assert "stamp" in {t.name for t in (await client.list_tools()).tools}
            with pytest.raises(MCPError) as failed:
                await mcp_call(client, f"{tag}-{mode}", f"{tag}-{mode}")
            assert failed.value.code == types.INTERNAL_ERROR
            message = failed.value.message
            assert message.startswith(f"the fleet database {fleet.database} is unavailable: ")
            assert f"call '{tag}-{mode}' could not be claimed, so stamp did not run" in message
    assert not [line for line in ran(fleet) if line.startswith(tag)]  # nothing ran


async def wait_healthy(fleet: Fleet) -> None:
    async with httpx.AsyncClient(headers=fleet.headers, timeout=HANG_GUARD) as http:
        for url in (fleet.a, fleet.b):
            deadline = time.monotonic() + 60
            while (health := await http.get(f"{url}/v1/health")).status_code != 200:
                assert time.monotonic() < deadline, health.text
                await asyncio.sleep(0.1)


async def serves_again(fleet: Fleet, tag: str) -> None:
    """Calls (the refused ones too, with their call ids), events, asks and cancels across
    the two replicas, as before the outage."""
    await wait_healthy(fleet)
    async with httpx.AsyncClient(base_url=fleet.a, headers=fleet.headers,
                                 timeout=HANG_GUARD) as a, \
            httpx.AsyncClient(base_url=fleet.b, headers=fleet.headers,
                              timeout=HANG_GUARD) as b:
        snap_a, snap_b = await snapshot(a), await snapshot(b)
        scoped = await b.get("/v1/tools", headers={"authorization": f"Bearer {fleet.scoped}"})
        assert scoped.status_code == 200, scoped.text
        again = await a.post(f"/v1/snapshots/{snap_a}/calls", json=body(
            "stamp", f"{tag}-1", line=f"{tag}-1"))
        assert again.json()["status"] == "completed" and not again.json()["replayed"]
        replayed = await b.post(f"/v1/snapshots/{snap_b}/calls", json=body(
            "stamp", f"{tag}-1", line=f"{tag}-1"))
        assert replayed.json()["replayed"] is True, replayed.text
        assert ran(fleet).count(f"{tag}-1") == 1
        for mode in ("legacy", "2026-07-28"):
            async with mcp_client(fleet.b, fleet, mode) as client:
                result = await mcp_call(client, f"{tag}-{mode}", f"{tag}-{mode}")
                assert not result.is_error, result.content

        # an ask raised on A reaches B's event stream and list; B's reply lets A's call run
        events = stream(b)
        asked_call = asyncio.ensure_future(a.post(f"/v1/snapshots/{snap_a}/calls", json=body(
            "asked", f"{tag}-asked", line=f"{tag}-asked")))
        async with asyncio.timeout(HANG_GUARD):
            async for name, data in events:
                if name == "permission.asked" and \
                        data["ask"]["source"]["call_id"] == f"{tag}-asked":
                    ask_id = data["ask"]["id"]
                    break
        await events.aclose()  # type: ignore[attr-defined]
        pending = (await b.get("/v1/permissions")).json()["pending"]
        assert [p["id"] for p in pending] == [ask_id]
        replied = await b.post(f"/v1/permissions/{ask_id}/reply", json={"reply": "once"})
        assert replied.status_code == 200, replied.text
        async with asyncio.timeout(HANG_GUARD):
            settled = (await asked_call).json()
        assert settled["status"] == "completed", settled

        # a call running on A is cancelled through B
        gate = Path(f"{fleet.runs}.open")
        await asyncio.to_thread(gate.unlink, missing_ok=True)
        waiting = asyncio.ensure_future(a.post(f"/v1/snapshots/{snap_a}/calls",
                                               json=body("wait_open", f"{tag}-gated")))
        await running_on(b, f"{tag}-gated")
        cancelled = await b.delete(f"/v1/calls/{tag}-gated")
        assert cancelled.status_code == 202, cancelled.text
        answer = await waiting
        assert answer.status_code == 409 and answer.json()["error"]["code"] == "cancelled"


async def stream(client: httpx.AsyncClient) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    async with client.stream("GET", "/v1/events", params={"last_event_id": "0"}) as events:
        fields: dict[str, str] = {}
        async for line in events.aiter_lines():
            if line:
                key, _, value = line.partition(": ")
                fields[key] = value
            elif "event" in fields:
                yield fields["event"], json.loads(fields["data"])
                fields = {}
            else:
                fields = {}


async def running_on(client: httpx.AsyncClient, call_id: str) -> None:
    deadline = time.monotonic() + HANG_GUARD  # the claim is taken as the call starts
    while (seen := await client.get(f"/v1/calls/{call_id}")).status_code != 200 or \
            seen.json()["status"] != "running":
        assert time.monotonic() < deadline, seen.text
        await asyncio.sleep(0.05)


async def kept_until_back(fleet: Fleet, down: str) -> None:
    """A call that ran while the database went away: its outcome is not reported as
    completed, and is recorded once the database is back (the retry replays it)."""
    gate = Path(f"{fleet.runs}.open")
    await asyncio.to_thread(gate.unlink, missing_ok=True)
    async with httpx.AsyncClient(base_url=fleet.a, headers=fleet.headers,
                                 timeout=HANG_GUARD) as a, \
            httpx.AsyncClient(base_url=fleet.b, headers=fleet.headers,
                              timeout=HANG_GUARD) as b:
        snap_a, snap_b = await snapshot(a), await snapshot(b)
        call_id = f"kept-{down}"
        waiting = asyncio.ensure_future(a.post(f"/v1/snapshots/{snap_a}/calls",
                                               json=body("wait_open", call_id)))
        await running_on(a, call_id)
        server = fleet.server
        held = await asyncio.to_thread(server.freeze if down == "hung" else server.pause)
        try:
            await asyncio.to_thread(gate.touch)  # the tool ends now; its outcome is not recorded
            unavailable(fleet, await waiting, f"wait_open ran as call '{call_id}', but its "
                        "outcome could not be recorded", "retry with the same call id")
        finally:
            if held is None:
                await asyncio.to_thread(server.resume)
            else:
                await asyncio.to_thread(server.thaw, held)
        await wait_healthy(fleet)
        replayed = await b.post(f"/v1/snapshots/{snap_b}/calls",
                                json=body("wait_open", call_id))
        assert replayed.status_code == 200, replayed.text
        assert replayed.json()["status"] == "completed" and replayed.json()["replayed"], \
            replayed.text
        assert replayed.json()["content"] == [{"type": "text", "text": "open\n"}]
        # A's call history row of the run, added while the database was down, is written now
        deadline = time.monotonic() + HANG_GUARD
        while not any(row["call_id"] == call_id and not row["replayed"] for row in (
                await a.get("/v1/calls", params={"tool": "wait_open"})).json()["calls"]):
            assert time.monotonic() < deadline, "the kept history row was not written"
            await asyncio.sleep(0.1)
        # and its `call.settled` event, published on A meanwhile, reaches B's stream
        events = stream(b)
        async with asyncio.timeout(HANG_GUARD):
            async for name, data in events:
                if name == "call.settled" and data["call_id"] == call_id:
                    break
        await events.aclose()  # type: ignore[attr-defined]


def test_a_stopped_database_gets_clear_errors_and_the_fleet_recovers(fleet: Fleet) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=fleet.a, headers=fleet.headers,
                                     timeout=HANG_GUARD) as a:
            snap = await snapshot(a)
        fleet.server.pause()
        try:
            await answers_while_down(fleet, snap, "stopped")
        finally:
            fleet.server.resume()
        await serves_again(fleet, "stopped")
        await kept_until_back(fleet, "stopped")

    asyncio.run(scenario())


def test_a_hung_database_gets_clear_errors_within_the_bound_and_the_fleet_recovers(
    fleet: Fleet,
) -> None:
    async def scenario() -> None:
        async with httpx.AsyncClient(base_url=fleet.a, headers=fleet.headers,
                                     timeout=HANG_GUARD) as a:
            snap = await snapshot(a)
        held = fleet.server.freeze()
        try:
            await answers_while_down(fleet, snap, "hung")
        finally:
            fleet.server.thaw(held)
        await serves_again(fleet, "hung")
        await kept_until_back(fleet, "hung")

    asyncio.run(scenario())


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_call_history_rows_wait_for_the_database(anyio_backend: str) -> None:
    """Rows added while the database is stopped are kept and written once it is back; a
    query meanwhile fails (the route's 503) instead of waiting for the writer; closing while
    it is down does not hang."""
    from sidecar.backends.postgres.call_history import PostgresCallHistory
    from sidecar.stores.call_history import CallQuery
    from sidecar.stores.errors import database_failure
    from tests.fleet.test_postgres_stores import _row

    server = await asyncio.to_thread(PostgresServer.start)
    try:
        history = await PostgresCallHistory.open(await server.new_database())
        history.add(_row(1, time.time()))
        await history.query(CallQuery())  # written
        await asyncio.to_thread(server.pause)
        history.add(_row(2, time.time()))
        with pytest.raises(Exception) as failed:
            async with asyncio.timeout(HANG_GUARD):
                await history.query(CallQuery())
        assert database_failure(failed.value) is not None
        await asyncio.to_thread(server.resume)
        async with asyncio.timeout(HANG_GUARD):
            while len((await history.query(CallQuery()))[0]) < 2:  # noqa: ASYNC110
                await asyncio.sleep(0.1)
        assert [r.call_id for r in (await history.query(CallQuery()))[0]] == ["c2", "c1"]

        await asyncio.to_thread(server.pause)
        history.add(_row(3, time.time()))
        async with asyncio.timeout(HANG_GUARD):
            await history.aclose()  # logs the row it could not write
    finally:
        await asyncio.to_thread(server.stop)


def test_sidecar_stdio_on_a_stopped_database_answers_a_json_rpc_error(tmp_path: Path) -> None:
    """`sidecar stdio --store URL` (its on-demand daemon on the database): a call while the
    database is stopped gets -32603 naming it, and the tool does not run; once it is back the
    same call id runs."""
    import queue
    import threading

    from tests.fleet.test_replicas import MANIFEST

    runs = tmp_path / "runs.txt"
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "tools.toml").write_text(MANIFEST.replace("RUNS", str(runs)))
    server = PostgresServer.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
               SIDECAR_MANIFESTS=str(tmp_path / "manifests"), SIDECAR_DATABASE_TIMEOUT=BOUND)
    try:
        dsn = anyio.run(server.new_database)
        database = f"127.0.0.1:{server.port}/{dsn.rsplit('/', 1)[1]}"
        proc = subprocess.Popen([*SIDECAR, "stdio", "--store", dsn], env=env, text=True,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                stderr=subprocess.DEVNULL)
        assert proc.stdin is not None and proc.stdout is not None
        lines: queue.Queue[str] = queue.Queue()
        reader = threading.Thread(target=lambda: [lines.put(x) for x in proc.stdout],
                                  daemon=True)
        reader.start()

        def send(message: dict[str, Any]) -> dict[str, Any] | None:
            assert proc.stdin is not None
            proc.stdin.write(json.dumps({"jsonrpc": "2.0", **message}) + "\n")
            proc.stdin.flush()
            if "id" not in message:
                return None
            return dict(json.loads(lines.get(timeout=HANG_GUARD)))  # does not hang

        def call(call_id: str) -> dict[str, Any] | None:
            return send({"id": call_id, "method": "tools/call", "params": {
                "name": "stamp", "arguments": {"line": call_id},
                "_meta": {"io.mcp-sidecar/call_id": call_id}}})

        try:
            send({"id": 0, "method": "initialize", "params": {
                "protocolVersion": "2025-06-18", "capabilities": {},
                "clientInfo": {"name": "t", "version": "1"}}})
            send({"method": "notifications/initialized"})
            assert "result" in (call("before") or {})
            server.pause()
            try:
                failed = call("during") or {}
                assert failed["error"]["code"] == types.INTERNAL_ERROR, failed
                assert failed["error"]["message"].startswith(
                    f"the fleet database {database} is unavailable: call 'during' could not "
                    "be claimed, so stamp did not run"), failed
                listed = send({"id": "list", "method": "tools/list"}) or {}
                assert "stamp" in {t["name"] for t in listed["result"]["tools"]}
            finally:
                server.resume()
            again = call("during") or {}
            assert again["result"]["content"][0]["text"] == "during\n", again
            assert runs.read_text().splitlines() == ["before", "during"]
        finally:
            proc.stdin.close()
            proc.wait(timeout=HANG_GUARD)
            reader.join(timeout=HANG_GUARD)
            proc.stdout.close()
            subprocess.run([*SIDECAR, "stop"], env=env, capture_output=True, timeout=60,
                           check=False)  # the on-demand daemon
    finally:
        server.stop()

"""Two `sidecar serve` replicas on one PostgreSQL database behind a real HAProxy
(tests/fleet/haproxy.py): `/v1` and 2026-07-28 `/mcp` requests go to either replica and
succeed; a handshake-era MCP session stays on the replica that assigned its `Mcp-Session-Id`;
when that replica dies, a new session works through the other. Which replica answered is read
from the `Sidecar-Replica` header, never from timing."""

from __future__ import annotations

import secrets
import signal
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fleet.haproxy import HAProxy
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop

NAMES = ("replica-a", "replica-b")
CONTEXT = {"session_id": "s", "agent": "a", "message_id": "m"}


@dataclass
class Fleet:
    proxy: HAProxy
    token: str
    urls: dict[str, str]
    procs: dict[str, Any]
    runs: Path

    @property
    def headers(self) -> dict[str, str]:
        return {"authorization": f"Bearer {self.token}"}


def start_fleet(root: Path, postgres_server: PostgresServer) -> Fleet:
    import anyio

    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    runs = root / "runs.txt"
    procs: dict[str, Any] = {}
    urls: dict[str, str] = {}
    try:
        for name in NAMES:
            procs[name], urls[name] = start_replica(root / name, dsn, token, runs, name=name)
        ports = [urlsplit(urls[name]).port or 0 for name in NAMES]
        return Fleet(HAProxy.start(root, ports), token, urls, procs, runs)
    except BaseException:
        stop_fleet(procs, None)
        raise


def stop_fleet(procs: dict[str, Any], proxy: HAProxy | None) -> None:
    if proxy is not None:
        proxy.stop()
    for proc in procs.values():
        if proc.poll() is None:
            stop(proc)
        elif proc.stderr is not None:  # killed by the test
            proc.stderr.close()


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory,
          postgres_server: PostgresServer) -> Iterator[Fleet]:
    started = start_fleet(tmp_path_factory.mktemp("fleet"), postgres_server)
    try:
        yield started
    finally:
        stop_fleet(started.procs, started.proxy)


@pytest.fixture
def own_fleet(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[Fleet]:
    """A fleet of its own, for a test that kills a replica."""
    started = start_fleet(tmp_path, postgres_server)
    try:
        yield started
    finally:
        stop_fleet(started.procs, started.proxy)


@asynccontextmanager
async def mcp_client(fleet: Fleet, mode: str, seen: list[str]) -> AsyncIterator[Client]:
    """An MCP client through the proxy; `seen` gets the replica of every HTTP answer."""

    async def note(response: httpx2.Response) -> None:
        seen.append(response.headers.get("sidecar-replica", "?"))

    async with httpx2.AsyncClient(headers=fleet.headers, timeout=httpx2.Timeout(30),
                                  event_hooks={"response": [note]}) as http:
        transport = streamable_http_client(f"{fleet.proxy.url}/mcp", http_client=http)
        async with Client(transport, mode=mode, cache=None,  # type: ignore[arg-type]
                          read_timeout_seconds=30) as client:
            yield client


async def stamp(client: Client, line: str) -> types.CallToolResult:
    params = types.CallToolRequestParams(name="stamp", arguments={"line": line})
    return await client.session.send_request(types.CallToolRequest(params=params),
                                             types.CallToolResult)


def test_v1_requests_are_spread_and_snapshots_work_on_either_replica(fleet: Fleet) -> None:
    with httpx.Client(base_url=fleet.proxy.url, headers=fleet.headers, timeout=30) as http:
        health = [http.get("/v1/health") for _ in range(4)]
        assert {r.json()["replica"] for r in health} == set(NAMES)
        assert all(r.headers["sidecar-replica"] == r.json()["replica"] for r in health)
        made = http.post("/v1/snapshots", json={"session_id": "s", "strict": True})
        assert made.status_code == 201, made.text
        answered = []
        for i in range(6):
            call = http.post(f"/v1/snapshots/{made.json()['id']}/calls", json={
                "name": "stamp", "input": {"line": f"v1-{i}"},
                "context": {**CONTEXT, "call_id": f"lb-{i}"}})
            assert call.status_code == 200, call.text
            assert call.json()["status"] == "completed", call.text
            answered.append(call.headers["sidecar-replica"])
        # the snapshot was made on one replica and used on both
        assert set(answered) == set(NAMES)
        for i in range(6):  # and any replica reads any settled call
            got = http.get(f"/v1/calls/lb-{i}")
            assert got.status_code == 200 and got.json()["status"] == "completed"


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])
async def test_a_handshake_era_session_stays_on_one_replica(fleet: Fleet) -> None:
    seen: list[str] = []
    async with mcp_client(fleet, "legacy", seen) as client:
        assert client.protocol_version != "2026-07-28"
        listed = {t.name for t in (await client.list_tools()).tools}
        assert "stamp" in listed
        for i in range(8):
            result = await stamp(client, f"pinned-{i}")
            assert not result.is_error, result.content
            assert result.content[0].text.strip() == f"pinned-{i}"  # type: ignore[union-attr]
    assert len(seen) >= 10 and len(set(seen)) == 1 and seen[0] in NAMES, seen


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])
async def test_2026_requests_are_stateless_and_spread(fleet: Fleet) -> None:
    seen: list[str] = []
    async with mcp_client(fleet, "2026-07-28", seen) as client:
        assert client.protocol_version == "2026-07-28"
        assert "stamp" in {t.name for t in (await client.list_tools()).tools}
        for i in range(6):
            result = await stamp(client, f"spread-{i}")
            assert not result.is_error, result.content
            assert result.content[0].text.strip() == f"spread-{i}"  # type: ignore[union-attr]
    assert set(seen) == set(NAMES), seen


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])
async def test_after_the_pinned_replica_dies_a_new_session_works_on_the_other(
    own_fleet: Fleet,
) -> None:
    first: list[str] = []
    async with mcp_client(own_fleet, "legacy", first) as client:
        assert not (await stamp(client, "before")).is_error
    pinned = first[0]
    assert set(first) == {pinned}
    own_fleet.procs[pinned].send_signal(signal.SIGKILL)
    own_fleet.procs[pinned].wait(timeout=10)
    survivor = next(n for n in NAMES if n != pinned)
    second: list[str] = []
    async with mcp_client(own_fleet, "legacy", second) as client:
        for i in range(3):
            result = await stamp(client, f"after-{i}")
            assert not result.is_error, result.content
    assert set(second) == {survivor}, second

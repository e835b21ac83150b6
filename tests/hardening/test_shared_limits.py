"""Issue 26 item 6: one client must not exhaust a limit shared with the others. A client
creating 1,025 snapshots expires its own, not another session's; a store filling up under one
client's outputs shows `pressure: "high"` in health."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import httpx

from tests.hardening.conftest import SIDECAR, TEXT_TOOL, Daemon, start_daemon, stop_daemon


def _snapshot(client: httpx.Client, session: str) -> str:
    response = client.post("/v1/snapshots", json={"session_id": session})
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def _call(client: httpx.Client, snapshot: str, session: str, call_id: str) -> httpx.Response:
    return client.post(f"/v1/snapshots/{snapshot}/calls", json={
        "name": "text", "input": {"line": "x", "count": 1},
        "context": {"session_id": session, "agent": "a", "message_id": "m",
                    "call_id": call_id}})


def test_a_snapshot_flood_expires_only_the_flooding_session(daemon: Daemon) -> None:
    with daemon.client() as client:
        victim = _snapshot(client, "victim")
        flood = [_snapshot(client, "flood") for _ in range(1025)]
        kept = _call(client, victim, "victim", "victim-call")
        assert kept.status_code == 200 and kept.json()["status"] == "completed", kept.text
        gone = _call(client, flood[0], "flood", "flood-first")
        assert gone.status_code == 404
        assert gone.json()["error"]["code"] == "snapshot_expired"
        assert "per session" in gone.json()["error"]["message"]
        assert _call(client, flood[-1], "flood", "flood-last").status_code == 200
        assert _call(client, flood[-128], "flood", "flood-128").status_code == 200
        assert _call(client, flood[-129], "flood", "flood-129").status_code == 404
    daemon.health()


def test_health_reports_eviction_pressure(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, env={"SIDECAR_STORE_QUOTA": "300K"},
                          manifests={"text.toml": TEXT_TOOL})
    try:
        calm = daemon.health()["store"]
        assert calm["pressure"] == "normal" and calm["quota_bytes"] == 300 * 1024
        assert calm["evicted_for_quota"] == 0
        refs = []
        for index in range(4):  # 4 x ~120 KB retained in a 300 KiB store
            outcome = daemon.call("text", {"line": "y" * 59, "count": 2000}, f"big-{index}")
            assert outcome["status"] == "completed", outcome
            refs.append(outcome["managed"][0]["ref"])
        store = daemon.health()["store"]
        assert store["pressure"] == "high", store
        assert store["evicted_for_quota"] >= 1
        with daemon.client() as client:
            assert client.get(f"/v1/managed/{refs[0]}").status_code == 404  # evicted
            assert client.get(f"/v1/managed/{refs[-1]}").status_code == 200
    finally:
        stop_daemon(daemon)


def _retained(daemon: Daemon, client: httpx.Client, snapshot: str, session: str,
              call_id: str, count: int = 2000) -> httpx.Response:
    """A call whose output (~60 bytes a line) is retained in the managed store."""
    return client.post(f"/v1/snapshots/{snapshot}/calls", json={
        "name": "text", "input": {"line": "z" * 59, "count": count},
        "context": {"session_id": session, "agent": "a", "message_id": "m",
                    "call_id": call_id}})


def _ref(response: httpx.Response) -> str:
    assert response.status_code == 200, response.text
    outcome = response.json()
    assert outcome["status"] == "completed", outcome
    return str(outcome["managed"][0]["ref"])


def test_a_client_flooding_the_store_evicts_its_own_refs_not_the_others(
    tmp_path: Path,
) -> None:
    """Issue 26 item 6: with a 600 KiB quota (so half of it, 300 KiB, per client), client B
    storing eight 120 KB outputs evicts its own oldest, never client A's; an output over a
    client's share alone is refused with a clear error, and health shows the pressure."""
    daemon = start_daemon(tmp_path, env={"SIDECAR_STORE_QUOTA": "600K"},
                          manifests={"text.toml": TEXT_TOOL})
    try:
        with daemon.client() as client:
            a = _snapshot(client, "client-a")
            kept = _ref(_retained(daemon, client, a, "client-a", "a-1"))
            b = _snapshot(client, "client-b")
            flood = [_ref(_retained(daemon, client, b, "client-b", f"b-{n}")) for n in range(8)]
            assert client.get(f"/v1/managed/{kept}").status_code == 200
            alive = [client.get(f"/v1/managed/{ref}").status_code for ref in flood]
            assert alive == [404] * 6 + [200] * 2, alive  # 2 x 120 KB fit in 300 KiB
            too_big = _retained(daemon, client, b, "client-b", "b-big", count=5300)
            assert too_big.status_code == 200, too_big.text
            refused = too_big.json()
            assert refused["status"] == "error", refused
            assert refused["error"]["kind"] == "tool_failure", refused
            assert ("is over the per-owner share of the store quota (307,200 bytes: 50% of "
                    "614,400)") in refused["error"]["message"], refused
            assert client.get(f"/v1/managed/{kept}").status_code == 200
        store = daemon.health()["store"]
        assert store["pressure"] == "high" and store["evicted_for_quota"] == 6, store
        assert daemon.proc.poll() is None
    finally:
        stop_daemon(daemon)


def test_a_scoped_token_is_one_client_whatever_sessions_it_names(tmp_path: Path) -> None:
    """A client with a scoped token that invents a new session for every snapshot and every
    call still counts as one: its snapshots past 512 expire its own oldest, and its outputs
    evict its own oldest refs; the all-access client's snapshot and ref survive."""
    daemon = start_daemon(tmp_path, env={"SIDECAR_STORE_QUOTA": "600K"},
                          manifests={"text.toml": TEXT_TOOL})
    try:
        made = subprocess.run(
            [*SIDECAR, "token", "create", "--profile", "default", "--state-dir",
             str(daemon.state)], capture_output=True, text=True, timeout=60,
            env={**os.environ, "SIDECAR_URL": daemon.url, "SIDECAR_TOKEN": daemon.token})
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip()
        with daemon.client() as client, httpx.Client(
            base_url=daemon.url, timeout=30, headers={"authorization": f"Bearer {secret}"}
        ) as scoped:
            victim = _snapshot(client, "victim")
            kept = _ref(_retained(daemon, client, victim, "victim", "victim-1"))
            flood = [_snapshot(scoped, f"flood-{n}") for n in range(513)]
            gone = _call(scoped, flood[0], "flood-0", "first")
            assert gone.status_code == 404, gone.text
            assert "512 per scoped token" in gone.json()["error"]["message"]
            assert _call(scoped, flood[1], "flood-1", "second").status_code == 200
            assert _call(client, victim, "victim", "victim-2").status_code == 200
            refs = [_ref(_retained(daemon, scoped, flood[-1], f"out-{n}", f"out-{n}"))
                    for n in range(5)]
            alive = [client.get(f"/v1/managed/{ref}").status_code for ref in refs]
            assert alive == [404] * 3 + [200] * 2, alive
            assert client.get(f"/v1/managed/{kept}").status_code == 200
    finally:
        stop_daemon(daemon)


MCP_HEADERS = {"content-type": "application/json",
               "accept": "application/json, text/event-stream"}


def _mcp_retained(scoped: httpx.Client, call_id: str) -> str:
    """A new /mcp session of `scoped` (handshake era) and one call in it whose output is
    retained in the managed store; its managed ref."""
    init = scoped.post("/mcp", headers=MCP_HEADERS, json={
        "jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "flood", "version": "1"}}})
    assert init.status_code == 200, init.text
    session = {**MCP_HEADERS, "mcp-session-id": init.headers["mcp-session-id"]}
    scoped.post("/mcp", headers=session,
                json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    called = scoped.post("/mcp", headers=session, json={
        "jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
            "name": "text", "arguments": {"line": "z" * 59, "count": 2000},
            "_meta": {"io.mcp-sidecar/call_id": call_id}}})
    assert called.status_code == 200, called.text
    found = re.search(r"\b(m_[0-9a-z]{26})\b", called.text)
    assert found is not None, called.text[:2000]
    return found.group(1)


def test_a_scoped_token_is_one_client_whatever_mcp_sessions_it_opens(tmp_path: Path) -> None:
    """Over /mcp too, the store's per-client share counts the scoped token, not each MCP
    session it opens: its outputs across five sessions evict its own oldest refs, and the
    all-access client's ref survives."""
    daemon = start_daemon(tmp_path, env={"SIDECAR_STORE_QUOTA": "600K"},
                          manifests={"text.toml": TEXT_TOOL})
    try:
        made = subprocess.run(
            [*SIDECAR, "token", "create", "--profile", "default", "--state-dir",
             str(daemon.state)], capture_output=True, text=True, timeout=60,
            env={**os.environ, "SIDECAR_URL": daemon.url, "SIDECAR_TOKEN": daemon.token})
        assert made.returncode == 0, made.stderr
        with daemon.client() as client, httpx.Client(
            base_url=daemon.url, timeout=30,
            headers={"authorization": f"Bearer {made.stdout.strip()}"},
        ) as scoped:
            victim = _snapshot(client, "victim")
            kept = _ref(_retained(daemon, client, victim, "victim", "victim-1"))
            refs = [_mcp_retained(scoped, f"mcp-out-{n}") for n in range(5)]
            alive = [client.get(f"/v1/managed/{ref}").status_code for ref in refs]
            assert alive == [404] * 3 + [200] * 2, alive
            assert client.get(f"/v1/managed/{kept}").status_code == 200
        assert daemon.proc.poll() is None
    finally:
        stop_daemon(daemon)

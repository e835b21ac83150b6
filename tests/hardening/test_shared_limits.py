"""Issue 26 item 6: one client must not exhaust a limit shared with the others. A client
creating 1,025 snapshots expires its own, not another session's; a store filling up under one
client's outputs shows `pressure: "high"` in health."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.hardening.conftest import TEXT_TOOL, Daemon, start_daemon, stop_daemon


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

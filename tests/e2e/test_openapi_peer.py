"""A daemon's own native API as OpenAPI tools of another daemon: the first `sidecar serve`
reads the second's `/v1/openapi.json` (OpenAPI 3.1, no operationIds) and calls its operations
with the second's token, read through a `${file:}` header."""

from __future__ import annotations

import json
from pathlib import Path

import httpx

from tests.hardening.daemon_process import serving, sidecar_env


def test_one_daemon_calls_another_through_its_openapi_document(tmp_path: Path) -> None:
    with serving(tmp_path / "peer", env=sidecar_env(tmp_path / "peer")) as peer:
        manifests = tmp_path / "manifests"
        manifests.mkdir()
        (manifests / "peer.toml").write_text(f"""
[openapi.peer]
spec = "{peer.url}/v1/openapi.json"
base_url = "{peer.url}"
headers = {{ Authorization = "Bearer ${{file:{peer.state / 'token'}}}" }}

[openapi.peer.operations]
allow = ["GET /v1/*"]
deny = ["GET /v1/events", "GET /v1/auth/*"]
""")
        with serving(tmp_path / "main", manifests=manifests) as main:
            headers = {"authorization": f"Bearer {main.token}"}
            with httpx.Client(base_url=main.url, headers=headers, timeout=30) as client:
                health = client.get("/v1/health").json()
                assert not [p for p in health["manifest_problems"]
                            if p["severity"] == "error"], health["manifest_problems"]
                snapshot = client.post("/v1/snapshots", json={"session_id": "s"}).json()
                names = {d["name"] for d in snapshot["definitions"]}
                peer_tools = sorted(n for n in names if n.startswith("peer_"))
                assert "peer_get_v1_health" in peer_tools
                assert "peer_get_v1_calls_call_id" in peer_tools
                assert "peer_get_v1_openapi_json" in peer_tools
                assert not [n for n in peer_tools if n.startswith(("peer_post", "peer_delete"))]
                assert "peer_get_v1_events" not in peer_tools

                def call(name: str, arguments: dict, call_id: str) -> dict:
                    answer = client.post(f"/v1/snapshots/{snapshot['id']}/calls", json={
                        "name": name, "input": arguments,
                        "context": {"session_id": "s", "agent": "a", "message_id": "m",
                                    "call_id": call_id}})
                    assert answer.status_code == 200, answer.text
                    return answer.json()

                outcome = call("peer_get_v1_health", {"probe": "liveness"}, "c1")
                assert outcome["status"] == "completed", outcome
                report = json.loads(outcome["content"][0]["text"])
                assert report["status"] == "ok"  # the peer's own health, with its token

                tools = call("peer_get_v1_tools", {"format": "openai"}, "c2")
                assert tools["status"] == "completed", tools
                assert "managed_read" in tools["content"][0]["text"]

                missing = call("peer_get_v1_calls_call_id", {"call_id": "nope"}, "c3")
                assert missing["status"] == "error"
                assert "HTTP 404" in missing["error"]["message"]
                assert peer.token not in json.dumps(missing)

                wrong = call("peer_get_v1_tools", {"format": "yaml"}, "c4")
                assert wrong["error"]["kind"] == "invalid_input"  # the peer's enum, here

"""Issue 26 item 2: JSON nested 1,000 deep (and just past the limit) on every input of a real
daemon: `/v1` bodies and string inputs, `/mcp` POST bodies, `sidecar stdio` lines."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sidecar.model.json_depth import MAX_JSON_DEPTH
from tests.hardening.conftest import SIDECAR, Daemon, start_daemon, stop_daemon

MCP_HEADERS = {"content-type": "application/json",
               "accept": "application/json, text/event-stream"}


def nested(depth: int) -> str:
    return "[" * depth + "]" * depth


def test_v1_answers_deep_json_with_a_400_and_keeps_serving(daemon: Daemon) -> None:
    with daemon.client() as client:
        for depth in (1000, 100_000, MAX_JSON_DEPTH + 1):
            response = client.post("/v1/snapshots", content=nested(depth))
            assert response.status_code == 400, response.text
            error = response.json()["error"]
            assert error["code"] == "malformed_json"
            assert f"more than {MAX_JSON_DEPTH} levels" in error["message"]
        snap = client.post("/v1/snapshots", json={"session_id": "s"}).json()
        deep_input = '{"ref": ' + nested(1000) + "}"
        call = client.post(f"/v1/snapshots/{snap['id']}/calls", json={
            "name": "managed_read", "input": deep_input,
            "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": "deep"},
        })
        assert call.status_code == 200, call.text
        assert call.json()["error"]["kind"] == "invalid_input"
        assert "levels deep" in call.json()["error"]["message"]
        # At the limit, a body is still an ordinary request.
        at_limit = {"session_id": "s", "allow": json.loads(nested(MAX_JSON_DEPTH - 1))}
        assert client.post("/v1/snapshots", json=at_limit).status_code == 422  # wrong type
    daemon.health()


@pytest.mark.parametrize("path", ["/mcp", "/mcp/default"])
def test_mcp_answers_deep_json_with_a_jsonrpc_parse_error(daemon: Daemon, path: str) -> None:
    """Issue 38 item 8: `/mcp/NAME` accepted 70-100 levels; the limit is the same on every
    MCP endpoint."""
    with daemon.client() as client:
        for depth in (1000, 100, 70, MAX_JSON_DEPTH + 1):
            body = ('{"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": '
                    + nested(depth) + "}")
            response = client.post(path, content=body, headers=MCP_HEADERS)
            assert response.status_code == 400, response.text
            answer = response.json()
            assert answer["id"] is None and answer["error"]["code"] == -32700
            assert "levels deep" in answer["error"]["message"]
        init = client.post(path, headers=MCP_HEADERS, json=_initialize(1))
        assert init.status_code == 200
        session = {**MCP_HEADERS, "mcp-session-id": init.headers["mcp-session-id"]}
        client.post(path, headers=session,
                    json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        deep_call = ('{"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": '
                     '{"name": "managed_read", "arguments": {"ref": ' + nested(1000) + "}}}")
        refused = client.post(path, content=deep_call, headers=session)
        assert refused.status_code == 400 and refused.json()["error"]["code"] == -32700
        listed = client.post(path, headers=session,
                             json={"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
        assert listed.status_code == 200 and "managed_read" in listed.text
    daemon.health()


def _initialize(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": {
        "protocolVersion": "2025-06-18", "capabilities": {},
        "clientInfo": {"name": "attack", "version": "1"}}}


def test_stdio_answers_deep_and_malformed_lines_and_lives_on(tmp_path: Path) -> None:
    env = {**os.environ, "SIDECAR_STATE_DIR": str(tmp_path / "state"),
           "SIDECAR_MANIFESTS": ""}
    proc = subprocess.Popen([*SIDECAR, "stdio"], env=env, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdin is not None and proc.stdout is not None

    def send(line: bytes | dict[str, Any]) -> None:
        assert proc.stdin is not None
        data = line if isinstance(line, bytes) else json.dumps(line).encode()
        proc.stdin.write(data + b"\n")
        proc.stdin.flush()

    def answer() -> dict[str, Any]:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line, "sidecar stdio closed its stdout"
        value: dict[str, Any] = json.loads(line)
        return value

    try:
        send(_initialize(1))
        assert answer()["id"] == 1
        send({"jsonrpc": "2.0", "method": "notifications/initialized"})
        send(b'{"jsonrpc": "2.0", "id": 2, "method": "tools/list", "params": '
             + nested(1000).encode() + b"}")  # 2,000 bytes, 1,000 deep
        deep = answer()
        assert deep["id"] is None and deep["error"]["code"] == -32700
        assert "levels deep" in deep["error"]["message"]
        send(b"{not json")
        assert answer()["error"]["code"] == -32700
        send({"jsonrpc": "2.0", "id": 3, "method": 5})
        invalid = answer()
        assert invalid["id"] == 3 and invalid["error"]["code"] == -32600
        send({"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
        listed = answer()
        assert listed["id"] == 4 and listed["result"]["tools"]
    finally:
        proc.stdin.close()
        assert proc.wait(timeout=30) == 0
        proc.stdout.close()


FLOOD_SERVER = Path(__file__).parent / "servers" / "flood_server.py"


def test_an_upstream_answering_with_deep_json_fails_that_call_only(tmp_path: Path) -> None:
    manifest = {"mcpServers": {"deep": {"command": sys.executable, "args": [str(FLOOD_SERVER)]}}}
    daemon = start_daemon(tmp_path, manifests={"deep.json": json.dumps(manifest)})
    try:
        for _ in range(100):
            if daemon.health(timeout=30)["servers"].get("deep", {}).get("state") == "ready":
                break
        for index, depth in enumerate((1000, 100_000)):
            outcome = daemon.call("deep_deep", {"depth": depth}, f"deep-{index}")
            assert outcome["error"]["kind"] == "upstream", outcome
            # 1,000 levels are past what `json.loads` follows on Python 3.11 only (3.12 and
            # 3.13 parse them, and the answer is then refused as not a valid result); 100,000
            # are past it on every supported version.
            if depth > 20_000 or sys.version_info < (3, 12):
                assert "nested too deeply" in outcome["error"]["message"]
            else:
                assert "not a valid tools/call result" in outcome["error"]["message"]
        again = daemon.call("deep_flood", {"lines": 1}, "after")
        assert again["status"] == "completed", again  # the same connection serves on
        assert daemon.health()["servers"]["deep"]["restarts"] == 0
    finally:
        stop_daemon(daemon)

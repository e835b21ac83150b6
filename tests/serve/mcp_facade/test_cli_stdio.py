"""`sidecar stdio` as an agent launches it: the Python MCP client over real pipes, both eras."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp import Client, StdioServerParameters, types

from tests.daemons import stop_daemon

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parents[3]


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_sidecar_stdio_lists_and_calls_tools(tmp_path, mode):
    params = StdioServerParameters(
        command=sys.executable, args=["-m", "sidecar.cli", "stdio"], cwd=str(ROOT),
        env={"SIDECAR_STATE_DIR": str(tmp_path / "state"),
             "SIDECAR_MANIFESTS": str(ROOT / "manifests")},
    )
    try:
        await _lists_and_calls(params, mode)
    finally:
        stop_daemon(tmp_path / "state")


async def _lists_and_calls(params: StdioServerParameters, mode: str) -> None:
    async with Client(params, mode=mode, cache=None, read_timeout_seconds=60) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "utc_now" in names and "managed_read" in names
        result = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(name="utc_now",
                                                                     arguments={})),
            types.CallToolResult,
        )
        assert not result.is_error
        assert result.content[0].text.startswith("20")
        bad = await client.session.send_request(
            types.CallToolRequest(params=types.CallToolRequestParams(
                name="managed_read", arguments={"ref": 5})),
            types.CallToolResult,
        )
        assert bad.is_error and "$.ref" in bad.content[0].text


def test_sidecar_stdio_standalone_adopts_the_upstream_it_spawned_before_its_imports(tmp_path):
    """`sidecar stdio --standalone` (the daemon in the client's own process): the MCP server
    a manifest names is spawned before the daemon imports the SDK and is the process the pool
    then talks to (bridges.prestart), over the CLI's real pipes."""
    server = ROOT / "tests" / "bridges" / "servers" / "testserver.py"
    (tmp_path / "up.json").write_text(json.dumps(
        {"mcpServers": {"up": {"command": sys.executable, "args": [str(server)]}}}))
    requests = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-11-25", "capabilities": {},
            "clientInfo": {"name": "test", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
         "params": {"name": "up_echo", "arguments": {"text": "adopted"}}},
    ]
    # stdin stays open until the call is answered: the server's start under a loaded machine
    # may take longer than the grace the requests of a closed stdin get (EOF_GRACE)
    log = tmp_path / "stderr"
    with log.open("w") as errors:
        client = subprocess.Popen(
            [sys.executable, "-m", "sidecar.cli", "stdio", "--standalone", "--manifests",
             str(tmp_path), "--state-dir", str(tmp_path / "state")],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, text=True, cwd=ROOT,
            env={**os.environ, "SIDECAR_LOG_LEVEL": "DEBUG"})
    assert client.stdin is not None and client.stdout is not None
    watchdog = threading.Timer(60, client.kill)  # a client that never answers fails, not hangs
    watchdog.start()
    try:
        client.stdin.write("".join(json.dumps(r) + "\n" for r in requests))
        client.stdin.flush()
        answers: dict[int, Any] = {}
        for line in client.stdout:
            message = json.loads(line)
            answers[message.get("id")] = message
            if 2 in answers:
                break
        client.stdin.close()
        stdout = client.stdout.read()
        client.wait(timeout=60)
    finally:
        watchdog.cancel()
        client.stdout.close()
    stderr = log.read_text()
    assert 2 in answers, (stdout, stderr[-3000:])
    assert answers[2]["result"]["content"][0]["text"] == "adopted", stderr[-2000:]
    assert "[up] adopted the server started before the daemon's imports" in stderr

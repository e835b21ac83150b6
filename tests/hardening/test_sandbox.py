"""Issue 42: a real `sidecar serve` with `sandbox_default = true`, a sandboxed stdio server and
a sandboxed command: neither reads the daemon's token (even with its state directory's parent
listed in `read`) nor reaches the daemon's own port; health and `sidecar health` show the
sandbox."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.hardening.conftest import SIDECAR, start_daemon, stop_daemon

PROBE = Path(__file__).parents[1] / "bridges" / "servers" / "probe_server.py"
SCRIPT = 'cat \\"$1\\"; echo cat=$?; curl -s -m 5 http://127.0.0.1:$2/v1/health; echo curl=$?'


def _manifest(tmp_path: Path) -> str:
    listed = json.dumps([str(PROBE.parent), str(tmp_path)])  # the state dir's parent
    return f'''
sandbox_default = true

[mcpServers.probe]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(PROBE))}]
protocol = "legacy"
sandbox = {{ read = {listed} }}

[tools.peek]
kind = "command"
description = "reads a file and the daemon's port"
argv = ["/bin/sh", "-c", "{SCRIPT}", "sh", "{{path}}", "{{port}}"]

[tools.peek.input]
type = "object"
properties = {{ path = {{ type = "string" }}, port = {{ type = "string" }} }}
required = ["path", "port"]

[tools.peek.sandbox]
read = {listed}
'''


def _call(client: Any, snapshot: str, name: str, args: dict[str, Any], call_id: str) -> str:
    answer = client.post(f"/v1/snapshots/{snapshot}/calls", json={
        "name": name, "input": args,
        "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    assert answer.status_code == 200, answer.text
    outcome = answer.json()
    assert outcome["status"] == "completed", outcome
    return "\n".join(item.get("text", "") for item in outcome["content"])


def test_sandboxed_entries_cannot_reach_the_daemon(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, manifests={"m.toml": _manifest(tmp_path)})
    token_file = str(daemon.state / "token")
    port = daemon.url.rsplit(":", 1)[1].split("/")[0]
    try:
        deadline = time.monotonic() + 60  # servers start in the background
        while (probe := daemon.health()["servers"]["probe"])["state"] == "starting":
            assert time.monotonic() < deadline, probe
            time.sleep(0.05)
        assert probe["state"] == "ready", probe
        assert probe["sandbox"]["network"] == "none"
        with daemon.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": "s"})
            assert snap.status_code == 201, snap.text
            snapshot = snap.json()["id"]
            read = _call(client, snapshot, "probe_probe",
                         {"action": "read", "target": token_file}, "c1")
            assert read.startswith("error: FileNotFoundError"), read
            reach = _call(client, snapshot, "probe_probe",
                          {"action": "connect", "target": f"127.0.0.1:{port}"}, "c2")
            assert reach.startswith("error:"), reach
            peek = _call(client, snapshot, "peek", {"path": token_file, "port": port}, "c3")
        assert daemon.token not in peek
        assert "cat=1" in peek and "curl=7" in peek, peek
        shown = subprocess.run(
            [*SIDECAR, "health", "--url", daemon.url], capture_output=True, text=True,
            timeout=60, check=False,
            env={"SIDECAR_TOKEN": daemon.token, "PATH": "/usr/bin:/bin"})
        assert "probe: ready" in shown.stdout and "sandboxed (network none)" in shown.stdout, (
            shown.stdout + shown.stderr)
    finally:
        stop_daemon(daemon)

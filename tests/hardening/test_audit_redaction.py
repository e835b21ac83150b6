"""Issue 38 item 5: an input sent as JSON text (the OpenAI `arguments` form) with secrets under
keys spelled every way (`X-Api-Key` nested, `private-key`, `privateKey`, `auth`, `bearer`,
`pwd`, `pass`) is stored masked: nothing of them in `GET /v1/calls`, in `sidecar calls` or in
the bytes of the history's SQLite files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.hardening.conftest import SIDECAR, start_daemon, stop_daemon

TOOL = f'''
[tools.connect]
kind = "command"
description = "takes connection settings"
argv = [{json.dumps(sys.executable)}, "-c", "print('connected')"]

[tools.connect.input]
type = "object"
'''

SECRETS = {
    "api-key": "SECRET-api-dash-1111", "x-api-key": "SECRET-x-api-2222",
    "private-key": "SECRET-private-dash-3333", "privateKey": "SECRET-private-camel-4444",
    "auth": "SECRET-auth-5555", "bearer": "SECRET-bearer-6666", "pwd": "SECRET-pwd-7777",
    "pass": "SECRET-pass-8888",
}
NESTED = "SECRET-nested-X-Api-Key-9999"
INNER = "SECRET-inner-text-0000"


def _input() -> str:
    value = {
        "host": "db.example", **SECRETS,
        "request": {"headers": {"X-Api-Key": NESTED, "Accept": "application/json"}},
        "body": json.dumps({"client": {"Api_Key": INNER}}),  # JSON text inside a value too
    }
    return json.dumps(value)


def test_a_json_text_input_is_stored_without_its_secrets(tmp_path: Path) -> None:
    daemon = start_daemon(tmp_path, manifests={"tools.toml": TOOL})
    secrets = [*SECRETS.values(), NESTED, INNER]
    try:
        with daemon.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": "s"})
            assert snap.status_code == 201, snap.text
            answer = client.post(f"/v1/snapshots/{snap.json()['id']}/calls", json={
                "name": "connect", "input": _input(),
                "context": {"session_id": "s", "agent": "a", "message_id": "m",
                            "call_id": "call-secrets"},
            })
            assert answer.status_code == 200, answer.text
            assert answer.json()["status"] == "completed", answer.text
            listed = client.get("/v1/calls", params={"tool": "connect"})
        assert listed.status_code == 200, listed.text
        [row] = listed.json()["calls"]
        stored = row["input"]
        assert stored["host"] == "db.example" and stored["request"]["headers"] == {
            "X-Api-Key": "***", "Accept": "application/json"}
        assert all(stored[key] == "***" for key in SECRETS), stored
        assert json.loads(stored["body"]) == {"client": {"Api_Key": "***"}}
        assert not any(s in listed.text for s in secrets), listed.text

        env = {**os.environ, "SIDECAR_STATE_DIR": str(daemon.state),
               "SIDECAR_MANIFESTS": str(daemon.manifests)}
        for shown in (["calls"], ["calls", "--json"], ["calls", "--jsonl"]):
            cli = subprocess.run([*SIDECAR, *shown], env=env, capture_output=True, text=True,
                                 timeout=60, check=False)
            assert cli.returncode == 0, cli.stderr
            assert "connect" in cli.stdout
            assert not any(s in cli.stdout + cli.stderr for s in secrets), cli.stdout
    finally:
        stop_daemon(daemon)
    files = sorted(daemon.state.glob("history.sqlite*"))
    assert files, list(daemon.state.iterdir())
    for path in files:
        data = path.read_bytes()
        assert not any(s.encode() in data for s in secrets), path
    assert b"db.example" in b"".join(p.read_bytes() for p in files)  # the row is there

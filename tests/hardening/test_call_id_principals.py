"""Call ids across tokens and profiles, and held definitions through older snapshots, against
a real `sidecar serve` and a real MCP server: a call id is replayed or joined only for the
same principal, tool and input; admission comes before any replay or join."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.bridges.helpers import TESTSERVER
from tests.hardening.conftest import SIDECAR, Daemon, start_daemon, stop_daemon

MANIFEST = """
[mcpServers.srv]
command = {python}
args = [{server}, "--descriptions", {descriptions}]
pin = "hold"

[profiles.coding]
include = ["srv_echo"]

[profiles.ops]
include = ["srv_slow", "srv_add"]
"""


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[Daemon, Path]]:
    descriptions = tmp_path / "descriptions.json"
    manifest = MANIFEST.format(python=json.dumps(sys.executable),
                               server=json.dumps(str(TESTSERVER)),
                               descriptions=json.dumps(str(descriptions)))
    daemon = start_daemon(tmp_path, manifests={"srv.toml": manifest})
    try:
        with daemon.client() as client:
            deadline = time.monotonic() + 60
            while "srv_echo" not in {t["name"] for t in client.get("/v1/tools").json()["tools"]}:
                assert time.monotonic() < deadline, daemon.log()
                time.sleep(0.1)
        yield daemon, descriptions
    finally:
        stop_daemon(daemon)


def scoped_token(daemon: Daemon, profile: str) -> httpx.Client:
    made = subprocess.run(
        [*SIDECAR, "token", "create", "--profile", profile, "--state-dir", str(daemon.state)],
        capture_output=True, text=True, timeout=60,
        env={**os.environ, "SIDECAR_URL": daemon.url, "SIDECAR_TOKEN": daemon.token})
    assert made.returncode == 0, made.stderr
    return httpx.Client(base_url=daemon.url, timeout=60,
                        headers={"authorization": f"Bearer {made.stdout.strip()}"})


def snapshot(client: httpx.Client, profile: str | None = None) -> str:
    body: dict[str, Any] = {"session_id": "s"}
    if profile is not None:
        body["profile"] = profile
    made = client.post("/v1/snapshots", json=body)
    assert made.status_code == 201, made.text
    snapshot_id: str = made.json()["id"]
    return snapshot_id


def call(client: httpx.Client, snap: str, name: str, args: dict[str, Any],
         call_id: str) -> httpx.Response:
    return client.post(f"/v1/snapshots/{snap}/calls", json={
        "name": name, "input": args,
        "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id},
    })


def test_a_settled_call_id_of_another_profile_replays_nothing(
    served: tuple[Daemon, Path],
) -> None:
    """(a) The `coding` token sends the `ops` call's id, tool, session, agent and input: the
    tool is outside its profile, so it is refused as for a fresh id; nothing is replayed, and
    the id still shows the `ops` outcome."""
    daemon, _ = served
    with scoped_token(daemon, "ops") as ops, scoped_token(daemon, "coding") as coding:
        done = call(ops, snapshot(ops, "ops"), "srv_add", {"a": 2, "b": 3}, "shared-1")
        assert done.status_code == 200 and done.json()["status"] == "completed", done.text
        crossed = call(coding, snapshot(coding, "coding"), "srv_add", {"a": 2, "b": 3},
                       "shared-1")
        assert crossed.status_code == 200, crossed.text
        answer = crossed.json()
        assert answer["replayed"] is False
        assert answer["error"]["kind"] == "unknown_tool", answer
        assert "5" not in json.dumps(answer.get("content", []))
        # the same call from the coding profile's own tool under that id: a conflict
        echo = call(coding, snapshot(coding, "coding"), "srv_echo", {"text": "x"}, "shared-1")
        assert echo.json()["error"]["kind"] == "conflict", echo.text
        # and the all-access token, same tool and input but another principal: a conflict
        with daemon.client() as admin:
            again = call(admin, snapshot(admin, "ops"), "srv_add", {"a": 2, "b": 3}, "shared-1")
            assert again.json()["error"]["kind"] == "conflict", again.text
            shown = admin.get("/v1/calls/shared-1")
            assert shown.status_code == 200, shown.text
            assert shown.json()["status"] == "completed" and shown.json()["tool"] == "srv_add"
        # the ops token's own retry still replays its outcome
        retry = call(ops, snapshot(ops, "ops"), "srv_add", {"a": 2, "b": 3}, "shared-1")
        assert retry.json()["replayed"] is True and retry.json()["status"] == "completed"


def test_a_running_call_id_is_never_joined_by_another_call(served: tuple[Daemon, Path]) -> None:
    """(b) While the `ops` call runs, a `coding` call under its id with another tool gets
    `conflict` at once (not the `ops` result); the `ops` call settles as its own, and
    `GET /v1/calls/{id}` shows its outcome, also after further conflicting calls."""
    daemon, _ = served
    with scoped_token(daemon, "ops") as ops, scoped_token(daemon, "coding") as coding:
        ops_snap, coding_snap = snapshot(ops, "ops"), snapshot(coding, "coding")
        answers: dict[str, httpx.Response] = {}
        runner = threading.Thread(target=lambda: answers.__setitem__(
            "ops", call(ops, ops_snap, "srv_slow", {"seconds": 4, "tag": "ops"}, "run-1")))
        runner.start()
        with daemon.client() as admin:
            deadline = time.monotonic() + 30
            while admin.get("/v1/calls/run-1").json().get("status") != "running":
                assert time.monotonic() < deadline
                time.sleep(0.02)
            crossed = call(coding, coding_snap, "srv_echo", {"text": "mine"}, "run-1")
            assert crossed.json()["error"]["kind"] == "conflict", crossed.text
            assert "slept" not in crossed.text
            # answered while the ops call still runs: refused, not joined to it
            assert admin.get("/v1/calls/run-1").json()["status"] == "running"
            runner.join(timeout=60)
            assert answers["ops"].json()["status"] == "completed", answers["ops"].text
            assert answers["ops"].json()["content"][0]["text"] == "slept 4.0"
            # after settling: a conflicting call changes nothing of what the id shows
            late = call(coding, snapshot(coding, "coding"), "srv_echo", {"text": "m"}, "run-1")
            assert late.json()["error"]["kind"] == "conflict", late.text
            shown = admin.get("/v1/calls/run-1").json()
            assert shown["status"] == "completed" and shown["tool"] == "srv_slow", shown


def test_a_held_definition_is_callable_from_no_snapshot(served: tuple[Daemon, Path]) -> None:
    """With `pin = "hold"`, a snapshot made before the upstream changed a tool's schema no
    longer calls it: the call says it is held and how to approve it; the upstream receives
    nothing. Once approved, a new snapshot calls the new definition."""
    daemon, descriptions = served
    with daemon.client() as admin:
        before = snapshot(admin)
        assert call(admin, before, "srv_echo", {"text": "one"}, "h-0").json()["status"] \
            == "completed"
        descriptions.write_text(json.dumps({"echo": {"input_schema": {
            "type": "object", "properties": {"text": {"type": "string"},
                                             "shout": {"type": "boolean"}},
            "required": ["text", "shout"]}}}))
        call(admin, before, "srv_mutate", {}, "h-relist")  # the server announces list_changed
        deadline = time.monotonic() + 30
        while not any(c["tool"] == "srv_echo" and c["action"] == "withdrawn"
                      for c in admin.get("/v1/health").json()["definition_changes"]):
            assert time.monotonic() < deadline, daemon.log()
            time.sleep(0.05)
        held = call(admin, before, "srv_echo", {"text": "two"}, "h-1").json()
        assert held["status"] == "error" and held["error"]["kind"] == "unavailable", held
        assert "held" in held["error"]["message"]
        assert "sidecar tools approve srv_echo" in held["error"]["message"]
        assert admin.get("/v1/calls/h-1").json()["error"]["kind"] == "unavailable"
        assert admin.post("/v1/tools/srv_echo/approve").status_code == 200
        ran = call(admin, snapshot(admin), "srv_echo", {"text": "three", "shout": False}, "h-2")
        assert ran.json()["status"] == "completed", ran.text

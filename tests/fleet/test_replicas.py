"""Two `sidecar serve` processes (replicas A and B, each with its own state directory) on one
real PostgreSQL database (`SIDECAR_DATABASE_URL`): each names itself; a call id settled on A
replays on B; the same call id sent to both at once runs once; a snapshot made on A is called
on B."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.fleet.postgres import PostgresServer

SIDECAR = [sys.executable, "-m", "sidecar.cli"]
MANIFEST = """
[tools.stamp]
kind = "command"
description = "Append a line to a file and print it"
input = { type = "object", properties = { line = { type = "string" } }, required = ["line"] }
argv = ["sh", "-c", "echo \\"$1\\" >> \\"$2\\"; echo \\"$1\\"", "stamp", "{line}", "RUNS"]

[tools.wait_open]
kind = "command"
description = "Wait until a file next to the runs file exists"
input = { type = "object", properties = {} }
argv = ["sh", "-c", "while [ ! -e \\"$1\\" ]; do sleep 0.05; done; echo open", "wait", "RUNS.open"]
"""


def start_replica(root: Path, dsn: str, token: str, runs: Path, *, name: str | None = None,
                  env_extra: dict[str, str] | None = None, port: int = 0,
                  ) -> tuple[subprocess.Popen[str], str]:
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "tools.toml").write_text(MANIFEST.replace("RUNS", str(runs)))
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_MANIFESTS=str(root / "manifests"),
               SIDECAR_TOKEN=token, SIDECAR_DATABASE_URL=dsn)
    if name is not None:
        env["SIDECAR_REPLICA_ID"] = name
    env.update(env_extra or {})
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", str(port)], env=env, text=True,
                            stderr=subprocess.PIPE)
    assert proc.stderr is not None
    lines = []
    while True:
        line = proc.stderr.readline()
        assert line, f"replica exited early: {''.join(lines)}"
        lines.append(line)
        if "listening on " in line:
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return proc, line.split("listening on ", 1)[1].strip()


@pytest.fixture
def replicas(tmp_path: Path, postgres_server: PostgresServer) -> Iterator[tuple[str, str, str,
                                                                              Path]]:
    import anyio

    dsn = anyio.run(postgres_server.new_database)
    token = secrets.token_urlsafe(32)
    runs = tmp_path / "runs.txt"
    a, url_a = start_replica(tmp_path / "a", dsn, token, runs, name="replica-a")
    try:
        b, url_b = start_replica(tmp_path / "b", dsn, token, runs, name="replica-b")
        try:
            yield url_a, url_b, token, runs
        finally:
            stop(b)
    finally:
        stop(a)


def stop(proc: subprocess.Popen[str]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=30)
    if proc.stderr is not None:
        proc.stderr.close()


async def call(url: str, token: str, call_id: str, line: str) -> dict[str, Any]:
    headers = {"authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=30) as client:
        snap = (await client.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
        response = await client.post(f"/v1/snapshots/{snap}/calls", json={
            "name": "stamp", "input": {"line": line},
            "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
        return dict(response.json())


def test_health_and_every_answer_name_the_replica(replicas: tuple[str, str, str, Path]) -> None:
    url_a, url_b, token, _ = replicas
    for url, name in ((url_a, "replica-a"), (url_b, "replica-b")):
        health = httpx.get(f"{url}/v1/health", headers={"authorization": f"Bearer {token}"})
        assert health.json()["replica"] == name
        assert health.headers["sidecar-replica"] == name
        refused = httpx.get(f"{url}/v1/health")  # no token: refused, still named
        assert refused.status_code == 401 and refused.headers["sidecar-replica"] == name


def test_a_call_settled_on_one_replica_replays_on_the_other(
    replicas: tuple[str, str, str, Path],
) -> None:
    url_a, url_b, token, runs = replicas
    first = asyncio.run(call(url_a, token, "fleet-1", "once"))
    assert first["status"] == "completed" and not first["replayed"]
    again = asyncio.run(call(url_b, token, "fleet-1", "once"))
    assert again["replayed"] and again["content"] == first["content"]
    assert runs.read_text().splitlines() == ["once"]


def test_the_same_call_id_sent_to_both_at_once_has_one_outcome(
    replicas: tuple[str, str, str, Path],
) -> None:
    """Both answers are the one stored outcome, and the command ran once: the replica that
    did not claim the call id waits for the other's outcome and replays it
    (`sidecar/backends/postgres/claims.py`; tests/fleet/test_claims.py has the kill -9 case)."""
    url_a, url_b, token, runs = replicas

    async def both() -> list[dict[str, Any]]:
        return list(await asyncio.gather(call(url_a, token, "race-1", "raced"),
                                         call(url_b, token, "race-1", "raced")))

    answers = asyncio.run(both())
    assert answers[0]["content"] == answers[1]["content"]  # one outcome for the fleet
    assert sorted(a["replayed"] for a in answers) == [False, True]
    assert runs.read_text().splitlines() == ["raced"]


def test_a_snapshot_made_on_one_replica_is_called_on_the_other(
    replicas: tuple[str, str, str, Path],
) -> None:
    url_a, url_b, token, runs = replicas
    headers = {"authorization": f"Bearer {token}"}
    made = httpx.post(f"{url_a}/v1/snapshots", headers=headers, timeout=30,
                      json={"session_id": "s", "deny": ["managed_read"]})
    assert made.status_code == 201 and made.headers["sidecar-replica"] == "replica-a"
    snapshot = made.json()["id"]

    def call(url: str, name: str, call_id: str) -> httpx.Response:
        return httpx.post(f"{url}/v1/snapshots/{snapshot}/calls", headers=headers, timeout=30,
                          json={"name": name, "input": {"line": call_id, "ref": "x"},
                                "context": {"session_id": "s", "agent": "a",
                                            "message_id": "m", "call_id": call_id}})

    on_b = call(url_b, "stamp", "snap-b")
    assert on_b.status_code == 200 and on_b.json()["status"] == "completed", on_b.text
    assert on_b.headers["sidecar-replica"] == "replica-b"
    denied = call(url_b, "managed_read", "snap-denied").json()  # removed on A: still on B
    assert denied["error"]["kind"] == "unavailable", denied
    unknown = httpx.post(f"{url_b}/v1/snapshots/snap_unknown/calls", headers=headers,
                         json={"name": "stamp", "input": {"line": "x"}, "context": {
                             "session_id": "s", "agent": "a", "message_id": "m",
                             "call_id": "snap-x"}})
    assert unknown.status_code == 404 and unknown.json()["error"]["code"] == "snapshot_expired"
    assert runs.read_text().splitlines() == ["snap-b"]


def test_a_call_running_on_one_replica_is_seen_on_the_other(
    replicas: tuple[str, str, str, Path],
) -> None:
    """`GET /v1/calls/{id}` on B answers `running` with A's name while A runs it (A's claim);
    once A settles it, B reads the outcome (`DELETE` through B cancels it on A:
    tests/fleet/test_cancel_elsewhere.py)."""
    url_a, url_b, token, runs = replicas
    headers = {"authorization": f"Bearer {token}"}
    snapshot = httpx.post(f"{url_a}/v1/snapshots", headers=headers,
                          json={"session_id": "s"}).json()["id"]
    started = httpx.post(f"{url_a}/v1/snapshots/{snapshot}/calls", headers={
        **headers, "prefer": "respond-async"}, json={
        "name": "wait_open", "input": {}, "context": {
            "session_id": "s", "agent": "a", "message_id": "m", "call_id": "gated"}})
    assert started.status_code == 202
    deadline = time.monotonic() + 30  # a hang guard: the claim is taken as the call starts
    while (seen := httpx.get(f"{url_b}/v1/calls/gated", headers=headers)).status_code == 404:
        assert time.monotonic() < deadline, seen.text
        time.sleep(0.05)
    assert seen.json() == {"call_id": "gated", "status": "running", "replica": "replica-a"}
    Path(f"{runs}.open").touch()
    # Every answer is running or the outcome: never 404 as A settles (B read no outcome,
    # then no claim, when A settled in between: fixed 2026-12-05, the route looks again).
    while (done := httpx.get(f"{url_b}/v1/calls/gated", headers=headers)).json().get(
            "status") == "running":
        assert time.monotonic() < deadline, done.text
        time.sleep(0.05)
    assert done.status_code == 200, done.text
    outcome = done.json()
    assert outcome["status"] == "completed" and outcome["replayed"], outcome
    assert outcome["content"] == [{"type": "text", "text": "open\n"}], outcome

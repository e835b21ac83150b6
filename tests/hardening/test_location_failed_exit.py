"""`sidecar serve` whose Location fails while it serves: it stops accepting at once, lets the
request in flight finish, closes the Location and exits 7 (`EXIT_LOCATION_FAILED`) after one
line naming the failed task; its state directory is left intact for the next start.

No task of the daemon is known to fail that way any more (`test_location_failure.py` shows the
last known one contained), so the failure is made with the documented drill
(`sidecar.daemon.failure_drill`): `SIDECAR_DRILL_LOCATION_FAILURE=1`, then SIGUSR2, raises in a task
of a task group the serving task entered, as a failing supervisor's task group would. The
daemon is a real `sidecar serve` process; nothing of it is mocked."""

from __future__ import annotations

import asyncio
import contextlib
import re
import signal
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.hardening.test_location_failure import WAIT, _start, _tail

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]

MANIFEST = """
[tools.stamp]
kind = "command"
description = "Print a line"
input = {{ type = "object", properties = {{}} }}
argv = ["echo", "stamped"]

[tools.gate]
kind = "command"
description = "Say it started, wait for the gate file, then finish"
input = {{ type = "object", properties = {{}} }}
argv = ["sh", "-c", "touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; echo finished"]
"""
LAST_LINE = re.compile(r"sidecar: stopped: a task of the Location failed: LocationDrill: "
                       r"SIDECAR_DRILL_LOCATION_FAILURE=1 and the daemon received SIGUSR2 "
                       r"\(in _fail_when_asked, failure_drill\.py:\d+\)")


async def _call(client: httpx.AsyncClient, name: str, call_id: str) -> dict[str, Any]:
    snap = (await client.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
    response = await client.post(f"/v1/snapshots/{snap}/calls", json={
        "name": name, "input": {},
        "context": {"session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    assert response.status_code == 200, response.text
    return dict(response.json())


def _refused(url: str) -> bool:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=2).close()
    except ConnectionRefusedError:
        return True
    return False


async def _until(what: str, check: Any) -> None:
    deadline = time.monotonic() + WAIT
    while not check():
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        await anyio.sleep(0.05)


async def test_a_failing_location_stops_serving_then_exits_7_with_its_state_intact(
    tmp_path: Path,
) -> None:
    started, gate = tmp_path / "started", tmp_path / "gate"
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(MANIFEST.format(started=started, gate=gate))
    root = tmp_path / "replica"
    state = root / "state"
    proc, log, url = _start(root, {"SIDECAR_MANIFESTS": str(manifests),
                                   "SIDECAR_DRILL_LOCATION_FAILURE": "1"})
    try:
        headers = {"authorization": f"Bearer {(state / 'token').read_text().strip()}"}
        async with httpx.AsyncClient(base_url=url, timeout=WAIT, headers=headers) as client:
            before = await _call(client, "stamp", "before")
            assert before["status"] == "completed", before
            inflight = asyncio.create_task(_call(client, "gate", "inflight"))
            await _until("the gate tool started", started.exists)
            proc.send_signal(signal.SIGUSR2)
            # uvicorn stops accepting first, while the Location (and the call) still runs
            await _until("the port closed", lambda: _refused(url) or inflight.done())
            assert proc.poll() is None, _tail(log)
            assert not inflight.done()
            gate.touch()
            finished = await inflight  # the request in flight got its grace
        assert finished["status"] == "completed", finished
        assert "finished" in finished["content"][0]["text"]
        code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=WAIT))
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text(errors="replace")
    assert code == 7, text[-6000:]
    lines = [line for line in text.splitlines() if line.strip()]
    assert LAST_LINE.fullmatch(lines[-1]), text[-6000:]
    assert [line for line in lines if line.startswith("sidecar: stopped")] == [lines[-1]]
    assert "a task of the Location failed while serving" in text  # the traceback, logged first
    assert _refused(url)

    # The state directory: closed cleanly (no daemon files left), databases intact, and the
    # next daemon on it replays both outcomes.
    assert not (state / "daemon.json").exists() and not (state / "daemon.sock").exists()
    outcomes = f"file:{state / 'outcomes.sqlite'}?mode=ro"
    with contextlib.closing(sqlite3.connect(outcomes, uri=True)) as db, db:
        assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    again, again_log, again_url = _start(root, {"SIDECAR_MANIFESTS": str(manifests)})
    try:
        async with httpx.AsyncClient(base_url=again_url, timeout=WAIT, headers=headers) as client:
            for call_id, said in (("before", "stamped"), ("inflight", "finished")):
                outcome = (await client.get(f"/v1/calls/{call_id}")).json()
                assert outcome["status"] == "completed", outcome
                assert said in outcome["content"][0]["text"]
        again.send_signal(signal.SIGTERM)
        assert await anyio.to_thread.run_sync(lambda: again.wait(timeout=WAIT)) == 0, \
            _tail(again_log)
    finally:
        if again.poll() is None:
            again.kill()
            again.wait()

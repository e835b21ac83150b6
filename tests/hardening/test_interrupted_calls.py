"""A call the daemon was killed under is known after the restart: a retry with its call id
answers `interrupted` (the tool is not run again) and `GET /v1/calls/{id}` shows it, against a
real `sidecar serve` killed with SIGKILL."""

from __future__ import annotations

import signal
import threading
import time
from pathlib import Path

import httpx

from tests.hardening.conftest import start_daemon, stop_daemon

NAP = """
[tools.nap]
kind = "command"
description = "Sleep, then say so"
input = { type = "object", properties = { s = { type = "integer" } }, required = ["s"] }
argv = ["sh", "-c", "sleep \\"$1\\"; echo woke", "nap", "{s}"]
"""


def test_a_call_killed_with_the_daemon_answers_interrupted_after_the_restart(
    tmp_path: Path,
) -> None:
    daemon = start_daemon(tmp_path, manifests={"nap.toml": NAP})
    context = {"session_id": "s", "agent": "a", "message_id": "m", "call_id": "killed-1"}
    try:
        with daemon.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": "s"}).json()["id"]
            quick = client.post(f"/v1/snapshots/{snap}/calls", json={
                "name": "nap", "input": {"s": 0},
                "context": {**context, "call_id": "settled-1"}})
            assert quick.json()["status"] == "completed", quick.text

            def nap() -> None:
                try:
                    client.post(f"/v1/snapshots/{snap}/calls",
                                json={"name": "nap", "input": {"s": 60}, "context": context})
                except httpx.HTTPError:
                    pass  # the daemon is killed under it

            sleeper = threading.Thread(target=nap)
            sleeper.start()
            deadline = time.monotonic() + 30
            while client.get("/v1/calls/killed-1").json().get("status") != "running":
                assert time.monotonic() < deadline
                time.sleep(0.05)
            time.sleep(0.2)  # well past the writer's next batch, which records the start
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(timeout=30)
            sleeper.join(timeout=30)
    finally:
        stop_daemon(daemon)

    again = start_daemon(tmp_path, manifests={"nap.toml": NAP})
    try:
        assert "recorded as interrupted" in again.log()
        with again.client() as client:
            shown = client.get("/v1/calls/killed-1")
            assert shown.status_code == 200, shown.text
            assert shown.json()["error"]["kind"] == "interrupted", shown.text
            snap = client.post("/v1/snapshots", json={"session_id": "s"}).json()["id"]
            started = time.monotonic()
            retry = client.post(f"/v1/snapshots/{snap}/calls", json={
                "name": "nap", "input": {"s": 60}, "context": context}).json()
            assert time.monotonic() - started < 30  # answered, not run again for 60 s
            assert retry["status"] == "error" and retry["error"]["kind"] == "interrupted"
            assert retry["replayed"] is True
            message = retry["error"]["message"]
            assert "(nap)" in message and "not run again" in message, message
            # a call that settled before the kill is unaffected
            assert client.get("/v1/calls/settled-1").json()["status"] == "completed"
    finally:
        stop_daemon(again)


def test_every_answered_call_is_known_after_a_kill_right_after_its_answer(
    tmp_path: Path,
) -> None:
    """An outcome is durable before its answer leaves: journaled, with SQLite's row committed
    behind it. SIGKILL right after the last answer (inside the window the rows are gathered
    in), then a restart: every answered call replays its outcome, none runs again."""
    daemon = start_daemon(tmp_path, manifests={"nap.toml": NAP})
    ids = [f"quick-{i}" for i in range(30)]
    try:
        with daemon.client() as client:
            snap = client.post("/v1/snapshots", json={"session_id": "s"}).json()["id"]
            for call_id in ids:
                answer = client.post(f"/v1/snapshots/{snap}/calls", json={
                    "name": "nap", "input": {"s": 0}, "context": {
                        "session_id": "s", "agent": "a", "message_id": "m",
                        "call_id": call_id}})
                assert answer.json()["status"] == "completed", answer.text
            daemon.proc.send_signal(signal.SIGKILL)
            daemon.proc.wait(timeout=30)
    finally:
        stop_daemon(daemon)
    again = start_daemon(tmp_path, manifests={"nap.toml": NAP})
    try:
        with again.client() as client:
            for call_id in ids:
                shown = client.get(f"/v1/calls/{call_id}").json()
                assert shown["status"] == "completed" and "woke" in shown["content"][0]["text"], \
                    (call_id, shown)
    finally:
        stop_daemon(again)

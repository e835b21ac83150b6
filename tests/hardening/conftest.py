"""A real `sidecar serve` process per test (127.0.0.1, a free port, its own state dir), and a
small synchronous client for the attacks in this folder."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

SIDECAR = [sys.executable, "-m", "sidecar.cli"]


@dataclass
class Daemon:
    url: str
    token: str
    state: Path
    manifests: Path
    proc: subprocess.Popen[str]
    stderr: list[str] = field(default_factory=list)
    drain: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def client(self, timeout: float = 30) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=timeout,
                            headers={"authorization": f"Bearer {self.token}"})

    def health(self, timeout: float = 5.0) -> dict[str, Any]:
        """`/v1/health` on a fresh connection, answered within `timeout` seconds (generous:
        it proves the daemon is not stalled, not how fast it is)."""
        with self.client(timeout=timeout) as client:
            response = client.get("/v1/health")
        assert response.status_code == 200, response.text
        report: dict[str, Any] = response.json()
        return report

    def call(self, name: str, args: dict[str, Any], call_id: str) -> dict[str, Any]:
        with self.client(timeout=120) as client:
            snap = client.post("/v1/snapshots", json={"session_id": "s-" + call_id})
            assert snap.status_code == 201, snap.text
            response = client.post(f"/v1/snapshots/{snap.json()['id']}/calls", json={
                "name": name, "input": args,
                "context": {"session_id": "s-" + call_id, "agent": "a", "message_id": "m",
                            "call_id": call_id},
            })
        assert response.status_code == 200, response.text
        outcome: dict[str, Any] = response.json()
        return outcome

    def log(self) -> str:
        return "".join(self.stderr)


def start_daemon(tmp_path: Path, *extra: str, env: dict[str, str] | None = None,
                 manifests: dict[str, str] | None = None,
                 preexec_fn: Any = None) -> Daemon:
    state = tmp_path / "state"
    folder = tmp_path / "manifests"
    folder.mkdir(exist_ok=True)
    for name, text in (manifests or {}).items():
        (folder / name).write_text(text)
    full_env = {**os.environ, "SIDECAR_STATE_DIR": str(state), "SIDECAR_MANIFESTS": str(folder)}
    for name in ("SIDECAR_TOKEN", "SIDECAR_URL"):
        full_env.pop(name, None)
    full_env.update(env or {})
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0", *extra], env=full_env,
                            stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                            preexec_fn=preexec_fn)
    assert proc.stderr is not None
    lines: list[str] = []
    url = ""
    while True:
        line = proc.stderr.readline()
        if not line:
            proc.wait(timeout=30)
            raise AssertionError(f"serve exited early: {''.join(lines)}")
        lines.append(line)
        if "listening on" in line:
            url = line.split("listening on ")[1].strip()
            break
    daemon = Daemon(url, (state / "token").read_text().strip(), state, folder, proc, lines)
    # Keep reading stderr so that a chatty daemon never blocks on a full pipe.
    daemon.drain = threading.Thread(target=_drain, args=(proc, lines), daemon=True)
    daemon.drain.start()
    return daemon


def _drain(proc: subprocess.Popen[str], lines: list[str]) -> None:
    assert proc.stderr is not None
    lines.extend(proc.stderr)


def stop_daemon(daemon: Daemon) -> int:
    if daemon.proc.poll() is None:
        daemon.proc.send_signal(signal.SIGTERM)
        try:
            daemon.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            daemon.proc.kill()
            daemon.proc.wait(timeout=30)
    if daemon.drain is not None:
        daemon.drain.join(timeout=30)
    assert daemon.proc.stderr is not None
    daemon.proc.stderr.close()
    return daemon.proc.returncode


@pytest.fixture
def daemon(tmp_path: Path) -> Iterator[Daemon]:
    running = start_daemon(tmp_path, manifests={"text.toml": TEXT_TOOL})
    try:
        yield running
    finally:
        stop_daemon(running)


# A command tool printing `count` copies of `line`: big outputs land in the managed store.
_PRINT = "import sys; sys.stdout.write((sys.argv[1] + chr(10)) * int(sys.argv[2]))"
TEXT_TOOL = f'''
[tools.text]
kind = "command"
description = "prints a line many times"
argv = [{json.dumps(sys.executable)}, "-c", "{_PRINT}", "{{line}}", "{{count}}"]

[tools.text.input]
type = "object"
required = ["line", "count"]
properties = {{ line = {{ type = "string" }}, count = {{ type = "integer" }} }}
'''

"""One real `sidecar serve` for the deployment tests: the health probes of compose.yaml and
deploy/kubernetes/ and HAProxy's health check run against it."""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass

import pytest

REPLICA = "sidecar-1"
"""The replica id the daemon is given, as compose.yaml names its first replica."""


@dataclass(frozen=True)
class RealDaemon:
    port: int
    token: str


@pytest.fixture(scope="package")
def real_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealDaemon]:
    root = tmp_path_factory.mktemp("deploy-daemon")
    (root / "manifests").mkdir()
    token = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_MANIFESTS=str(root / "manifests"),
               SIDECAR_TOKEN=token, SIDECAR_REPLICA_ID=REPLICA)
    proc = subprocess.Popen([sys.executable, "-m", "sidecar.cli", "serve", "--port", "0"],
                            env=env, text=True, stderr=subprocess.PIPE)
    try:
        yield RealDaemon(port=_listening_port(proc), token=token)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def _listening_port(proc: subprocess.Popen[str]) -> int:
    assert proc.stderr is not None
    lines: list[str] = []
    while True:
        line = proc.stderr.readline()
        assert line, f"sidecar serve exited early: {''.join(lines)}"
        lines.append(line)
        if "listening on http://" in line:
            # keep draining stderr so the daemon never blocks on a full pipe
            threading.Thread(target=proc.stderr.read, daemon=True).start()
            return int(line.rsplit(":", 1)[1])

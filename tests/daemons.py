"""Stopping the daemon a test started on demand (`sidecar stdio`, CLI commands): by the pid
in its state directory's daemon.json, waiting until the process is gone."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path


def daemon_pid(state: Path) -> int | None:
    try:
        return int(json.loads((state / "daemon.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def stop_daemon(state: Path, timeout: float = 30.0) -> None:
    """SIGTERM the state's daemon, if one runs, and wait until it has exited."""
    pid = daemon_pid(state)
    if pid is None:
        return
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.05)
    os.kill(pid, signal.SIGKILL)

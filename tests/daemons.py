"""Stopping the daemon a test started on demand (`sidecar stdio`, CLI commands): by the pid
in its state directory's daemon.json, waiting until the process is gone."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterable
from pathlib import Path


def daemon_pid(state: Path) -> int | None:
    try:
        return int(json.loads((state / "daemon.json").read_text())["pid"])
    except (OSError, ValueError, KeyError):
        return None


def stop_daemon(state: Path, timeout: float = 30.0) -> None:
    """SIGTERM the state's daemon, if one runs, and wait until it has exited."""
    stop_daemons([state], timeout)


def stop_daemons(states: Iterable[Path], timeout: float = 30.0) -> None:
    """SIGTERM the daemons of `states` at once, then wait until they have exited (one
    deadline for all; SIGKILL for those still there)."""
    running = []
    for state in states:
        pid = daemon_pid(state)
        if pid is None:
            continue
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            continue
        running.append(pid)
    deadline = time.monotonic() + timeout
    while running and time.monotonic() < deadline:
        running = [pid for pid in running if alive(pid)]
        if running:
            time.sleep(0.05)
    for pid in running:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def alive(pid: int) -> bool:
    """Whether process `pid` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True

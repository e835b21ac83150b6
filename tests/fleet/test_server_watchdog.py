"""The fleet test servers do not outlive a killed test run: the watchdog of
`bench/fleet_servers.py` stops PostgreSQL, SeaweedFS and HAProxy, and removes their
directories, when the process that started them dies by SIGKILL; a normal `stop()` disarms it.
Each test starts the real server in a child process, reads what it started, kills the child."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parents[2]

OWNER = textwrap.dedent("""
    import json, sys, time
    sys.path.insert(0, {root!r})
    from bench.fleet_servers import HAProxy, PostgresServer, SeaweedS3
    kind = sys.argv[1]
    if kind == "postgres":
        server = PostgresServer.start()
        pid = server.postmaster_pid()
    elif kind == "seaweedfs":
        server = SeaweedS3.start()
        pid = server.process.pid
    else:
        server = HAProxy.start({{"one": ["127.0.0.1:9"]}})
        pid = server.process.pid
    print(json.dumps({{"root": str(server.root), "pid": pid,
                      "watchdog": server.watchdog.process.pid}}), flush=True)
    if sys.argv[2] == "stop":
        server.stop()
        print("stopped", flush=True)
    time.sleep(600)
""")


def _start_owner(kind: str, then: str) -> tuple[subprocess.Popen[str], dict[str, object]]:
    owner = subprocess.Popen([sys.executable, "-c", OWNER.format(root=str(ROOT)), kind, then],
                             stdout=subprocess.PIPE, text=True)
    assert owner.stdout is not None
    line = owner.stdout.readline()
    assert line, f"the {kind} owner exited: {owner.wait()}"
    return owner, json.loads(line)


def _kill(owner: subprocess.Popen[str]) -> None:
    os.kill(owner.pid, signal.SIGKILL)
    owner.wait()
    assert owner.stdout is not None
    owner.stdout.close()


def _gone_within(pid: int, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.1)
    return False


@pytest.mark.parametrize("kind", ["postgres", "seaweedfs", "haproxy"])
def test_a_killed_owner_leaves_no_server_behind(kind: str) -> None:
    owner, started = _start_owner(kind, "keep")
    pid, root = int(started["pid"]), Path(str(started["root"]))  # type: ignore[call-overload]
    assert psutil.pid_exists(pid) and root.exists()
    _kill(owner)
    assert _gone_within(pid, 30), f"{kind} (pid {pid}) outlived its owner"
    deadline = time.monotonic() + 10
    while root.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not root.exists()
    assert _gone_within(int(started["watchdog"]), 10)  # type: ignore[call-overload]


def test_stop_disarms_the_watchdog() -> None:
    owner, started = _start_owner("haproxy", "stop")
    assert owner.stdout is not None
    assert owner.stdout.readline().strip() == "stopped"
    assert _gone_within(int(started["watchdog"]), 10)  # type: ignore[call-overload]
    assert not psutil.pid_exists(int(started["pid"]))  # type: ignore[call-overload]
    _kill(owner)

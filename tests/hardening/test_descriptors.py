"""Every descriptor the daemon opens is closed once. A second `close(2)` of a number closes
whatever another thread was given that number in between: its SQLite file, a client's socket,
or a pipe libuv watches, and then libuv aborts the process (`sidecar serve` with a server that
exits at start died with SIGABRT, exit -6, in about one start of 150; uvloop closed the pipes
of an adopted server twice, MagicStack/uvloop#763, `bridges.mcp.pipes`).

The race itself is rare; the second close is not: when nobody took the number meanwhile it
fails with EBADF. A real `sidecar serve` runs under strace (its threads' `close` calls, not its
children's), through the paths that hand pipes to the event loop: a prestarted server that
exits at start (adopted, then spawned again), and a `sidecar stdio` client on pipes attached
to the daemon's door, which leaves. No close of the daemon may fail with EBADF.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

from tests.daemons import daemon_pid
from tests.hardening.conftest import SIDECAR, Daemon

STRACE = shutil.which("strace") or "/usr/bin/strace"  # scripts/bootstrap-system installs it
EXITS_AT_START = {"command": sys.executable, "args": ["-c", "raise SystemExit('no upstream')"]}
TOOLS = """
[tools.hello]
kind = "command"
description = "Say hello"
input = { type = "object", properties = {} }
argv = ["echo", "hello"]
"""
LINE = re.compile(r"^(\d+) +(\w+)\((.*)$")


def test_the_daemon_closes_each_descriptor_once(tmp_path: Path) -> None:
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(TOOLS)
    (manifests / "servers.json").write_text(json.dumps({"mcpServers": {"gone": EXITS_AT_START}}))
    state = tmp_path / "state"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(state), SIDECAR_MANIFESTS=str(manifests))
    trace = tmp_path / "trace"
    daemon = subprocess.Popen(
        [STRACE, "-f", "-qq", "-o", str(trace), "-e", "trace=close,clone,clone3,fork,vfork",
         *SIDECAR, "serve", "--port", "0"],
        env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert daemon.stderr is not None
    try:
        served = Daemon(_listening(daemon), (state / "token").read_text().strip(), state,
                        manifests, daemon)
        deadline = time.monotonic() + 60
        while served.health()["servers"]["gone"]["restarts"] < 1:  # spawned after the adopted
            assert time.monotonic() < deadline, served.health()["servers"]["gone"]
            time.sleep(0.1)
        client = subprocess.run(
            [*SIDECAR, "stdio"], input=_session(), capture_output=True, env=env, timeout=120,
            check=False)
        assert client.returncode == 0, client.stderr.decode()
        answers = [json.loads(line) for line in client.stdout.splitlines()]
        assert [a.get("id") for a in answers] == [1, 2], answers
        assert "hello" in [t["name"] for t in answers[1]["result"]["tools"]], answers[1]
    finally:
        pid = daemon_pid(state)  # strace's child
        if pid is not None:
            os.kill(pid, signal.SIGTERM)
        daemon.wait(timeout=60)
        daemon.stderr.close()
    twice = _closed_twice(trace.read_text())
    assert not twice, "closes of the daemon's threads that failed with EBADF:\n" + \
        "\n".join(twice)


def _closed_twice(trace: str) -> list[str]:
    """The daemon's threads' `close` calls that failed with EBADF (its children excluded)."""
    lines = [LINE.match(line) for line in trace.splitlines()]
    first = next(m for m in lines if m is not None)
    threads = {int(first.group(1))}
    for m in lines:
        if m is None or m.group(2) not in ("clone", "clone3") or int(m.group(1)) not in threads:
            continue
        if "CLONE_THREAD" in m.group(3) and (child := re.search(r"= (\d+)$", m.group(3))):
            threads.add(int(child.group(1)))
    return [m.group(0) for m in lines if m is not None and m.group(2) == "close"
            and int(m.group(1)) in threads and "EBADF" in m.group(3)]


def _listening(daemon: subprocess.Popen[str]) -> str:
    assert daemon.stderr is not None
    seen = []
    for line in daemon.stderr:
        seen.append(line)
        if "listening on " in line:
            return line.split("listening on ")[1].strip()
    raise AssertionError(f"serve exited early: {''.join(seen)}")


def _session() -> bytes:
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "t", "version": "1"}}},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/list"},
    ]
    return b"".join(json.dumps(m).encode() + b"\n" for m in messages)

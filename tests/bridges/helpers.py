"""Shared helpers of the bridge tests: server configs, contexts, events, processes."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import anyio.to_thread
import psutil

from bridges.manifest.loading import ServerConfig
from sidecar import ToolContext

HERE = Path(__file__).resolve().parent
SERVERS = HERE / "servers"
TESTSERVER = SERVERS / "testserver.py"
LEGACY_SERVER = SERVERS / "legacy_server.py"
LOOPBACK_PRELOAD = SERVERS / "loopback.mjs"
REPO = HERE.parents[1]
DEPS = REPO / ".deps"

_call_ids = itertools.count(1)


def ctx(session: str = "s1") -> ToolContext:
    """A runner context with a fresh call id (call ids are unique per Location)."""
    return ToolContext(session_id=session, agent="agent", message_id="m1",
                       call_id=f"call-{next(_call_ids)}")


def stdio(*args: str, events: Path | None = None, **fields: Any) -> ServerConfig:
    """The SDK test server over stdio."""
    argv = [str(TESTSERVER), *args]
    if events is not None:
        argv += ["--events", str(events)]
    return ServerConfig(command=sys.executable, args=argv, **fields)


def legacy(*args: str, events: Path | None = None, **fields: Any) -> ServerConfig:
    """The standard-library handshake-era server over stdio."""
    argv = [str(LEGACY_SERVER), *args]
    if events is not None:
        argv += ["--events", str(events)]
    return ServerConfig(command=sys.executable, args=argv, **fields)


def read_events(path: Path, name: str | None = None) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [e for e in events if name is None or e["event"] == name]


async def eventually(check: Callable[[], Any], *, within: float = 10.0, what: str = "") -> Any:
    """Poll `check` until it returns something truthy; fail with `what` after `within` s."""
    for _ in range(int(within / 0.02)):
        result = check()
        if result:
            return result
        await anyio.sleep(0.02)
    raise AssertionError(f"timed out after {within} s waiting for {what or check}")


def live_children() -> set[int]:
    """Our descendant processes that are alive (zombies excluded)."""
    found = set()
    for child in psutil.Process().children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE:
                found.add(child.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def processes_mentioning(marker: str) -> list[int]:
    """Live processes anywhere on the machine whose command line contains `marker` (catches
    orphans that were re-parented away from us)."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if any(marker in part for part in proc.info["cmdline"] or []):
                found.append(proc.pid)
        except psutil.NoSuchProcess:
            pass
    return found


def pid_alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@dataclass(frozen=True)
class SharedServer:
    """A test server several tests talk to (see the `shared_http_server` fixture)."""

    url: str
    events: Path


class HttpServers:
    """Test servers over HTTP/SSE in child processes on 127.0.0.1; `close()` kills them all."""

    def __init__(self) -> None:
        self._procs: list[subprocess.Popen[str]] = []

    def start_testserver(self, transport: str, *args: str) -> tuple[str, subprocess.Popen[str]]:
        proc = subprocess.Popen(
            [sys.executable, str(TESTSERVER), "--transport", transport, *args],
            stdout=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
        )
        self._procs.append(proc)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        if not line.startswith("PORT "):
            raise RuntimeError(f"test server did not start: {line!r}")
        path = "/mcp" if transport == "http" else "/sse"
        return f"http://127.0.0.1:{int(line.split()[1])}{path}", proc

    async def launch_testserver(
        self, transport: str, *args: str
    ) -> tuple[str, subprocess.Popen[str]]:
        """`start_testserver` off the event loop (it waits for the server to listen)."""
        return await anyio.to_thread.run_sync(self.start_testserver, transport, *args)

    def start(self, argv: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env=env, text=True)
        self._procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=10)
            if proc.stdout is not None:
                proc.stdout.close()
        self._procs.clear()


def free_port() -> int:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def child_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}

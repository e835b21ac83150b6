"""A real `sidecar serve` (or `sidecar stdio`) process for the hardening tests: its own state
directory, manifests, environment; raw HTTP over a real socket."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

SIDECAR = [sys.executable, "-m", "sidecar.cli"]


def sidecar_env(state: Path, manifests: Path | None = None, **extra: str) -> dict[str, str]:
    """The test process's environment with no inherited sidecar settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env["SIDECAR_STATE_DIR"] = str(state)
    env["SIDECAR_MANIFESTS"] = str(manifests) if manifests is not None else ""
    env.update(extra)
    return env


@dataclass
class Daemon:
    proc: subprocess.Popen[str]
    url: str
    port: int
    state: Path
    stderr: list[str] = field(default_factory=list)

    @property
    def token(self) -> str:
        return (self.state / "token").read_text().strip()


def run_cli(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, env=env,
                          timeout=timeout, check=False)


@contextmanager
def serving(state: Path, *args: str, env: dict[str, str] | None = None,
            manifests: Path | None = None, umask: int = -1) -> Iterator[Daemon]:
    """`sidecar serve --port 0 ARGS...` until it says it listens; SIGTERM and reaped on exit."""
    proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0", *args],
                            env=env or sidecar_env(state, manifests), umask=umask,
                            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True)
    lines: list[str] = []
    try:
        assert proc.stderr is not None
        while True:
            line = proc.stderr.readline()
            assert line, f"serve exited early: {''.join(lines)}"
            lines.append(line)
            if "listening on" in line:
                url = line.split("listening on ")[1].strip()
                break
        yield Daemon(proc, url, int(url.rsplit(":", 1)[1]), state, lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=30)
        if proc.stderr is not None:
            proc.stderr.close()


def raw_request(port: int, request: bytes, host: str = "127.0.0.1") -> tuple[int, bytes]:
    """Send `request` bytes as they are on a fresh connection (it should say `Connection:
    close`); (status, whole response)."""
    with socket.create_connection((host, port), timeout=30) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    response = b"".join(chunks)
    status_line = response.split(b"\r\n", 1)[0]
    return int(status_line.split()[1]), response


def processes_with(marker: str) -> list[int]:
    """Pids of live (not zombie) processes whose command line contains `marker`."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if marker.encode() in cmdline and state != "Z":
            found.append(int(entry.name))
    return found

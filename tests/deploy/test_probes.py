"""The health checks of the deployment files, run against a real `sidecar serve`: every probe
command of compose.yaml and deploy/kubernetes/ as written (only the interpreter and the port
replaced), and HAProxy (Debian's, `scripts/bootstrap-system`) with deploy/haproxy/haproxy.cfg,
its addresses pointed at 127.0.0.1."""

from __future__ import annotations

import csv
import io
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

from tests.deploy.conftest import REPLICA, RealDaemon
from tests.deploy.daemon_facts import health_probe_url
from tests.deploy.files import HAPROXY_CFG, fleet_services, health_commands

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"


def run_probe(command: list[str], port: int, token: str) -> int:
    assert command[0] == ".venv/bin/python"
    _, written_port, _ = health_probe_url(command)
    local = [sys.executable, *(part.replace(f"127.0.0.1:{written_port}", f"127.0.0.1:{port}")
                                for part in command[1:])]
    env = {"PATH": os.environ["PATH"], "SIDECAR_TOKEN": token}
    return subprocess.run(local, env=env, capture_output=True, timeout=30).returncode


def test_every_health_probe_passes_on_a_real_daemon_and_fails_without_its_token(
    real_daemon: RealDaemon,
) -> None:
    commands = health_commands()
    # compose: the default sidecar and both replicas; kubernetes: the pod's sidecar (startup,
    # liveness) and the gateway (startup, readiness, liveness)
    assert len(commands) == 8, commands
    for command in {tuple(command) for _, command in commands}:
        assert run_probe(list(command), real_daemon.port, real_daemon.token) == 0, command
        assert run_probe(list(command), real_daemon.port, "wrong-" + real_daemon.token) != 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def local_config(text: str, daemon_port: int, front: int, monitor: int, stats: Path) -> str:
    """deploy/haproxy/haproxy.cfg for this machine: binds on 127.0.0.1, both servers at the
    real daemon, no Docker resolver, checks every 100 ms, a stats socket to read them. The
    check request itself (`http-check send ...`) is left exactly as written."""
    replacements = [
        (r"(?m)^global\n", f"global\n    stats socket {stats} level admin\n"),
        (r"(?m)^    bind :8080$", f"    bind 127.0.0.1:{front}"),
        (r"(?m)^    bind :8404$", f"    bind 127.0.0.1:{monitor}"),
        (r"(?ms)^resolvers docker\n.*?\n\n", ""),
        (r" resolvers docker", ""),
        (r" inter 2s", " inter 100ms"),
        (r"(?m)^    server (sidecar-\d) sidecar-\d:8765$",
         rf"    server \1 127.0.0.1:{daemon_port}"),
    ]
    for pattern, replacement in replacements:
        text, count = re.subn(pattern, replacement, text)
        assert count, f"haproxy.cfg no longer has {pattern!r}"
    return text


@contextmanager
def haproxy(config: str, tmp: Path, token: str) -> Iterator[None]:
    path = tmp / "haproxy.cfg"
    path.write_text(config)
    env = {"PATH": os.environ["PATH"], "SIDECAR_TOKEN": token}
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def server_checks(stats: Path) -> dict[str, tuple[str, str]]:
    """Server name -> (check_status, check_code) from HAProxy's `show stat`."""
    with socket.socket(socket.AF_UNIX) as sock:
        sock.connect(str(stats))
        sock.sendall(b"show stat\n")
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    rows = csv.DictReader(io.StringIO(data.decode().lstrip("# ")))
    return {row["svname"]: (row["check_status"], row["check_code"]) for row in rows
            if row["pxname"] == "sidecars" and row["svname"].startswith("sidecar-")}


def run_lb_healthcheck(monitor: int) -> int:
    """compose.yaml's health check of the `lb` service (bash asking the monitor URI)."""
    test = fleet_services()["lb"]["healthcheck"]["test"]
    assert test[:3] == ["CMD", "bash", "-c"] and "/dev/tcp/127.0.0.1/8404" in test[3]
    script = test[3].replace("/dev/tcp/127.0.0.1/8404", f"/dev/tcp/127.0.0.1/{monitor}")
    return subprocess.run(["bash", "-c", script], timeout=30).returncode


def wait_for_checks(stats: Path, expected: tuple[str, str]) -> dict[str, tuple[str, str]]:
    """Poll until every server's last check is `expected` (or 10 s pass; the caller asserts)."""
    deadline = time.monotonic() + 10
    checks: dict[str, tuple[str, str]] = {}
    while time.monotonic() < deadline:
        try:
            checks = server_checks(stats)
        except (FileNotFoundError, ConnectionRefusedError):
            checks = {}  # HAProxy is still starting
        if checks and all(check == expected for check in checks.values()):
            break
        time.sleep(0.05)
    return checks


def test_haproxy_checks_replicas_with_the_token_and_forwards_requests(
    real_daemon: RealDaemon, tmp_path: Path,
) -> None:
    front, monitor, stats = free_port(), free_port(), tmp_path / "stats.sock"
    config = local_config(HAPROXY_CFG.read_text(), real_daemon.port, front, monitor, stats)
    with haproxy(config, tmp_path, real_daemon.token):
        assert wait_for_checks(stats, ("L7OK", "200")) == {
            "sidecar-1": ("L7OK", "200"), "sidecar-2": ("L7OK", "200")}
        headers = {"Authorization": f"Bearer {real_daemon.token}"}
        response = httpx.get(f"http://127.0.0.1:{front}/v1/health", headers=headers)
        assert response.status_code == 200 and response.json()["replica"] == REPLICA
        assert response.headers["Sidecar-Replica"] == REPLICA  # who answered, through the LB
        assert httpx.get(f"http://127.0.0.1:{front}/v1/health").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{monitor}/healthz").status_code == 200
        assert run_lb_healthcheck(monitor) == 0


def test_haproxy_with_the_wrong_token_takes_every_replica_out_and_reports_it(
    real_daemon: RealDaemon, tmp_path: Path,
) -> None:
    front, monitor, stats = free_port(), free_port(), tmp_path / "stats.sock"
    config = local_config(HAPROXY_CFG.read_text(), real_daemon.port, front, monitor, stats)
    with haproxy(config, tmp_path, "not-the-" + real_daemon.token):
        assert wait_for_checks(stats, ("L7STS", "401")) == {
            "sidecar-1": ("L7STS", "401"), "sidecar-2": ("L7STS", "401")}
        # three failed checks (`fall 3`) and the monitor URI, the container's health check,
        # answers 503: no replica is up
        deadline = time.monotonic() + 10
        while (status := httpx.get(f"http://127.0.0.1:{monitor}/healthz").status_code) == 200:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert status == 503
        assert run_lb_healthcheck(monitor) != 0
        assert httpx.get(f"http://127.0.0.1:{front}/v1/health").status_code == 503

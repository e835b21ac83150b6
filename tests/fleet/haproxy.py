"""A real HAProxy (Debian's, `scripts/bootstrap-system` installs it) in front of replicas on
127.0.0.1: round-robin, with affinity on `Mcp-Session-Id` (docs/fleet.md, "Load balancer").

    with HAProxy.start(tmp_path, [port_a, port_b]) as proxy:
        httpx.get(f"{proxy.url}/v1/health")

The stick table learns a session id from the response that assigns it (`store-response`), so
the handshake-era session's later requests (which carry it) go to that replica; requests
without the header (2026-07-28, `/v1`) are spread. A replica that refuses connections is
retried on the other (`option redispatch`), so a new session works while the health check has
not marked the dead one down yet.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"

CONFIG = """\
defaults
    mode http
    timeout connect 2s
    timeout client 60s
    timeout server 60s
    retries 2
    option redispatch 1

frontend sidecars
    bind 127.0.0.1:{port}
    default_backend replicas

backend replicas
    balance roundrobin
    stick-table type string len 128 size 100k expire 30m
    stick match req.hdr(Mcp-Session-Id)
    stick store-response res.hdr(Mcp-Session-Id)
{servers}
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def config(port: int, backends: Sequence[int]) -> str:
    servers = "\n".join(f"    server r{i} 127.0.0.1:{p} check inter 500ms fall 2 rise 1"
                        for i, p in enumerate(backends, 1))
    return CONFIG.format(port=port, servers=servers)


@dataclass
class HAProxy:
    proc: subprocess.Popen[bytes]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def start(cls, root: Path, backends: Sequence[int]) -> HAProxy:
        """Start it in the foreground (`-db`) once the backends listen; returns when its
        frontend accepts connections."""
        port = _free_port()
        path = root / "haproxy.cfg"
        path.write_text(config(port, backends))
        subprocess.run([HAPROXY, "-c", "-q", "-f", str(path)], check=True)
        log = (root / "haproxy.log").open("wb")
        proc = subprocess.Popen([HAPROXY, "-db", "-f", str(path)], stdout=log,
                                stderr=subprocess.STDOUT)
        log.close()
        proxy = cls(proc, port)
        deadline = time.monotonic() + 10
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"haproxy exited: {(root / 'haproxy.log').read_text()}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return proxy
            except OSError:
                if time.monotonic() > deadline:
                    proxy.stop()
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def __enter__(self) -> HAProxy:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.stop()

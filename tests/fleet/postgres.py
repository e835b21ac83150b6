"""A real PostgreSQL server for the tests: Debian's binaries (`scripts/bootstrap-system`
installs them), a throw-away cluster on 127.0.0.1 and a free port, run as the `postgres` user
(initdb and postgres refuse root), fsync off. One per test session; each test gets a
database of its own."""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from dataclasses import dataclass
from pathlib import Path


def _bin() -> Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    if not found:
        raise RuntimeError("PostgreSQL is not installed: run scripts/bootstrap-system")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_postgres(*argv: str) -> list[str]:
    if os.geteuid() != 0:
        return list(argv)
    return ["runuser", "-u", "postgres", "--", *argv]


@dataclass
class PostgresServer:
    root: Path
    port: int
    user: str = "test"

    @classmethod
    def start(cls) -> PostgresServer:
        root = Path(tempfile.mkdtemp(prefix="sidecar-pg-"))
        if os.geteuid() == 0:
            shutil.chown(root, "postgres", "postgres")
        server = cls(root, _free_port())
        bin_dir = _bin()
        subprocess.run(_as_postgres(str(bin_dir / "initdb"), "-D", str(root / "data"), "-U",
                                    server.user, "--auth=trust", "-E", "UTF8", "--no-locale",
                                    "-N"), check=True, capture_output=True)
        options = (f"-k {root} -h 127.0.0.1 -p {server.port} -F -c fsync=off "
                   "-c full_page_writes=off -c synchronous_commit=off -c max_connections=200")
        subprocess.run(_as_postgres(str(bin_dir / "pg_ctl"), "-D", str(root / "data"), "-l",
                                    str(root / "log"), "-w", "-o", options, "start"),
                       check=True, capture_output=True)
        return server

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

    def stop(self) -> None:
        subprocess.run(_as_postgres(str(_bin() / "pg_ctl"), "-D", str(self.root / "data"), "-m",
                                    "immediate", "-w", "stop"), capture_output=True, check=False)
        shutil.rmtree(self.root, ignore_errors=True)

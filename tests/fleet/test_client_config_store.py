"""`sidecar client-config` with a fleet database: the configured `sidecar stdio` reaches the
same database, and the password never lands in the config. A real PostgreSQL server of its
own where one role must log in with a password (scram-sha-256 in pg_hba.conf): the config's
command, run as an MCP client runs it, works with a password file (`PGPASSFILE`, which the
entry passes through) and is refused without one."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import asyncpg
import pytest
from mcp import Client, StdioServerParameters

from tests.fleet.postgres import PostgresServer

ROOT = Path(__file__).resolve().parents[2]
SIDECAR = [sys.executable, "-m", "sidecar.cli"]
PASSWORD = "pw-" + "Zq8" * 6  # what must never appear in a config
MANIFEST = """
[tools.shout]
kind = "command"
description = "prints its text"
input = { type = "object", properties = { text = { type = "string" } }, required = ["text"] }
argv = ["printf", "%s", "{text}"]
"""


@dataclass
class Setup:
    server: PostgresServer
    url: str  # with the password
    database: str  # host:port/name
    state: Path
    manifests: Path
    passfile: Path
    env: dict[str, str]


async def _make_role(server: PostgresServer) -> None:
    conn = await asyncpg.connect(server.dsn())
    try:
        await conn.execute(f"CREATE ROLE fleetuser LOGIN PASSWORD '{PASSWORD}'")
        await conn.execute("CREATE DATABASE fleetdb OWNER fleetuser")
        hba = server.root / "data" / "pg_hba.conf"
        hba.write_text("host all fleetuser 127.0.0.1/32 scram-sha-256\n" + hba.read_text())
        await conn.execute("SELECT pg_reload_conf()")
    finally:
        await conn.close()


@pytest.fixture
def setup(tmp_path: Path) -> Iterator[Setup]:
    server = PostgresServer.start()
    state = tmp_path / "state"
    try:
        anyio.run(_make_role, server)
        manifests = tmp_path / "m"
        manifests.mkdir()
        (manifests / "tools.toml").write_text(MANIFEST)
        passfile = tmp_path / "pgpass"
        passfile.write_text(f"127.0.0.1:{server.port}:fleetdb:fleetuser:{PASSWORD}\n")
        passfile.chmod(0o600)
        home = tmp_path / "home"
        home.mkdir()  # no ~/.pgpass there
        env = {"PATH": os.environ["PATH"], "HOME": str(home)}
        url = f"postgresql://fleetuser:{PASSWORD}@127.0.0.1:{server.port}/fleetdb"
        yield Setup(server, url, f"127.0.0.1:{server.port}/fleetdb", state, manifests,
                    passfile, env)
    finally:
        subprocess.run([*SIDECAR, "stop", "--state-dir", str(state)], capture_output=True,
                       timeout=60, cwd=ROOT, env={"PATH": os.environ["PATH"]}, check=False)
        server.stop()


def sidecar(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*SIDECAR, *args], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env=env, check=False)


def entry_of(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert done.returncode == 0, done.stderr
    assert PASSWORD not in done.stdout
    return dict(json.loads(done.stdout)["mcpServers"]["sidecar"])


async def shout_through(entry: dict[str, Any], env: dict[str, str]) -> str:
    params = StdioServerParameters(command=entry["command"], args=entry["args"], cwd=str(ROOT),
                                   env={**env, **entry.get("env", {})})
    async with Client(params, mode="legacy", cache=None, read_timeout_seconds=60) as client:
        result = await client.call_tool("shout", {"text": "via the config"})
        assert not result.is_error, result.content
        return str(result.content[0].text)  # type: ignore[union-attr]


async def calls_in(server: PostgresServer) -> int:
    conn = await asyncpg.connect(server.dsn("fleetdb"))
    try:
        return int(await conn.fetchval("SELECT count(*) FROM sidecar_calls"))
    finally:
        await conn.close()


def test_the_configured_stdio_reaches_the_fleet_database_without_a_password_in_the_config(
    setup: Setup,
) -> None:
    common = ["--state-dir", str(setup.state), "--manifests", str(setup.manifests)]
    env = {**setup.env, "PGPASSFILE": str(setup.passfile)}
    done = sidecar("client-config", "generic", *common, "--store", setup.url, env=env)
    entry = entry_of(done)
    assert entry["args"][-2:] == [
        "--store", f"postgresql://fleetuser@127.0.0.1:{setup.server.port}/fleetdb"]
    assert entry["env"] == {"PGPASSFILE": str(setup.passfile)}
    assert "~/.pgpass" in done.stderr and PASSWORD not in done.stderr
    # $SIDECAR_DATABASE_URL (what the daemon was started with) gives the same entry
    from_env = sidecar("client-config", "generic", *common,
                       env={**env, "SIDECAR_DATABASE_URL": setup.url})
    assert entry_of(from_env) == entry
    codex = sidecar("client-config", "codex", *common, "--store", setup.url, env=env)
    assert codex.returncode == 0 and PASSWORD not in codex.stdout
    assert f'env = {{ PGPASSFILE = "{setup.passfile}" }}' in codex.stdout

    # run as the client runs it, without the password file: the database refuses the user
    refused = subprocess.run([entry["command"], *entry["args"]], capture_output=True,
                             text=True, timeout=120, cwd=ROOT, env=setup.env, input="",
                             check=False)
    assert refused.returncode == 6, refused.stderr
    assert "password authentication failed" in refused.stderr

    # with it (through the entry's env): the call goes through a daemon on the fleet database
    assert anyio.run(shout_through, entry, setup.env) == "via the config"
    info = json.loads((setup.state / "daemon.json").read_text())
    assert info["database"] == setup.database
    deadline = time.monotonic() + 30  # a hang guard: the history row is written in a batch
    while anyio.run(calls_in, setup.server) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.1)

    # that daemon keeps its records in the database: a config for the state directory alone
    # (no --store) would start clients that disagree with it, so it is refused
    alone = sidecar("client-config", "generic", *common, env=setup.env)
    assert alone.returncode == 2 and setup.database in alone.stderr, alone.stderr

"""The CLI commands that work on the fleet database themselves (`sidecar auth ...`, `sidecar
token ...`, `sidecar calls --embedded`, the `--embedded` client commands) against a real
PostgreSQL server, each run as a real process: when the database is unreachable as the command
starts (stopped: refused; frozen with SIGSTOP: no answer), or its connection is cut or the
server freezes while the command waits on it, the command prints ONE line on stderr naming
the database (`host:port/name`), never the user or the password of `--store`, no traceback, and
exits 6 (`EXIT_DATABASE`)."""

from __future__ import annotations

import os
import re
import secrets
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio
import anyio.abc
import asyncpg
import pytest

from sidecar.backends.postgres.call_history import PostgresCallHistory
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.backends.postgres.pool import LOCK_MIGRATE
from sidecar.backends.postgres.tokens import PostgresTokenStore
from sidecar.serve.local_door import database_of
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_grant_rekey import new_key
from tests.fleet.test_replicas import start_replica, stop

# Every test runs the CLI as a process: one event loop flavour is enough.
pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]

PASSWORD = "pw-never-printed-7f3a"
BOUND = "1"  # SIDECAR_DATABASE_TIMEOUT of the commands, in seconds
MANIFEST = """{"mcpServers": {
  "cloud": {"url": "http://127.0.0.1:9/mcp", "auth": "oauth"},
  "machine": {"url": "http://127.0.0.1:9/mcp",
              "oauth": {"grant": "client_credentials", "client_id": "cid",
                        "client_secret": "csecret"}}}}"""

# (argv after `sidecar`, the table whose lock the command waits on once its store is open)
WAITING = {
    "auth status": (["auth", "status"], "sidecar_grants"),
    "auth login (browser)": (["auth", "login", "cloud", "--no-browser"], "sidecar_grants"),
    "auth login (client credentials)": (["auth", "login", "machine"], "sidecar_grants"),
    "auth logout": (["auth", "logout", "cloud"], "sidecar_grants"),
    "auth rekey": (["auth", "rekey"], "sidecar_grants"),
    "token create": (["token", "create", "--profile", "default"], "sidecar_tokens"),
    "token list": (["token", "list"], "sidecar_tokens"),
    "token revoke": (["token", "revoke", "tok_gone"], "sidecar_tokens"),
    "calls --embedded": (["calls", "--embedded"], "sidecar_calls"),
}
EMBEDDED = {
    "tools --embedded": ["tools", "--embedded"],
    "health --embedded": ["health", "--embedded"],
    "call --embedded": ["call", "anything", "--embedded"],
    "managed read --embedded": ["managed", "read", "m_0", "--embedded"],
}
EVERY = {**{name: argv for name, (argv, _) in WAITING.items()}, **EMBEDDED}


def with_password(dsn: str) -> str:
    """The DSN with a password (the test server trusts; the CLI must never print it)."""
    return dsn.replace("postgresql://test@", f"postgresql://test:{PASSWORD}@", 1)


def cli_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    manifests = tmp_path / "manifests"
    manifests.mkdir(exist_ok=True)
    (manifests / "oauth.json").write_text(MANIFEST)
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"), SIDECAR_MANIFESTS=str(manifests),
               SIDECAR_GRANT_KEY=KEY, SIDECAR_DATABASE_TIMEOUT=BOUND,
               SIDECAR_TOKEN=secrets.token_urlsafe(32))  # (`serve` says nothing of one)
    return env


KEY = new_key()


def argv(command: list[str], dsn: str) -> list[str]:
    return [sys.executable, "-m", "sidecar.cli", *command, "--store", with_password(dsn)]


async def prepared(dsn: str) -> None:
    """The tables the commands use exist (their migrations applied), so a test's lock on
    one is what the command waits for."""
    for store in (PostgresGrantStore, PostgresTokenStore, PostgresCallHistory):
        await (await store.open(dsn)).aclose()


def one_clear_line(code: int, err: str, dsn: str, command: str) -> None:
    assert code == 6, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err
    assert f"the fleet database {database_of(dsn)} is unavailable: `sidecar {command}" in err
    assert PASSWORD not in err and "test" not in err.replace(database_of(dsn), "")


async def run(command: list[str], dsn: str, env: dict[str, str]) -> tuple[int, str]:
    done = await anyio.run_process(argv(command, dsn), env=env, check=False)
    return done.returncode, done.stderr.decode()


async def cut_while_waiting(proc: anyio.abc.Process, conn: asyncpg.Connection, waiting: str,
                            *args: object, freeze: PostgresServer | None = None) -> str:
    """Wait until the command's backend waits on a lock the test holds (`waiting`: a query
    returning that backend's pid), then end its connection (pg_terminate_backend), or with
    `freeze` stop the whole server answering; the command's stderr."""
    with anyio.fail_after(60):
        while not (pid := await conn.fetchval(waiting, *args)):
            assert proc.returncode is None, "the command ended without waiting"
            await anyio.sleep(0.05)
        if freeze is None:
            await conn.execute("SELECT pg_terminate_backend($1)", pid)
            await proc.wait()
        else:
            pids = freeze.freeze()
            try:
                await proc.wait()
            finally:
                freeze.thaw(pids)
    assert proc.stderr is not None
    return b"".join([chunk async for chunk in proc.stderr]).decode()


TABLE_WAIT = "SELECT pid FROM pg_locks WHERE NOT granted AND relation = $1::regclass"


@asynccontextmanager
async def table_locked(dsn: str, table: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection holding `table` locked (ACCESS EXCLUSIVE) until the block ends."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute(f"LOCK TABLE {table} IN ACCESS EXCLUSIVE MODE")
            yield conn
            await conn.execute("SELECT 1")  # (the transaction ends: the lock goes)
    finally:
        await conn.close()


@pytest.fixture
async def dsn(postgres_server: PostgresServer) -> str:
    made = await postgres_server.new_database()
    await prepared(made)
    return made


@pytest.mark.parametrize("name", sorted(WAITING))
async def test_a_connection_cut_midway_is_one_line_and_exit_6(
    name: str, dsn: str, tmp_path: Path
) -> None:
    command, table = WAITING[name]
    async with table_locked(dsn, table) as conn, await anyio.open_process(
            argv(command, dsn), env=cli_env(tmp_path)) as proc:
        err = await cut_while_waiting(proc, conn, TABLE_WAIT, table)
    one_clear_line(proc.returncode or 0, err, dsn, " ".join(command[:2]))


@pytest.mark.parametrize("name", ["auth status", "token create", "calls --embedded",
                                  "tools --embedded", "serve"])
async def test_a_connection_cut_while_the_store_opens_is_one_line_and_exit_6(
    name: str, dsn: str, tmp_path: Path
) -> None:
    """The command waits for the schema lock (`LOCK_MIGRATE`, as while another replica
    migrates) when its connection is cut. `serve` is a daemon: it could not start."""
    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock($1)", LOCK_MIGRATE)
            command = EVERY.get(name, ["serve", "--port", "0", "--no-manifests"])
            async with await anyio.open_process(argv(command, dsn),
                                                env=cli_env(tmp_path)) as proc:
                err = await cut_while_waiting(
                    proc, conn, "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND "
                    "NOT granted AND objid::bigint = ($1::bigint & 4294967295)", LOCK_MIGRATE)
    finally:
        await conn.close()
    one_clear_line(proc.returncode or 0, err, dsn, name.split(" --")[0].replace(
        " (browser)", ""))


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    server = PostgresServer.start()  # its own: the test stops and freezes it
    try:
        yield server
    finally:
        server.stop()


async def test_a_stopped_or_frozen_database_is_one_line_and_exit_6(
    own_server: PostgresServer, tmp_path: Path
) -> None:
    """Stopped (refused) as every command starts; frozen (SIGSTOP: no answer within
    `SIDECAR_DATABASE_TIMEOUT`) as a command starts, and while one waits on it."""
    dsn = await own_server.new_database()
    await prepared(dsn)
    env = cli_env(tmp_path)
    own_server.pause()
    try:
        for name, command in EVERY.items():
            code, err = await run(command, dsn, env)
            one_clear_line(code, err, dsn, name.split(" (")[0])
            assert "Connection refused" in err, err
    finally:
        own_server.resume()

    pids = own_server.freeze()
    try:
        for name in ("auth status", "token list"):
            code, err = await run(EVERY[name], dsn, env)
            one_clear_line(code, err, dsn, name)
            assert "no answer within the database timeout, SIDECAR_DATABASE_TIMEOUT" in err
    finally:
        own_server.thaw(pids)

    for name in ("auth logout", "token revoke"):
        command, table = WAITING[name]
        async with table_locked(dsn, table) as conn, await anyio.open_process(
                argv(command, dsn), env=env) as proc:
            err = await cut_while_waiting(proc, conn, TABLE_WAIT, table, freeze=own_server)
        one_clear_line(proc.returncode or 0, err, dsn, name)
        assert "no answer within the database timeout" in err


async def test_a_daemon_whose_database_is_down_makes_its_clients_exit_6(
    own_server: PostgresServer, tmp_path: Path
) -> None:
    """The client commands ask a running `sidecar serve`; its fleet database stopped, the
    daemon answers 503 `unavailable` naming the database, and the commands exit 6 as when
    they use the database themselves: `health` prints the report (status unavailable, why),
    `calls` and `call` one line."""
    dsn = await own_server.new_database()
    token = secrets.token_urlsafe(32)
    proc, url = start_replica(tmp_path / "replica", dsn, token, tmp_path / "runs.txt",
                              env_extra={"SIDECAR_DATABASE_TIMEOUT": BOUND})
    try:
        env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
        env.update(SIDECAR_STATE_DIR=str(tmp_path / "client"), SIDECAR_TOKEN=token,
                   SIDECAR_URL=url)
        sidecar = [sys.executable, "-m", "sidecar.cli"]
        healthy = await anyio.run_process([*sidecar, "health"], env=env, check=False)
        assert healthy.returncode == 0, healthy.stderr
        own_server.pause()
        try:
            health = await anyio.run_process([*sidecar, "health"], env=env, check=False)
            out, err = health.stdout.decode(), health.stderr.decode()
            assert health.returncode == 6, out + err
            assert "status: unavailable" in out and "Traceback" not in err
            # why: the health check's own reason once its last answer (healthy, above) is
            # over FRESH_SECONDS old, else that of the state read that failed
            assert re.search(rf"^database: the fleet database {re.escape(database_of(dsn))} "
                             r"(cannot be reached: .*refused|is unavailable)", out, re.M), out
            for command in (["calls"], ["call", "stamp", "--input", '{"line": "x"}']):
                done = await anyio.run_process([*sidecar, *command], env=env, check=False)
                err = done.stderr.decode()
                assert done.returncode == 6, err
                assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
                assert "answered 503: unavailable: the fleet database " \
                    f"{database_of(dsn)} is unavailable" in err
        finally:
            own_server.resume()
    finally:
        stop(proc)


async def test_an_embedded_call_whose_database_stops_midway_ends_with_one_line_and_exit_6(
    own_server: PostgresServer, tmp_path: Path
) -> None:
    """`sidecar call --embedded` runs the Location in its own process: the database stops
    while the tool runs. The stores' retries are logged one line each (no traceback), and the
    command ends with its one line naming the database, exit 6."""
    dsn = await own_server.new_database()
    started, gate = tmp_path / "started", tmp_path / "gate"
    manifests = tmp_path / "tools"
    manifests.mkdir()
    (manifests / "tools.toml").write_text(f"""
[tools.gated]
kind = "command"
description = "Say it started, wait for the gate"
input = {{ type = "object", properties = {{}} }}
argv = ["sh", "-c", "touch {started}; while [ ! -e {gate} ]; do sleep 0.05; done; echo done"]
""")
    env = {**cli_env(tmp_path), "SIDECAR_MANIFESTS": str(manifests)}
    async with await anyio.open_process(argv(["call", "gated", "--embedded"], dsn),
                                        env=env) as proc:
        with anyio.fail_after(60):
            while not started.exists():
                assert proc.returncode is None, "the command ended before its tool ran"
                await anyio.sleep(0.05)
        own_server.pause()
        try:
            gate.touch()
            with anyio.fail_after(60):
                await proc.wait()
        finally:
            own_server.resume()
        assert proc.stderr is not None
        err = b"".join([chunk async for chunk in proc.stderr]).decode()
    assert proc.returncode == 6, err
    assert "Traceback" not in err and PASSWORD not in err
    assert err.strip().splitlines()[-1].startswith(
        f"sidecar: the fleet database {database_of(dsn)} is unavailable: `sidecar call "
        "--embedded` did not finish")


@pytest.mark.parametrize("name", ["auth status", "token list"])
async def test_a_server_message_quoting_the_user_does_not_print_it(
    name: str, dsn: str, tmp_path: Path
) -> None:
    """The server refuses an unknown role and its message quotes it: the line hides it (and
    the password), and still names the database."""
    stranger = dsn.replace("postgresql://test@", f"postgresql://stranger-7c1:{PASSWORD}@", 1)
    done = await anyio.run_process(
        [sys.executable, "-m", "sidecar.cli", *EVERY[name], "--store", stranger],
        env=cli_env(tmp_path), check=False)
    err = done.stderr.decode()
    assert done.returncode == 6, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert f"the fleet database {database_of(dsn)} is unavailable: `sidecar {name}`" in err
    assert 'role "***" does not exist' in err
    assert "stranger-7c1" not in err and PASSWORD not in err

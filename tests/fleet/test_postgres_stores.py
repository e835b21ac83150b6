"""The PostgreSQL record stores (permission rules, tokens, pins, call history) beyond their
contract suites: versioned schemas (a newer one is refused, by the stores and by `sidecar
serve` with exit 6), a token revoked through another store stops verifying once its cache
entry is stale, and one replica at a time prunes the call history."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import anyio
import asyncpg
import pytest

from sidecar.backends.postgres.call_history import PostgresCallHistory
from sidecar.backends.postgres.permissions import PostgresPermissionStore
from sidecar.backends.postgres.pins import PostgresPinStore
from sidecar.backends.postgres.pool import LOCK_PRUNE_CALLS, PostgresStore
from sidecar.backends.postgres.tokens import PostgresTokenStore
from sidecar.cli.output import EXIT_DATABASE
from sidecar.stores.call_history import CallQuery, CallRecord
from sidecar.stores.errors import DatabaseError, SchemaTooNew, database_error_in
from sidecar.stores.tokens import create_token, verify_token
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import SIDECAR

pytestmark = pytest.mark.anyio
STORES: list[type[PostgresStore]] = [PostgresPermissionStore, PostgresTokenStore,
                                     PostgresPinStore, PostgresCallHistory]


async def _set_version(dsn: str, component: str, version: int) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE sidecar_schema SET version = $1 WHERE component = $2",
                           version, component)
    finally:
        await conn.close()


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_each_store_has_its_component_and_refuses_a_newer_schema(
    postgres_server: PostgresServer,
) -> None:
    dsn = await postgres_server.new_database()
    for cls in STORES:
        await (await cls.open(dsn)).aclose()
    conn = await asyncpg.connect(dsn)
    try:
        versions = dict(await conn.fetch("SELECT component, version FROM sidecar_schema"))
    finally:
        await conn.close()
    assert versions == {cls.COMPONENT: cls.SCHEMA_VERSION for cls in STORES}
    for cls in STORES:
        await (await cls.open(dsn)).aclose()  # a second open migrates nothing
        await _set_version(dsn, cls.COMPONENT, cls.SCHEMA_VERSION + 1)
        with pytest.raises(SchemaTooNew, match=f"{cls.COMPONENT} schema is version "
                           f"{cls.SCHEMA_VERSION + 1}, newer than this sidecar knows"):
            await cls.open(dsn)
        await _set_version(dsn, cls.COMPONENT, cls.SCHEMA_VERSION)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_an_unreachable_database_is_a_database_error() -> None:
    with pytest.raises(DatabaseError, match="cannot reach the fleet database") as caught:
        await PostgresTokenStore.open("postgresql://nobody@127.0.0.1:9/none")
    assert database_error_in(RuntimeError("not a database error")) is None
    try:
        raise RuntimeError("a store's own error") from caught.value
    except RuntimeError as wrapped:
        assert database_error_in(wrapped) is caught.value


def _serve(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    return subprocess.run([*SIDECAR, "serve", "--port", "0", "--no-manifests", "--state-dir",
                           str(tmp_path / "state"), *args], env=env, text=True,
                          capture_output=True, timeout=120, check=False)


def test_serve_says_in_one_line_when_the_database_cannot_be_used(
    tmp_path: Path, postgres_server: PostgresServer,
) -> None:
    unreachable = _serve(tmp_path, "--store", "postgres://nobody@127.0.0.1:9/none")
    assert unreachable.returncode == EXIT_DATABASE
    assert unreachable.stderr.splitlines()[-1].startswith(
        "sidecar: the fleet database 127.0.0.1:9/none is unavailable: `sidecar serve` could "
        "not start (")
    assert "nobody" not in unreachable.stderr
    assert "Traceback" not in unreachable.stderr
    dsn = anyio.run(postgres_server.new_database)

    async def newer() -> None:
        await (await PostgresPinStore.open(dsn)).aclose()
        await _set_version(dsn, PostgresPinStore.COMPONENT, 99)

    anyio.run(newer)
    refused = _serve(tmp_path, "--store", dsn.replace("postgresql://", "postgres://"))
    assert refused.returncode == EXIT_DATABASE
    assert refused.stderr.splitlines()[-1] == (
        "sidecar: the database's pins schema is version 99, newer than this sidecar knows "
        f"({PostgresPinStore.SCHEMA_VERSION}): upgrade the sidecar, or use another database")
    bad = _serve(tmp_path, "--store", "mysql://x@127.0.0.1/db")
    assert bad.returncode == 2
    assert bad.stderr.splitlines()[-1] == ("sidecar: --store: the fleet database is a "
                                           "postgres:// or postgresql:// URL, not 'mysql'")


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_token_revoked_elsewhere_stops_verifying_once_the_cache_is_stale(
    postgres_server: PostgresServer,
) -> None:
    dsn = await postgres_server.new_database()
    replica = await PostgresTokenStore.open(dsn)
    cli = await PostgresTokenStore.open(dsn)
    try:
        replica.cache_seconds = 0.2
        secret, record = await create_token(cli, profiles=["coding"])
        assert await verify_token(replica, secret) == record  # now cached
        assert await cli.revoke(record.id)
        with anyio.fail_after(10):
            while await verify_token(replica, secret) is not None:  # noqa: ASYNC110
                await anyio.sleep(0.05)
    finally:
        await replica.aclose()
        await cli.aclose()


def _row(i: int, started_at: float) -> CallRecord:
    return CallRecord(call_id=f"c{i}", tool="echo", server=None, profile=None, session_id="s",
                      agent="a", message_id="m", status="completed", error_kind=None,
                      started_at=started_at, duration_ms=1.0, input_bytes=2, input={},
                      content_bytes=1, retained=(), replayed=False)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_one_replica_at_a_time_prunes_the_call_history(
    postgres_server: PostgresServer,
) -> None:
    dsn = await postgres_server.new_database()
    a = await PostgresCallHistory.open(dsn)
    b = await PostgresCallHistory.open(dsn, location="other")
    holder = await asyncpg.connect(dsn)
    try:
        a.add(_row(1, 1.0))
        a.add(_row(2, 1e9))
        b.add(_row(3, 1.0))
        await b.query(CallQuery())
        async with holder.transaction():  # another replica is pruning
            await holder.execute("SELECT pg_advisory_xact_lock($1)", LOCK_PRUNE_CALLS)
            assert await a.prune(1e6) == 0
        assert await a.prune(1e6) == 1  # only its own Location's old row
        assert [r.call_id for r in (await a.query(CallQuery()))[0]] == ["c2"]
        assert [r.call_id for r in (await b.query(CallQuery()))[0]] == ["c3"]
    finally:
        await holder.close()
        await a.aclose()
        await b.aclose()

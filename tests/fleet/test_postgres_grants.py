"""OAuth grants in the fleet database, sealed with `SIDECAR_GRANT_KEY` (real PostgreSQL):
without the key nothing is read or written (the error names the variable) but servers are
listed and forgotten; a record sealed with another key, or changed in the database, or copied
onto another server's row, gives a clear error; a second key opens old records and the first
seals new ones; a malformed key stops a replica at open (one line, as every fleet backend
error) and `sidecar auth` with exit 2."""

from __future__ import annotations

import base64
import os
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest

from sidecar.backends.postgres.grant_keys import (
    GrantKeyInvalid,
    GrantKeyMissing,
    GrantKeys,
    GrantSealError,
    key_id,
)
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.backends.postgres.pool import open_pool
from sidecar.stores.errors import DatabaseError
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio
RECORD = {"resource": "https://a.example/mcp",
          "tokens": {"access_token": "secret-at", "refresh_token": "secret-rt"}}


def new_key() -> str:
    return base64.urlsafe_b64encode(os.urandom(32)).decode().rstrip("=")


@pytest.fixture
async def dsn(postgres_server: PostgresServer) -> str:
    return await postgres_server.new_database()


@pytest.fixture
async def stores(dsn: str) -> AsyncIterator[list[PostgresGrantStore]]:
    opened: list[PostgresGrantStore] = []
    yield opened
    for store in opened:
        await store.aclose()


async def open_with(dsn: str, stores: list[PostgresGrantStore],
                    key: str | None) -> PostgresGrantStore:
    keys = GrantKeys.parse(key) if key is not None else None
    store = await PostgresGrantStore.open(dsn)
    store.keys = keys
    stores.append(store)
    return store


async def test_without_the_key_no_record_is_read_or_written(
    dsn: str, stores: list[PostgresGrantStore]
) -> None:
    keyed = await open_with(dsn, stores, new_key())
    await keyed.put("a", RECORD)
    bare = await open_with(dsn, stores, None)
    for attempt in (bare.get("a"), bare.put("b", RECORD),
                    bare.update("a", lambda old: old)):
        with pytest.raises(GrantKeyMissing, match="SIDECAR_GRANT_KEY, which is not set"):
            await attempt
    assert await bare.get("absent") is None
    assert await bare.servers() == ["a"]  # names are not secret
    assert await bare.delete("a")  # a lost key: the grant can still be forgotten
    assert await keyed.servers() == []


async def test_another_key_or_a_changed_row_gives_a_clear_error(
    dsn: str, stores: list[PostgresGrantStore]
) -> None:
    mine, theirs = new_key(), new_key()
    keyed = await open_with(dsn, stores, mine)
    await keyed.put("a", RECORD)
    await keyed.put("b", {"tokens": {"access_token": "other"}})
    other = await open_with(dsn, stores, theirs)
    mine_id = key_id(GrantKeys.parse(mine).keys[0])  # type: ignore[union-attr]
    with pytest.raises(GrantSealError, match=f"another SIDECAR_GRANT_KEY \\(key id {mine_id}"):
        await other.get("a")
    with pytest.raises(GrantSealError, match="another SIDECAR_GRANT_KEY"):
        await other.update("a", lambda old: old)
    assert await keyed.get("a") == RECORD  # untouched by the refused update

    async with keyed._pool.acquire() as conn:  # b's sealed bytes copied onto a's row
        await conn.execute("UPDATE sidecar_grants SET sealed = (SELECT sealed FROM "
                           "sidecar_grants WHERE server = 'b') WHERE server = 'a'")
    with pytest.raises(GrantSealError, match="does not decrypt with its key"):
        await keyed.get("a")
    async with keyed._pool.acquire() as conn:  # one bit flipped
        await conn.execute("UPDATE sidecar_grants SET sealed = set_byte(sealed, 20, "
                           "get_byte(sealed, 20) # 1) WHERE server = 'b'")
    with pytest.raises(GrantSealError, match="does not decrypt"):
        await keyed.get("b")


async def test_a_second_key_opens_old_records_and_the_first_seals_new_ones(
    dsn: str, stores: list[PostgresGrantStore]
) -> None:
    old, new = new_key(), new_key()
    before = await open_with(dsn, stores, old)
    await before.put("a", RECORD)
    rotated = await open_with(dsn, stores, f"{new}, {old}")
    assert await rotated.get("a") == RECORD
    await rotated.update("a", lambda record: {**(record or {}), "updated_at": 2.0})
    async with rotated._pool.acquire() as conn:
        kid = await conn.fetchval("SELECT key_id FROM sidecar_grants WHERE server = 'a'")
    assert kid == key_id(GrantKeys.parse(new).keys[0])  # type: ignore[union-attr]
    with pytest.raises(GrantSealError):
        await before.get("a")  # only the new key seals it now
    assert (await (await open_with(dsn, stores, new)).get("a") or {})["updated_at"] == 2.0


async def test_a_malformed_key_is_refused_at_open(
    dsn: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    for bad, said in (("not base64!", "not base64"), (base64.b64encode(b"short").decode(),
                                                      "5 bytes")):
        with pytest.raises(GrantKeyInvalid, match=said) as raised:
            GrantKeys.parse(f"{new_key()},{bad}")
        assert "key 2" in str(raised.value) and bad not in str(raised.value)
    monkeypatch.setenv("SIDECAR_GRANT_KEY", "not base64!")
    with pytest.raises(GrantKeyInvalid, match="SIDECAR_GRANT_KEY: the key is not base64"):
        await PostgresGrantStore.open(dsn)

    from sidecar.daemon.stores import _open_grants, _Opening

    pool = await open_pool(dsn)
    try:
        opening = _Opening(options=None, backends=None, stack=None, pool=pool)  # type: ignore[arg-type]
        with pytest.raises(DatabaseError, match="SIDECAR_GRANT_KEY"):
            await _open_grants(opening)
    finally:
        await pool.close()


@pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])
async def test_sidecar_auth_names_the_variable(dsn: str, tmp_path: Path) -> None:
    """`sidecar auth status --store URL`: no key, exit 2 naming it; another replica's key,
    exit 2 naming both key ids; the right key lists the grant."""
    key = new_key()
    store = await PostgresGrantStore.open(dsn)
    store.keys = GrantKeys.parse(key)
    await store.put("cloud", {"resource": "http://127.0.0.1:1/mcp", "tokens": {
        "access_token": "secret-at", "refresh_token": "secret-rt"}, "expires_at": 1e10})
    await store.aclose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"),
               SIDECAR_MANIFESTS=str(tmp_path / "none"))

    async def status(grant_key: str | None) -> tuple[int, str, str]:
        extra = {"SIDECAR_GRANT_KEY": grant_key} if grant_key is not None else {}
        done = await anyio.run_process(
            [sys.executable, "-m", "sidecar.cli", "auth", "status", "--json", "--store", dsn],
            env={**env, **extra}, check=False)
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    missing = await status(None)
    assert missing[0] == 2 and "SIDECAR_GRANT_KEY, which is not set" in missing[2]
    wrong = await status(new_key())
    assert wrong[0] == 2 and "another SIDECAR_GRANT_KEY" in wrong[2]
    right = await status(key)
    assert '"authorized": true' in right[1], right[2]
    for _, out, err in (missing, wrong, right):
        assert "secret-" not in out + err and key not in out + err

"""The `GrantStore` contract (OAuth grants of upstream servers), run against every
implementation: `FileGrantStore` (the default), `KeyringGrantStore` and `PostgresGrantStore`
(the fleet's, on the session's real PostgreSQL, sealed with a `SIDECAR_GRANT_KEY`). No OS
keyring runs on a headless test machine, so the keyring one runs on an in-memory keyring
backend (the `keyring` package's own backend interface); its headless failure is checked
against the real `fail` backend. Two opens of one store stand for two processes (two replicas
on one database, or the daemon and `sidecar auth` on one state directory)."""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from pathlib import Path

import anyio
import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends.fail import Keyring as FailKeyring

from sidecar.backends.local.grants import FileGrantStore, KeyringGrantStore, open_grant_store
from sidecar.backends.postgres.grant_keys import GrantKeys
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.stores.grants import GrantStore, GrantStoreUnavailable
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenStore = Callable[[], Awaitable[GrantStore]]
KEY = base64.b64encode(os.urandom(32)).decode()


class MemoryKeyring(KeyringBackend):
    priority = 1  # type: ignore[assignment]

    def __init__(self) -> None:
        super().__init__()
        self.secrets: dict[tuple[str, str], str] = {}

    def get_password(self, service: str, username: str) -> str | None:
        return self.secrets.get((service, username))

    def set_password(self, service: str, username: str, password: str) -> None:
        self.secrets[(service, username)] = password

    def delete_password(self, service: str, username: str) -> None:
        del self.secrets[(service, username)]


@pytest.fixture
def memory_keyring() -> Iterator[MemoryKeyring]:
    previous = keyring.get_keyring()
    ring = MemoryKeyring()
    keyring.set_keyring(ring)
    try:
        yield ring
    finally:
        keyring.set_keyring(previous)


@pytest.fixture(params=["file", "keyring", "postgres"])
async def open_store(request: pytest.FixtureRequest,
                     tmp_path: Path) -> AsyncIterator[OpenStore]:
    opened: list[PostgresGrantStore] = []
    dsn = ""
    if request.param == "keyring":
        request.getfixturevalue("memory_keyring")
    if request.param == "postgres":
        server: PostgresServer = request.getfixturevalue("postgres_server")
        dsn = await server.new_database()

    async def open_one() -> GrantStore:
        if request.param == "keyring":
            return KeyringGrantStore(tmp_path / "state")
        if request.param == "file":
            return FileGrantStore(tmp_path / "state")
        store = await PostgresGrantStore.open(dsn, max_size=4)
        store.keys = GrantKeys.parse(KEY)
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.aclose()


async def test_records_round_trip_update_and_delete(open_store: OpenStore) -> None:
    store = await open_store()
    assert await store.get("a") is None and await store.servers() == []
    record = {"resource": "https://a.example/mcp", "tokens": {"access_token": "secret-at"}}
    await store.put("a", record)
    assert await store.get("a") == record
    assert await store.update("b", lambda old: {"n": (old or {}).get("n", 0) + 1}) == {"n": 1}
    assert await store.update("b", lambda old: {"n": (old or {}).get("n", 0) + 1}) == {"n": 2}
    assert await store.servers() == ["a", "b"]
    assert await store.update("b", lambda old: None) is None
    assert await store.servers() == ["a"]
    assert await store.delete("a") and not await store.delete("a")
    assert await store.get("a") is None and await store.servers() == []


async def test_a_record_written_by_one_process_is_read_by_another(
    open_store: OpenStore,
) -> None:
    writer, reader = await open_store(), await open_store()
    await writer.put("cloud", {"tokens": {"access_token": "at-1", "refresh_token": "rt-1"}})
    assert await reader.get("cloud") == {
        "tokens": {"access_token": "at-1", "refresh_token": "rt-1"}}
    assert await reader.servers() == ["cloud"]


async def test_updates_from_two_processes_at_once_lose_nothing(open_store: OpenStore) -> None:
    """Each `update` applies its change to the record the other left: 2 x 15 increments
    sent concurrently through two opens of the store end at 30."""
    first, second = await open_store(), await open_store()

    def bump(old: dict[str, int] | None) -> dict[str, int]:
        return {"n": (old or {}).get("n", 0) + 1}

    async def bumps(store: GrantStore) -> None:
        for _ in range(15):
            await store.update("counter", bump)  # type: ignore[arg-type]

    async with anyio.create_task_group() as tg:
        tg.start_soon(bumps, first)
        tg.start_soon(bumps, second)
    assert await first.get("counter") == {"n": 30}


async def test_exclusive_has_one_holder_at_a_time(open_store: OpenStore) -> None:
    """Held by a task of one process, a second process's `exclusive` waits until it ends;
    the store stays readable and writable meanwhile (a refresh stores its new tokens while it
    holds it)."""
    first, second = await open_store(), await open_store()
    order: list[str] = []
    holding = anyio.Event()

    async def second_holder() -> None:
        await holding.wait()
        async with second.exclusive("cloud"):
            order.append("second in")

    async with anyio.create_task_group() as tg:
        tg.start_soon(second_holder)
        async with first.exclusive("cloud"):
            order.append("first in")
            holding.set()
            await first.put("cloud", {"tokens": {"access_token": "new"}})
            assert await second.get("cloud") == {"tokens": {"access_token": "new"}}
            await anyio.sleep(0.3)  # room for the second holder to get in, were it not held
            order.append("first out")
    assert order == ["first in", "first out", "second in"]


async def test_a_cancelled_wait_for_exclusive_leaves_it_free(open_store: OpenStore) -> None:
    first, second = await open_store(), await open_store()
    async with first.exclusive("cloud"):
        with anyio.move_on_after(0.2) as waited:
            async with second.exclusive("cloud"):
                pytest.fail("entered while held")
        assert waited.cancelled_caught
    with anyio.fail_after(10):  # a hang guard: free at once
        async with second.exclusive("cloud"):
            pass


async def test_nothing_secret_is_readable_by_others(
    open_store: OpenStore, tmp_path: Path
) -> None:
    store = await open_store()
    await store.put("a", {"tokens": {"access_token": "secret-at"}})
    if isinstance(store, PostgresGrantStore):
        async with store._pool.acquire() as conn:
            row = await conn.fetchrow("SELECT key_id, sealed FROM sidecar_grants")
        assert b"secret-at" not in bytes(row["sealed"]) and row["key_id"]
        assert "secret-at" not in repr(store) and KEY not in repr(store)
        return
    files = [p for p in (tmp_path / "state").iterdir() if p.is_file()]
    assert files
    for path in files:
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
        if isinstance(store, KeyringGrantStore):
            assert "secret-at" not in path.read_text(errors="replace")


async def test_the_keyring_store_says_clearly_when_there_is_no_keyring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    previous = keyring.get_keyring()
    keyring.set_keyring(FailKeyring())
    try:
        monkeypatch.setenv("SIDECAR_OAUTH_STORE", "keyring")
        store = open_grant_store(tmp_path / "state")
        assert isinstance(store, KeyringGrantStore)
        with pytest.raises(GrantStoreUnavailable, match="no OS keyring is available"):
            await store.get("a")
    finally:
        keyring.set_keyring(previous)
    monkeypatch.setenv("SIDECAR_OAUTH_STORE", "vault")
    with pytest.raises(GrantStoreUnavailable, match="use 'file' or 'keyring'"):
        open_grant_store(tmp_path / "state")
    monkeypatch.delenv("SIDECAR_OAUTH_STORE")
    assert isinstance(open_grant_store(tmp_path / "state"), FileGrantStore)

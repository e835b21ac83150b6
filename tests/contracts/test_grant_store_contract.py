"""The `GrantStore` contract (OAuth grants of upstream servers), run against every
implementation: `FileGrantStore` (the default) and `KeyringGrantStore`. No OS keyring runs on a
headless test machine, so the keyring one runs on an in-memory keyring backend (the `keyring`
package's own backend interface); its headless failure is checked against the real `fail`
backend."""

from __future__ import annotations

import stat
from collections.abc import Iterator
from pathlib import Path

import keyring
import pytest
from keyring.backend import KeyringBackend
from keyring.backends.fail import Keyring as FailKeyring

from sidecar.grant_store import (
    FileGrantStore,
    GrantStore,
    GrantStoreUnavailable,
    KeyringGrantStore,
    open_grant_store,
)

pytestmark = pytest.mark.anyio


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


@pytest.fixture(params=["file", "keyring"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> GrantStore:
    if request.param == "keyring":
        request.getfixturevalue("memory_keyring")
        return KeyringGrantStore(tmp_path / "state")
    return FileGrantStore(tmp_path / "state")


async def test_records_round_trip_update_and_delete(store: GrantStore) -> None:
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


async def test_nothing_secret_is_readable_by_others(store: GrantStore, tmp_path: Path) -> None:
    await store.put("a", {"tokens": {"access_token": "secret-at"}})
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

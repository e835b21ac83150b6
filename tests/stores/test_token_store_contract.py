"""`TokenStore` contract: scoped tokens found by the digest of their secret, listed, revoked,
kept across a restart; the secret itself is never stored."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.backends.postgres.tokens import PostgresTokenStore
from sidecar.backends.sqlite.tokens import SqliteTokenStore
from sidecar.stores.tokens import (
    TokenError,
    TokenRecord,
    TokenStore,
    create_token,
    verify_token,
)
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenStore = Callable[[], Awaitable[TokenStore]]


async def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> OpenStore:
    return lambda: SqliteTokenStore.open(tmp_path / "tokens.sqlite")


async def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> OpenStore:
    """A fresh database on the session's real PostgreSQL server (a pool per open)."""
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()
    return lambda: PostgresTokenStore.open(dsn)


IMPLEMENTATIONS = [pytest.param(_sqlite, id="sqlite"), pytest.param(_postgres, id="postgres")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    make = await request.param(tmp_path, request)
    opened: list[TokenStore] = []

    async def open_one() -> TokenStore:
        store = await make()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.aclose()


async def test_add_find_list(open_store: OpenStore) -> None:
    store = await open_store()
    first = TokenRecord("tok_1", ("coding",), "ci", 1.0)
    second = TokenRecord("tok_2", ("coding", "docs"), "", 2.0)
    await store.add(first, "digest-1")
    await store.add(second, "digest-2")
    assert await store.find("digest-1") == first
    assert await store.find("digest-2") == second
    assert await store.find("digest-3") is None
    assert sorted(await store.list(), key=lambda r: r.id) == [first, second]


async def test_revoke_removes_only_that_token(open_store: OpenStore) -> None:
    store = await open_store()
    await store.add(TokenRecord("tok_1", ("a",), "", 1.0), "d1")
    await store.add(TokenRecord("tok_2", ("b",), "", 2.0), "d2")
    assert await store.revoke("tok_1") is True
    assert await store.revoke("tok_1") is False
    assert await store.revoke("tok_unknown") is False
    assert await store.find("d1") is None
    assert [r.id for r in await store.list()] == ["tok_2"]


async def test_tokens_survive_a_restart_and_verify_by_secret(open_store: OpenStore) -> None:
    store = await open_store()
    secret, record = await create_token(store, profiles=["coding"], label="laptop")
    await store.aclose()
    reopened = await open_store()
    assert await verify_token(reopened, secret) == record
    assert await verify_token(reopened, secret + "x") is None
    assert all(secret not in repr(r) for r in await reopened.list())


async def test_a_token_made_through_one_store_is_found_by_another(
    open_store: OpenStore,
) -> None:
    """Two stores on one storage (the CLI and a daemon, or two replicas): a token made
    through one verifies through the other at once, and one revoked through the other
    stops verifying through the first, at once where it was revoked."""
    daemon = await open_store()
    cli = await open_store()
    assert await verify_token(daemon, "sct_" + "x" * 43) is None  # unknown: nothing cached
    secret, record = await create_token(cli, profiles=["coding"])
    assert await verify_token(daemon, secret) == record
    assert await daemon.revoke(record.id) is True
    assert await verify_token(daemon, secret) is None
    assert await verify_token(cli, secret) is None


async def test_a_token_keeps_the_user_it_belongs_to(open_store: OpenStore) -> None:
    store = await open_store()
    secret, record = await create_token(store, profiles=("coding",), user="carol")
    assert record.user == "carol" and record.to_json()["user"] == "carol"
    assert await verify_token(store, secret) == record
    reopened = await open_store()
    assert [r.user for r in await reopened.list()] == ["carol"]
    nobodys = TokenRecord("tok_n", ("coding",), "", 3.0)
    await store.add(nobodys, "digest-n")
    assert (await store.find("digest-n")) == nobodys and "user" not in nobodys.to_json()
    with pytest.raises(TokenError, match="is not a user name"):
        await create_token(store, profiles=("coding",), user="user:x")

"""`TokenStore` contract: scoped tokens found by the digest of their secret, listed, revoked,
kept across a restart; the secret itself is never stored."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.stores import TokenStore
from sidecar.tokens import SqliteTokenStore, TokenRecord, create_token, verify_token

pytestmark = pytest.mark.anyio

OpenStore = Callable[[], Awaitable[TokenStore]]


async def _sqlite(tmp_path: Path) -> OpenStore:
    return lambda: SqliteTokenStore.open(tmp_path / "tokens.sqlite")


IMPLEMENTATIONS = [pytest.param(_sqlite, id="sqlite")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    make = await request.param(tmp_path)
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

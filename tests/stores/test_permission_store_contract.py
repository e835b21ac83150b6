"""`PermissionStore` contract: `always` replies kept per Location, oldest first, surviving a
restart; and the permission service on top of it (ask, answer `always`, restart, allowed)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import pytest

from sidecar.backends.postgres.permissions import PostgresPermissionStore
from sidecar.backends.sqlite.permissions import SqlitePermissionStore
from sidecar.model.permissions import PermissionRequest, PermissionRule
from sidecar.policy.permission_service import PermissionService
from sidecar.stores.permissions import PermissionStore, StoredRule
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio

OpenStore = Callable[[], Awaitable[PermissionStore]]


async def _sqlite(tmp_path: Path, request: pytest.FixtureRequest) -> OpenStore:
    return lambda: SqlitePermissionStore.open(tmp_path / "permissions.sqlite")


async def _postgres(tmp_path: Path, request: pytest.FixtureRequest) -> OpenStore:
    """A fresh database on the session's real PostgreSQL server; each open has a pool of its
    own, as a restarted replica would."""
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()
    return lambda: PostgresPermissionStore.open(dsn)


IMPLEMENTATIONS = [pytest.param(_sqlite, id="sqlite"), pytest.param(_postgres, id="postgres")]


@pytest.fixture(params=IMPLEMENTATIONS)
async def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[OpenStore]:
    """Opens the same store anew on each call; every store opened is closed at the end."""
    make = await request.param(tmp_path, request)
    opened: list[PermissionStore] = []

    async def open_one() -> PermissionStore:
        store = await make()
        opened.append(store)
        return store

    yield open_one
    for store in opened:
        await store.aclose()


async def test_a_new_store_has_no_rules(open_store: OpenStore) -> None:
    store = await open_store()
    assert await store.rules("default") == []


async def test_rules_come_back_oldest_first_with_their_scope(open_store: OpenStore) -> None:
    store = await open_store()
    added = [
        StoredRule("s1", PermissionRule("deploy", "allow")),
        StoredRule("", PermissionRule("publish", "allow")),
        StoredRule("s2", PermissionRule("fs_write", "deny", "/etc/*")),
        StoredRule("s1", PermissionRule("migrate", "allow")),
    ]
    for stored in added:
        await store.add("default", stored.session_id, stored.rule)
    assert await store.rules("default") == added


async def test_locations_are_kept_apart(open_store: OpenStore) -> None:
    store = await open_store()
    await store.add("a", "s1", PermissionRule("deploy", "allow"))
    await store.add("b", "", PermissionRule("publish", "allow"))
    assert await store.rules("a") == [StoredRule("s1", PermissionRule("deploy", "allow"))]
    assert await store.rules("b") == [StoredRule("", PermissionRule("publish", "allow"))]
    assert await store.rules("c") == []


async def test_rules_survive_a_restart(open_store: OpenStore) -> None:
    store = await open_store()
    await store.add("default", "s1", PermissionRule("deploy", "allow"))
    await store.add("default", "", PermissionRule("publish", "allow", "pkg/*"))
    await store.aclose()
    reopened = await open_store()
    assert await reopened.rules("default") == [
        StoredRule("s1", PermissionRule("deploy", "allow")),
        StoredRule("", PermissionRule("publish", "allow", "pkg/*")),
    ]


def _request(action: str, session: str) -> PermissionRequest:
    return PermissionRequest(session_id=session, agent="a", action=action, resources=(),
                             default=None, call_id="c")


async def _answer(service: PermissionService, request: PermissionRequest, reply: str,
                  scope: str = "session") -> None:
    task = asyncio.create_task(service.ask(request))
    for _ in range(500):  # the ask reads the store first (a round trip to a database server)
        await asyncio.sleep(0.01)
        pending = [p for p in service.pending() if p.request is request]
        if pending:
            await service.reply(pending[0].id, reply, scope=scope)  # type: ignore[arg-type]
            await asyncio.wait_for(task, 1)
            return
    raise AssertionError("the ask never became pending")


async def test_always_answers_are_asked_once_across_restarts(open_store: OpenStore) -> None:
    ask_everything = [PermissionRule("*", "ask")]
    store = await open_store()
    service = await PermissionService.open(store, location="default", defaults=ask_everything)
    await _answer(service, _request("deploy", "s1"), "always")
    await _answer(service, _request("publish", "s1"), "always", scope="location")
    await _answer(service, _request("migrate", "s1"), "once")  # not stored
    await service.aclose()
    await store.aclose()

    store = await open_store()
    service = await PermissionService.open(store, location="default", defaults=ask_everything)
    try:
        await asyncio.wait_for(service.ask(_request("deploy", "s1")), 1)   # no ask
        await asyncio.wait_for(service.ask(_request("publish", "s7")), 1)  # Location-wide
        assert service.decision("s2", "deploy") == "ask"   # a session rule stays its own
        assert service.decision("s1", "migrate") == "ask"  # `once` was never stored
    finally:
        await service.aclose()
    assert [r.rule.action for r in await store.rules("default")] == ["deploy", "publish"]


async def test_an_always_rule_stored_elsewhere_applies_before_asking(
    open_store: OpenStore,
) -> None:
    """Two services on one storage (two replicas of a fleet on one database): a rule stored
    through the first applies on the second, which opened before it was stored."""
    ask_everything = [PermissionRule("*", "ask")]
    first = await PermissionService.open(await open_store(), location="default",
                                         defaults=ask_everything)
    second = await PermissionService.open(await open_store(), location="default",
                                          defaults=ask_everything)
    try:
        await _answer(first, _request("deploy", "s1"), "always")
        await asyncio.wait_for(second.ask(_request("deploy", "s1")), 5)  # no ask
        assert second.pending() == []
        assert second.decision("s2", "deploy") == "ask"
    finally:
        await first.aclose()
        await second.aclose()

"""The `PendingLogins` contract (OAuth logins waiting for the browser's redirect,
`sidecar.stores.pending_logins`), run against `MemoryPendingLogins` and `PostgresPendingLogins` (on
the session's real PostgreSQL, two stores on one database as two replicas): a state is
taken once, by the server it was started for, before its expiry; otherwise the rejection
names why (unknown, used, expired). The outcome one replica records is read by another; a
login taken but never finished (its receiver stopped) reads as failed after `within`, naming
the receiver; `latest` is the server's newest login as any replica sees it. On
PostgreSQL the record is sealed with SIDECAR_GRANT_KEY (the verifier is not in the table, and
the state is not either), two replicas taking one state at once get it once, and without the
key nothing is added or taken."""

from __future__ import annotations

import base64
import os
import secrets
from collections.abc import AsyncIterator

import anyio
import asyncpg
import pytest

from sidecar.backends.local.pending_logins import MemoryPendingLogins
from sidecar.backends.postgres.grant_keys import GrantKeyMissing, GrantKeys
from sidecar.backends.postgres.pending_logins import PostgresPendingLogins
from sidecar.model.replica import replica_id
from sidecar.stores.pending_logins import LoginStateRejected, PendingLogins, state_key
from tests.fleet.postgres import PostgresServer

pytestmark = pytest.mark.anyio
RECORD = {"server": "cloud", "code_verifier": "verifier-" + "v" * 60,
          "client": {"client_id": "c-1"}}


class Replicas:
    """Two views of one pending-login store: what replica A and replica B each open."""

    def __init__(self, a: PendingLogins, b: PendingLogins, dsn: str | None) -> None:
        self.a, self.b, self.dsn = a, b, dsn

    async def expire(self, state: str) -> None:
        if isinstance(self.a, MemoryPendingLogins):
            self.a.expire(state)
            return
        conn = await asyncpg.connect(self.dsn)
        try:
            await conn.execute("UPDATE sidecar_pending_logins SET expires_at = now() - "
                               "interval '1 second' WHERE key = $1", state_key(state))
        finally:
            await conn.close()


@pytest.fixture(params=["memory", "postgresql"])
async def replicas(request: pytest.FixtureRequest,
                   postgres_server: PostgresServer) -> AsyncIterator[Replicas]:
    if request.param == "memory":
        memory = MemoryPendingLogins()
        yield Replicas(memory, memory, None)
        return
    dsn = await postgres_server.new_database()
    keys = GrantKeys.parse(base64.b64encode(os.urandom(32)).decode())
    a = await PostgresPendingLogins.open(dsn)
    b = await PostgresPendingLogins.open(dsn)
    a.keys = b.keys = keys
    try:
        yield Replicas(a, b, dsn)
    finally:
        await a.aclose()
        await b.aclose()


async def rejected(store: PendingLogins, state: str, server: str = "cloud") -> str:
    with pytest.raises(LoginStateRejected) as caught:
        await store.take(state, server)
    assert server in str(caught.value)
    return caught.value.code


async def test_a_state_is_taken_once_by_any_replica(replicas: Replicas) -> None:
    state = secrets.token_urlsafe(32)
    await replicas.a.add(state, "cloud", RECORD, 60)
    assert await replicas.b.outcome(state, 60) is None
    assert await replicas.b.take(state, "cloud") == RECORD
    assert await rejected(replicas.a, state) == "used_state"
    assert await rejected(replicas.b, state) == "used_state"
    await replicas.b.finish(state, "authorized", "cloud: authorized; tokens stored")
    assert await replicas.a.outcome(state, 60) == (
        "authorized", "cloud: authorized; tokens stored")


async def test_unknown_expired_and_another_servers_states_are_refused(
    replicas: Replicas,
) -> None:
    assert await rejected(replicas.b, secrets.token_urlsafe(32)) == "unknown_state"
    state = secrets.token_urlsafe(32)
    await replicas.a.add(state, "cloud", RECORD, 60)
    # a state started for `cloud` does not finish a login of `other`, and stays usable
    assert await rejected(replicas.b, state, "other") == "unknown_state"
    await replicas.expire(state)
    assert await rejected(replicas.b, state) == "expired_state"
    assert "expired" in str(await _why(replicas.b, state))


async def test_a_login_taken_and_never_finished_fails_and_latest_shows_the_newest(
    replicas: Replicas,
) -> None:
    state = secrets.token_urlsafe(32)
    await replicas.a.add(state, "cloud", RECORD, 60)
    waiting = await replicas.b.latest("cloud", 60)
    assert waiting is not None and (waiting.key, waiting.state) == (state_key(state), "pending")
    assert "waiting for the browser" in waiting.message and waiting.replica == replica_id()
    assert waiting.to_json()["authorization_url"] is None  # only the starter holds it
    assert await replicas.b.latest("other", 60) is None

    await replicas.b.take(state, "cloud")  # ... and the receiver stops mid-exchange
    assert await replicas.a.outcome(state, 60) is None  # still being finished
    taken = await replicas.a.latest("cloud", 60)
    assert taken is not None and taken.state == "pending" and "reached replica" in taken.message
    await anyio.sleep(0.3)
    failed = await replicas.a.outcome(state, 0.2)
    assert failed is not None and failed[0] == "failed", failed
    assert "did not finish the login" in failed[1] and replica_id() in failed[1], failed
    assert (await replicas.b.latest("cloud", 0.2)).state == "failed"  # type: ignore[union-attr]
    # a receiver that was only slow still records its outcome, and that is what is read
    stored = ("authorized", "cloud: authorized; tokens stored")
    await replicas.b.finish(state, *stored)
    assert await replicas.a.outcome(state, 0.2) == stored

    newer = secrets.token_urlsafe(32)
    await replicas.b.add(newer, "cloud", RECORD, 60)
    latest = await replicas.a.latest("cloud", 60)
    assert latest is not None and (latest.key, latest.state) == (state_key(newer), "pending")
    await replicas.expire(newer)
    expired = await replicas.a.latest("cloud", 60)
    assert expired is not None and expired.state == "failed", expired
    assert "did not come back" in expired.message


async def _why(store: PendingLogins, state: str) -> LoginStateRejected:
    try:
        await store.take(state, "cloud")
    except LoginStateRejected as exc:
        return exc
    raise AssertionError("taken")


async def test_on_postgresql_the_record_is_sealed_and_taken_once_under_a_race(
    postgres_server: PostgresServer,
) -> None:
    dsn = await postgres_server.new_database()
    keys = GrantKeys.parse(base64.b64encode(os.urandom(32)).decode())
    stores = [await PostgresPendingLogins.open(dsn) for _ in range(2)]
    for store in stores:
        store.keys = keys
    try:
        state = secrets.token_urlsafe(32)
        await stores[0].add(state, "cloud", RECORD, 60)
        conn = await asyncpg.connect(dsn)
        try:
            row = await conn.fetchrow("SELECT * FROM sidecar_pending_logins")
            dumped = repr(dict(row)).encode() + bytes(row["sealed"])
            assert b"verifier-" not in dumped and state.encode() not in dumped
            assert b"c-1" not in dumped
        finally:
            await conn.close()
        results: list[object] = []

        async def take(store: PostgresPendingLogins) -> None:
            try:
                results.append(await store.take(state, "cloud"))
            except LoginStateRejected as exc:
                results.append(exc.code)

        async with anyio.create_task_group() as tg:
            for store in stores:
                tg.start_soon(take, store)
        assert sorted(results, key=str) == sorted([RECORD, "used_state"], key=str)
        conn = await asyncpg.connect(dsn)
        try:  # once taken, the sealed secrets are gone from the table
            assert await conn.fetchval("SELECT sealed FROM sidecar_pending_logins") is None
        finally:
            await conn.close()

        stores[1].keys = None  # a replica without SIDECAR_GRANT_KEY
        with pytest.raises(GrantKeyMissing, match="SIDECAR_GRANT_KEY"):
            await stores[1].add(secrets.token_urlsafe(32), "cloud", RECORD, 60)
        await stores[0].add(other := secrets.token_urlsafe(32), "cloud", RECORD, 60)
        with pytest.raises(GrantKeyMissing, match="SIDECAR_GRANT_KEY"):
            await stores[1].take(other, "cloud")
        assert await stores[0].take(other, "cloud") == RECORD  # not spent by the refusal
    finally:
        for store in stores:
            await store.aclose()

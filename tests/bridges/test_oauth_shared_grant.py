"""One OAuth grant shared by several processes (a fleet's replicas on one database, or two
daemons on one grant file), against the real test authorization server, which rotates refresh
tokens (each works once) and counts a spent one presented again (`reused`).

Two server pools (two replicas) each on their own open of the grant store, and a third
party refreshing the grant behind their backs: every refresh starts from the stored record
under the store's `exclusive` hold, so no refresh token is ever spent twice, both stay ready
and their calls keep working across several refreshes."""

from __future__ import annotations

import base64
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.auth import OAuthToken

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from bridges.mcp.oauth.login import login
from bridges.mcp.oauth.records import RecordStorage
from bridges.mcp.oauth.upstream import UpstreamAuth
from sidecar import Location
from sidecar.backends.local.grants import FileGrantStore
from sidecar.backends.postgres.grant_keys import GrantKeys
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.stores.grants import GrantStore
from tests.bridges.helpers import ctx, eventually
from tests.bridges.oauth_server import OAuthServer
from tests.bridges.test_oauth import follow
from tests.fleet.postgres import PostgresServer
from tests.live_server import live_server

pytestmark = pytest.mark.anyio


@pytest.fixture
async def protected() -> AsyncIterator[OAuthServer]:
    server = OAuthServer(expires_in=4)
    async with live_server(server) as port:
        server.base = f"http://127.0.0.1:{port}"
        yield server


@pytest.fixture(params=["file", "postgres"])
async def two_opens(request: pytest.FixtureRequest,
                    tmp_path: Path) -> AsyncIterator[tuple[GrantStore, GrantStore]]:
    if request.param == "file":
        yield FileGrantStore(tmp_path / "state"), FileGrantStore(tmp_path / "state")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    dsn = await server.new_database()
    keys = GrantKeys.parse(base64.b64encode(os.urandom(32)).decode())
    first, second = await PostgresGrantStore.open(dsn), await PostgresGrantStore.open(dsn)
    first.keys = second.keys = keys
    try:
        yield first, second
    finally:
        await first.aclose()
        await second.aclose()


async def test_replicas_sharing_a_grant_never_spend_a_refresh_token_twice(
    protected: OAuthServer, two_opens: tuple[GrantStore, GrantStore], tmp_path: Path
) -> None:
    store_a, store_b = two_opens
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store_a, show=follow)).ok
    async with Location.open(tmp_path / "a", state_dir=tmp_path / "a-state") as a, \
            Location.open(tmp_path / "b", state_dir=tmp_path / "b-state") as b, \
            ServerPool({"cloud": config}, a.tools, grants=store_a) as pool_a, \
            ServerPool({"cloud": config}, b.tools, grants=store_b) as pool_b:
        assert pool_a.health()["cloud"].state == pool_b.health()["cloud"].state == "ready"
        # A third process refreshes behind both pools' backs: each holds a refresh token that
        # is now spent, and must take the stored one instead.
        assert await UpstreamAuth("cloud", config, store_a).refresh_now()
        assert protected.grants.count("refresh_token") == 1
        # Both pools refresh ahead of expiry (every ~2 s here), on the same schedule.
        await eventually(lambda: protected.grants.count("refresh_token") >= 4, within=20,
                         what="three more refreshes by the two pools")
        for location in (a, b):
            outcome = await location.snapshot().execute("cloud_whoami", {}, ctx())
            assert outcome.status == "completed", outcome.error
        assert protected.reused == 0, "a spent refresh token was presented again"
        assert pool_a.health()["cloud"].state == pool_b.health()["cloud"].state == "ready"
    assert protected.grants.count("authorization_code") == 1  # never a new login


async def test_a_refusal_noted_after_another_login_leaves_the_new_tokens_usable(
    two_opens: tuple[GrantStore, GrantStore],
) -> None:
    """Replica B's call is refused (it holds no tokens after a logout) while a login through
    replica A stores new ones: B's note of the refusal lands after A's write, and another of
    B's tasks may have read A's record in between. It must not mark A's fresh tokens as
    needing a login (every replica would wait for a login that already happened), and B must
    still see the record as new, so its next request reloads it."""
    store_a, store_b = two_opens
    resource = "http://127.0.0.1:1/mcp"
    on_a = RecordStorage(store_a, "cloud", resource)
    on_b = RecordStorage(store_b, "cloud", resource)
    assert await on_b.note_login_required("authorization required", None, None)  # logged out
    assert await on_b.record() is not None
    seen_by_b = on_b.generation
    await on_a.set_tokens(OAuthToken(access_token="fresh", expires_in=60))  # the login via A
    # B's late note of a request that left without tokens, then of one with older tokens.
    assert not await on_b.note_login_required("authorization required", "read", None)
    assert not await on_b.note_login_required("authorization required", None, "old")
    stored = await store_a.get("cloud")
    assert stored is not None
    assert stored["tokens"]["access_token"] == "fresh"
    assert not stored.get("login_required") and not stored.get("pending_scope")
    assert on_b.generation == seen_by_b != stored["updated_at"]  # B reloads before its next call
    # Another task of B reads A's record before the late note: still not marked.
    assert await on_b.record() is not None
    assert not await on_b.note_login_required("authorization required", None, None)
    kept = await store_b.get("cloud")
    assert kept is not None and kept == stored
    # A refusal of the stored tokens themselves is noted.
    assert await on_b.note_login_required("the server refused the token", None, "fresh")
    noted = await store_b.get("cloud")
    assert noted is not None and noted["login_required"] == "the server refused the token"
    assert on_b.generation == on_b.marked == noted["updated_at"]


class _HeldOnce:
    """The protected server, but the next POST to /mcp without a token, once `armed`, waits
    for `release` before it is answered (with its 401)."""

    def __init__(self, app: OAuthServer) -> None:
        self.app = app
        self.armed = False
        self.arrived = anyio.Event()
        self.release = anyio.Event()

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if self.armed and scope["type"] == "http" and scope["path"] == "/mcp" and (
                b"authorization" not in dict(scope["headers"])):
            self.armed = False
            self.arrived.set()
            await self.release.wait()
        await self.app(scope, receive, send)


async def test_a_request_refused_before_a_login_elsewhere_is_sent_again_with_its_tokens(
    two_opens: tuple[GrantStore, GrantStore],
) -> None:
    """The fleet's logout-then-login-through-A sequence seen from replica B's provider: B's
    request leaves without tokens (logged out), A's login stores new ones, another of B's tasks
    reads them, and only then is B's request refused. B neither marks A's grant nor waits for
    another login: the request goes again with A's tokens, and B's login wait ends."""
    store_a, store_b = two_opens
    protected = OAuthServer()
    held = _HeldOnce(protected)
    async with live_server(held) as port:
        protected.base = f"http://127.0.0.1:{port}"
        config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
        assert (await login("cloud", config, store_a, show=follow)).ok
        on_b = UpstreamAuth("cloud", config, store_b)
        initialize = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
            "protocolVersion": "2025-06-18", "capabilities": {},
            "clientInfo": {"name": "b", "version": "1"}}}
        headers = {"Accept": "application/json, text/event-stream"}
        async with httpx2.AsyncClient(auth=on_b.auth, timeout=10) as http:
            first = await http.post(config.url, json=initialize, headers=headers)
            assert first.status_code == 200

            # The logout: the server forgets the grant, the store drops the tokens.
            protected.access.clear()
            protected.refresh.clear()
            await RecordStorage(store_a, "cloud", on_b.auth.storage.resource).forget_tokens()
            refused = await http.post(config.url, json=initialize, headers=headers)
            assert refused.status_code == 401 and on_b.hint() is not None
            marked = await store_b.get("cloud")
            assert marked is not None and marked["login_required"] == "authorization required"

            answers: list[int] = []

            async def call() -> None:
                answers.append((await http.post(config.url, json=initialize,
                                                headers=headers)).status_code)

            held.armed = True
            async with anyio.create_task_group() as tg:
                tg.start_soon(call)
                with anyio.fail_after(10):
                    await held.arrived.wait()
                assert (await login("cloud", config, store_a, show=follow)).ok  # through A
                assert await on_b.auth.storage.record() is not None  # B's other task reads it
                held.release.set()
            assert answers == [200]
            stored = await store_b.get("cloud")
            assert stored is not None and stored["tokens"] and not stored.get("login_required")
            assert protected.called == [] and protected.grants.count("authorization_code") == 2
            with anyio.fail_after(10):
                await on_b.wait_for_login()
            assert on_b.hint() is None
            again = await http.post(config.url, json=initialize, headers=headers)
            assert again.status_code == 200


async def test_a_refused_refresh_marks_the_tokens_it_spent(
    protected: OAuthServer, tmp_path: Path
) -> None:
    """`keep_fresh`'s refresh refused (the grant revoked at the server): the stored record, whose
    tokens are the ones that refresh spent, says a login is needed (for `auth status` and every
    process sharing it)."""
    store = FileGrantStore(tmp_path / "state")
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store, show=follow)).ok
    upstream = UpstreamAuth("cloud", config, store)
    protected.refresh.clear()
    assert not await upstream.refresh_now()
    stored = await store.get("cloud")
    assert stored is not None and stored["tokens"]
    assert stored["login_required"] == "refreshing the token failed (HTTP 400: invalid_grant)"

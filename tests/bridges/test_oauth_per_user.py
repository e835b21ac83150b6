"""Credentials per user (`oauth.per_user`) against the real test authorization server: each
user's call reaches the upstream with that user's own access token (the server records the
token of every tool call), a user without a grant, or whose grant the server no longer takes,
fails `needs_auth` naming `sidecar auth login cloud --user NAME` and sends nothing, and idle
users' connections close; in the state directory's grant file and sealed in the fleet
database. With `oauth.grant = "token_exchange"` each call's bearer token is
exchanged (RFC 8693, at the test server's /token) and the call carries the token issued."""

from __future__ import annotations

import base64
import itertools
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import CALLER_HEADERS, ServerPool
from bridges.mcp.oauth.login import login
from bridges.mcp.oauth.records import user_grant_key
from sidecar import Location
from sidecar.backends.local.grants import FileGrantStore
from sidecar.backends.postgres.grant_keys import GrantKeys
from sidecar.backends.postgres.grants import PostgresGrantStore
from sidecar.model.tool import ToolContext
from sidecar.stores.grants import GrantStore
from tests.bridges.helpers import eventually
from tests.bridges.oauth_server import OAuthServer
from tests.bridges.test_oauth import follow
from tests.fleet.postgres import PostgresServer
from tests.live_server import live_server

pytestmark = pytest.mark.anyio

_ids = itertools.count()


@pytest.fixture
async def protected() -> AsyncIterator[OAuthServer]:
    server = OAuthServer()
    async with live_server(server) as port:
        server.base = f"http://127.0.0.1:{port}"
        yield server


@pytest.fixture(params=["file", "postgres"])
async def grants(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[GrantStore]:
    """The state directory's grant file, or the fleet database (grants sealed with a key)."""
    if request.param == "file":
        yield FileGrantStore(tmp_path / "grants")
        return
    server: PostgresServer = request.getfixturevalue("postgres_server")
    store = await PostgresGrantStore.open(await server.new_database())
    store.keys = GrantKeys.parse(base64.b64encode(os.urandom(32)).decode())
    try:
        yield store
    finally:
        await store.aclose()


def as_user(user: str | None) -> ToolContext:
    return ToolContext(session_id="s1", agent="agent", message_id="m1",
                       call_id=f"per-user-{next(_ids)}",
                       owner=f"user:{user}" if user is not None else None)


async def test_each_user_calls_with_their_own_grant(
    location: Location, protected: OAuthServer, grants: GrantStore
) -> None:
    store = grants
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth", oauth={"per_user": True},
                          timeouts={"startup": 10})
    # The server's own login lists its tools; each user logs in for their calls.
    for key in ("cloud", *(user_grant_key("cloud", u) for u in ("alice", "bob", "dave"))):
        result = await login(key, config, store, show=follow)
        assert result.ok, result.message

    async def token(key: str) -> str:
        record = await store.get(key)
        assert record is not None
        return str(record["tokens"]["access_token"])

    alice, bob, own = (await token(user_grant_key("cloud", "alice")),
                       await token(user_grant_key("cloud", "bob")), await token("cloud"))
    assert len({alice, bob, own}) == 3
    async with ServerPool({"cloud": config}, location.tools, grants=store) as pool:
        assert pool.health()["cloud"].state == "ready"
        for user in ("alice", "bob", "alice"):
            outcome = await location.snapshot().execute("cloud_whoami", {}, as_user(user))
            assert outcome.status == "completed", outcome.error
            assert outcome.content[0].text == "authorized"  # type: ignore[union-attr]
        assert protected.called == [("whoami", alice), ("whoami", bob), ("whoami", alice)]

        # carol never logged in: told how, and nothing reaches the server.
        outcome = await location.snapshot().execute("cloud_whoami", {}, as_user("carol"))
        assert outcome.status == "error" and outcome.error is not None
        assert "needs_auth" in outcome.error.message
        assert "run `sidecar auth login cloud --user carol`" in outcome.error.message
        # a call without a user (a token not made for one) is refused the same way
        outcome = await location.snapshot().execute("cloud_whoami", {}, as_user(None))
        assert outcome.status == "error" and outcome.error is not None
        assert "needs_auth: this call has no user" in outcome.error.message
        assert len(protected.called) == 3

        # dave's grant is revoked at the authorization server: his call needs a login.
        record = await store.get(user_grant_key("cloud", "dave"))
        assert record is not None
        protected.access.pop(record["tokens"]["access_token"])
        protected.refresh.discard(record["tokens"]["refresh_token"])
        outcome = await location.snapshot().execute("cloud_whoami", {}, as_user("dave"))
        assert outcome.status == "error" and outcome.error is not None
        assert "run `sidecar auth login cloud --user dave`" in outcome.error.message, (
            outcome.error.message)
        assert len(protected.called) == 3
        # alice is unaffected; once idle, her connection closes
        outcome = await location.snapshot().execute("cloud_whoami", {}, as_user("alice"))
        assert outcome.status == "completed", outcome.error
        assert protected.called[-1] == ("whoami", alice)
        users = pool._supervisors["cloud"].caller.users  # the server's callers' connections
        assert users is not None
        assert users.open_users() == ["bob", "alice"]
        users.idle = 0.2
        await eventually(lambda: users.open_users() == [], within=10,
                         what="alice's idle connection closed")


async def test_token_exchange_gives_each_caller_a_token_of_their_own(
    location: Location, protected: OAuthServer, tmp_path: Path
) -> None:
    """RFC 8693 at the test server's /token: the call's bearer token (what the daemon's app
    puts in CALLER_HEADERS for each request) is exchanged once per user and token, and the
    call carries what it was exchanged for; a refused or missing token is needs_auth."""
    store = FileGrantStore(tmp_path / "grants")
    config = ServerConfig(url=f"{protected.base}/mcp", timeouts={"startup": 10}, oauth={
        "grant": "token_exchange", "idp_token_endpoint": f"{protected.base}/token",
        "idp_client_id": "exchanger", "idp_client_secret": "exchanger-secret"})
    assert (await login("cloud", config, store, show=follow)).ok  # the tool list

    async def whoami(user: str, bearer: str | None) -> Any:
        given = CALLER_HEADERS.set([(b"authorization", f"Bearer {bearer}".encode())]
                                   if bearer else [])
        try:
            return await location.snapshot().execute("cloud_whoami", {}, as_user(user))
        finally:
            CALLER_HEADERS.reset(given)

    async with ServerPool({"cloud": config}, location.tools, grants=store):
        for user, bearer in (("alice", "alice.1.jwt"), ("bob", "bob.1.jwt"),
                             ("alice", "alice.1.jwt"), ("alice", "alice.2.jwt")):
            outcome = await whoami(user, bearer)
            assert outcome.status == "completed", outcome.error
        resource = f"{protected.base}/mcp"
        assert [(s, r) for s, r, _ in protected.exchanged] == [
            ("alice.1.jwt", resource), ("bob.1.jwt", resource), ("alice.2.jwt", resource)]
        issued = [token for _, _, token in protected.exchanged]
        assert protected.called == [("whoami", issued[0]), ("whoami", issued[1]),
                                    ("whoami", issued[0]), ("whoami", issued[2])]
        protected.refuse.add("carol.1.jwt")
        for bearer, said in (("carol.1.jwt", "refused the exchange (HTTP 400: invalid_grant)"),
                             (None, "carries no access token of the identity provider"),
                             ("sct_local", "carries no access token of the identity provider")):
            outcome = await whoami("carol", bearer)
            assert outcome.status == "error" and outcome.error is not None
            assert "needs_auth" in outcome.error.message and said in outcome.error.message, (
                outcome.error.message)
        assert len(protected.called) == 4

"""Credentials per user (`oauth.per_user`) against the real test authorization server: each
user's call reaches the upstream with that user's own access token (the server records the
token of every tool call), a user without a grant, or whose grant the server no longer takes,
fails `needs_auth` naming `sidecar auth login cloud --user NAME` and sends nothing, and idle
users' connections close."""

from __future__ import annotations

import itertools
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from bridges.mcp.oauth.login import login
from bridges.mcp.oauth.records import user_grant_key
from sidecar import Location
from sidecar.backends.local.grants import FileGrantStore
from sidecar.model.tool import ToolContext
from tests.bridges.helpers import eventually
from tests.bridges.oauth_server import OAuthServer
from tests.bridges.test_oauth import follow
from tests.live_server import live_server

pytestmark = pytest.mark.anyio

_ids = itertools.count()


@pytest.fixture
async def protected() -> AsyncIterator[OAuthServer]:
    server = OAuthServer()
    async with live_server(server) as port:
        server.base = f"http://127.0.0.1:{port}"
        yield server


def as_user(user: str | None) -> ToolContext:
    return ToolContext(session_id="s1", agent="agent", message_id="m1",
                       call_id=f"per-user-{next(_ids)}",
                       owner=f"user:{user}" if user is not None else None)


async def test_each_user_calls_with_their_own_grant(
    location: Location, protected: OAuthServer, tmp_path: Path
) -> None:
    store = FileGrantStore(tmp_path / "grants")
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

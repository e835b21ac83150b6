"""OAuth upstreams against a real OAuth-protected MCP server (`oauth_server.py`, uvicorn on
127.0.0.1): a server that answers 401 waits in `needs_auth` naming the login command, without
retrying; `login` stores tokens and the waiting server connects; tokens survive a restart and
are refreshed (with rotation); logout revokes; the token file is 0600 and no token reaches the
log."""

from __future__ import annotations

import logging
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import httpx
import pytest

from bridges.manifest.loading import ServerConfig
from bridges.mcp import ServerPool
from bridges.mcp.oauth.login import login, logout
from sidecar import Location
from sidecar.backends.local.grants import FileGrantStore
from sidecar.model.errors import ErrorKind
from tests.bridges.helpers import ctx, eventually
from tests.bridges.oauth_server import OAuthServer
from tests.live_server import live_server

pytestmark = pytest.mark.anyio


@pytest.fixture
async def protected() -> AsyncIterator[OAuthServer]:
    server = OAuthServer(expires_in=4)
    async with live_server(server) as port:
        server.base = f"http://127.0.0.1:{port}"
        yield server


async def follow(url: str) -> None:
    """What the user's browser does: open the URL; the server redirects to our callback."""
    async with httpx.AsyncClient(follow_redirects=True, timeout=10) as http:
        response = await http.get(url)
    assert response.status_code == 200


@pytest.mark.parametrize("transport", ["http", "sse"])
async def test_a_401_server_waits_in_needs_auth_until_a_login(
    location: Location, protected: OAuthServer, tmp_path: Path, transport: str
) -> None:
    store = FileGrantStore(tmp_path / "state")
    path = "mcp" if transport == "http" else "sse"
    config = ServerConfig(url=f"{protected.base}/{path}", type=transport,
                          timeouts={"startup": 10})
    assert config.oauth_mode == "auto"
    async with ServerPool({"cloud": config}, location.tools, grants=store) as pool:
        health = pool.health()["cloud"]
        assert health.state == "needs_auth"
        assert health.last_error is not None
        assert "run `sidecar auth login cloud`" in health.last_error
        rejected = protected.rejected
        await anyio.sleep(2.5)  # no retry loop while waiting for the login
        assert protected.rejected == rejected

        result = await login("cloud", config, store, show=follow)
        assert result.ok, result.message
        await eventually(lambda: pool.health()["cloud"].state == "ready", what="ready")
        outcome = await location.snapshot().execute("cloud_whoami", {}, ctx())
        assert outcome.status == "completed", outcome.error
        assert outcome.content[0].text == "authorized"  # type: ignore[union-attr]
    mode = stat.S_IMODE(store.path.stat().st_mode)
    assert mode == 0o600


async def test_a_call_while_login_is_needed_names_the_command(
    location: Location, protected: OAuthServer, tmp_path: Path
) -> None:
    store = FileGrantStore(tmp_path / "state")
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store, show=follow)).ok
    async with ServerPool({"cloud": config}, location.tools, grants=store) as pool:
        assert pool.health()["cloud"].state == "ready"
        protected.access.clear()  # the server revokes every access token
        protected.refresh.clear()  # and the refresh tokens
        outcome = await location.snapshot().execute("cloud_whoami", {}, ctx())
        assert outcome.error is not None and outcome.error.kind is ErrorKind.UPSTREAM
        assert "sidecar auth login cloud" in outcome.error.message
        await eventually(lambda: pool.health()["cloud"].state == "needs_auth",
                         what="needs_auth")
        health = pool.health()["cloud"]
        assert health.last_error is not None and "refreshing the token failed" in (
            health.last_error)


async def test_tokens_survive_a_restart_and_are_refreshed(
    protected: OAuthServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    manifests = tmp_path / "manifests"
    manifests.mkdir()
    (manifests / "cloud.json").write_text(
        f'{{"mcpServers": {{"cloud": {{"url": "{protected.base}/mcp", "auth": "oauth"}}}}}}'
    )
    store = FileGrantStore(tmp_path / "state")
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store, show=follow)).ok
    first = await store.get("cloud")
    assert first is not None

    async def one_call() -> None:
        async with Location.open(tmp_path, state_dir=tmp_path / "state",
                                 manifests=[manifests]) as location:
            assert location.server_health()["cloud"].state == "ready"
            outcome = await location.snapshot().execute("cloud_whoami", {}, ctx())
            assert outcome.status == "completed", outcome.error

    await one_call()
    await anyio.sleep(4.2)  # the access token has expired: the restarted daemon refreshes it
    await one_call()
    assert "refresh_token" in protected.grants
    assert protected.grants.count("authorization_code") == 1  # never a new login
    record = await store.get("cloud")
    assert record is not None
    assert record["tokens"]["refresh_token"] != first["tokens"]["refresh_token"]  # rotated
    for secret in (first["tokens"]["access_token"], first["tokens"]["refresh_token"],
                   record["tokens"]["access_token"]):
        assert secret not in caplog.text

    assert "revoked" in await logout("cloud", config, store)
    assert record["tokens"]["refresh_token"] in protected.revoked
    assert await store.get("cloud") is None


async def test_the_token_is_refreshed_ahead_of_its_expiry(
    location: Location, protected: OAuthServer, tmp_path: Path
) -> None:
    store = FileGrantStore(tmp_path / "state")
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store, show=follow)).ok
    async with ServerPool({"cloud": config}, location.tools, grants=store) as pool:
        assert pool.health()["cloud"].state == "ready"
        # No call is made: the refresh comes from the background task, before expiry.
        await eventually(lambda: "refresh_token" in protected.grants, within=8,
                         what="a background refresh")
        rejected = protected.rejected
        outcome = await location.snapshot().execute("cloud_whoami", {}, ctx())
        assert outcome.status == "completed", outcome.error
        assert protected.rejected == rejected


async def test_calls_on_an_authorized_server_run_concurrently(
    location: Location, protected: OAuthServer, tmp_path: Path
) -> None:
    """The server answers with plain JSON when a call ends; were requests serialized while
    one waits for its answer, the two calls would never meet (each says "alone")."""
    store = FileGrantStore(tmp_path / "state")
    config = ServerConfig(url=f"{protected.base}/mcp", auth="oauth")
    assert (await login("cloud", config, store, show=follow)).ok
    async with ServerPool({"cloud": config}, location.tools, grants=store) as pool:
        assert pool.health()["cloud"].state == "ready"
        snapshot = location.snapshot()
        texts: list[str] = []

        async def meet(session: str) -> None:
            outcome = await snapshot.execute("cloud_meet", {}, ctx(session))
            assert outcome.status == "completed", outcome.error
            texts.append(outcome.content[0].text)  # type: ignore[union-attr]

        async with anyio.create_task_group() as tg:
            tg.start_soon(meet, "c1")
            tg.start_soon(meet, "c2")
        assert texts == ["met", "met"]

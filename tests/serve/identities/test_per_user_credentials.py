"""Credentials per user through a real `sidecar serve`: an HTTP server with `oauth.per_user =
true` in front of the real OAuth test server (tests/bridges/oauth_server.py, which records the
access token of every tool call). The server's own login (`sidecar auth login cloud`) lists
its tools; alice and bob log in with `sidecar auth login cloud --user NAME` and call through
`/v1` with local tokens made for them: each call reaches the upstream with the caller's own
access token. carol, who never logged in, is told `needs_auth` and the command to run.
dave logs himself in through `/v1/auth/cloud/login` (his local token: the role user) and
reaches only his own grant there. bob, signed in to the console through the OpenID provider
(the role user), sees his own grant of `cloud` and logs it in with the console's button.
`exchanged` (the same upstream with `oauth.grant = "token_exchange"`): a call made with an
access token of the real OpenID provider carries the token the test server's RFC 8693
endpoint exchanged that very token for; a local token is never sent for exchange."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from sidecar.backends.local.grants import FileGrantStore
from tests.bridges.oauth_server import OAuthServer
from tests.bridges.test_oauth import follow
from tests.live_server import live_server
from tests.serve.identities.conftest import SIDECAR, Daemon, Provider, auth_manifest, start_daemon
from tests.serve.test_observability import stop

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def sidecar(daemon: Daemon, *args: str) -> str:
    done = await anyio.run_process([*SIDECAR, *args], env=daemon.env, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def log_in(daemon: Daemon, *args: str) -> None:
    """`sidecar auth login ... --no-browser`, its URL followed as a browser would."""
    async with await anyio.open_process(
            [*SIDECAR, "auth", "login", *args, "--no-browser"], env=daemon.env) as cli:
        assert cli.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await cli.stdout.receive(1)
        await follow(line.decode().strip())
        assert await cli.wait() == 0


async def call(client: httpx.AsyncClient, call_id: str, tool: str = "cloud_whoami"
               ) -> dict[str, Any]:
    snap = await client.post("/v1/snapshots", json={"session_id": call_id, "profile": "small"})
    assert snap.status_code == 201, snap.text
    response = await client.post(f"/v1/snapshots/{snap.json()['id']}/calls", json={
        "name": tool, "input": {}, "context": {
            "session_id": call_id, "agent": "a", "message_id": "m", "call_id": call_id}})
    body: dict[str, Any] = response.json()
    return body


async def test_each_user_reaches_the_upstream_with_their_own_grant(
        oidc_provider: Provider, tmp_path: Path) -> None:
    protected = OAuthServer()
    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        root = tmp_path / "daemon"
        (root / "manifests").mkdir(parents=True)
        (root / "manifests" / "cloud.json").write_text(json.dumps({"mcpServers": {"cloud": {
            "url": f"{protected.base}/mcp", "auth": "oauth", "oauth": {"per_user": True},
            "timeouts": {"startup": 10}}, "exchanged": {
            "url": f"{protected.base}/mcp", "timeouts": {"startup": 10}, "oauth": {
                "grant": "token_exchange", "idp_token_endpoint": f"{protected.base}/token",
                "idp_client_id": "exchanger", "idp_client_secret": "exchanger-secret"}}}}))
        manifest = auth_manifest(oidc_provider.issuer).replace(
            'include = ["numbers"]', 'include = ["numbers", "cloud_whoami", "exchanged_whoami"]')
        proc, daemon = await anyio.to_thread.run_sync(start_daemon, root, manifest)
        try:
            await scenario(daemon, protected)
            await exchange(daemon, protected, oidc_provider)
        finally:
            await anyio.to_thread.run_sync(stop, proc)


async def scenario(daemon: Daemon, protected: OAuthServer) -> None:
    for server in ("cloud", "exchanged"):  # the servers' own logins: their tool lists
        await log_in(daemon, server)
    await console_login(daemon, "bob")
    for user in ("alice", "bob"):
        await log_in(daemon, "cloud", "--user", user)
    status = json.loads(await sidecar(daemon, "auth", "status", "--json"))
    assert status["cloud@user:alice"]["authorized"], status
    secrets = {}
    for user in ("alice", "bob", "carol", "dave"):
        made = await sidecar(daemon, "token", "create", "--profile", "small", "--user", user,
                             "--json")
        secrets[user] = json.loads(made)["token"]
    grants = FileGrantStore(daemon.state)
    tokens = {}
    for user in ("alice", "bob"):
        record = await grants.get(f"cloud@user:{user}")
        assert record is not None
        tokens[user] = record["tokens"]["access_token"]

    secrets["admin"] = daemon.token

    def client(user: str) -> httpx.AsyncClient:
        return httpx.AsyncClient(base_url=daemon.url, timeout=30,
                                 headers={"authorization": f"Bearer {secrets[user]}"})

    async with client("alice") as alice, client("bob") as bob, client("carol") as carol, \
            client("admin") as admin:
        deadline = anyio.current_time() + 20
        while True:  # the daemon reconnects within a second of the server's own login
            health = (await admin.get("/v1/health")).json()
            if health["servers"]["cloud"]["state"] == "ready":
                break
            assert anyio.current_time() < deadline, health["servers"]["cloud"]
            await anyio.sleep(0.05)
        for caller, call_id in ((alice, "a-1"), (bob, "b-1"), (alice, "a-2")):
            outcome = await call(caller, call_id)
            assert outcome["status"] == "completed", outcome
        assert protected.called == [("whoami", tokens["alice"]), ("whoami", tokens["bob"]),
                                    ("whoami", tokens["alice"])]
        refused = await call(carol, "c-1")
        assert refused["status"] == "error", refused
        assert "needs_auth" in refused["error"]["message"]
        assert "sidecar auth login cloud --user carol" in refused["error"]["message"]
        assert len(protected.called) == 3
        await self_login(client("dave"), admin, protected, grants)


async def submit(http: httpx.AsyncClient, page: httpx.Response,
                 **fields: str) -> httpx.Response:
    """Submit the page's first form (its hidden fields and `fields`), as a browser would."""
    form = re.search(r'<form[^>]*action="([^"]*)"[^>]*>(.*?)</form>', page.text, re.S)
    assert form is not None, page.text
    hidden = dict(re.findall(r'<input type="?hidden"? name="?([\w-]+)"? value="([^"]*)"',
                             form.group(2)))
    return await http.post(page.url.join(form.group(1).replace("&amp;", "&")),
                           data={**hidden, **fields})


async def console_login(daemon: Daemon, user: str) -> None:
    """`user` signs in to the console through the provider's own forms, sees their grant of
    `cloud` unauthorized, and the log in button sends them to the authorization URL of
    THEIR grant; once followed, the console shows it authorized."""
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30,
                                 follow_redirects=True) as http:
        page = await http.get("/ui/login/oidc")  # the provider's login form
        page = await submit(http, page, login=user, password="any")  # its consent form
        page = await submit(http, page)  # back to /ui/login/callback, then /ui
        if "/ui/login/callback" in str(page.url):
            page = await http.get("/ui")
        assert f"Signed in as <strong>{user}</strong> (user)" in page.text, page.text
        assert "Your logins" in page.text
        grant = re.search(r'class="own-grant">([^<]*)<', page.text)
        assert grant is not None and grant.group(1) != "authorized", page.text
        assert f"sidecar auth login cloud --user {user}" in page.text
        csrf = re.search(r'name=csrf value="([^"]+)"', page.text)
        assert csrf is not None
        forged = await http.post("/ui/servers/cloud/login", data={"csrf": "forged"})
        assert forged.status_code == 403
        started = await http.post("/ui/servers/cloud/login", data={"csrf": csrf.group(1)},
                                  follow_redirects=False)
        assert started.status_code == 303, started.text
        url = started.headers["location"]
        running = (await http.get("/v1/auth/cloud", params={"user": user}, headers={
            "authorization": f"Bearer {daemon.token}"})).json()
        assert running["user"] == user and running["login"]["authorization_url"] == url
        await follow(url)
        deadline = anyio.current_time() + 20
        while True:
            grant = re.search(r'class="own-grant">([^<]*)<', (await http.get("/ui")).text)
            if grant is not None and grant.group(1) == "authorized":
                break
            assert anyio.current_time() < deadline, "the console login did not finish"
            await anyio.sleep(0.05)
        refused = await http.post("/ui/servers/exchanged/login", data={"csrf": csrf.group(1)})
        assert refused.status_code == 400 and "per user" in refused.text


async def self_login(client: httpx.AsyncClient, admin: httpx.AsyncClient,
                     protected: OAuthServer, grants: FileGrantStore) -> None:
    async with client as dave:
        before = (await dave.get("/v1/auth/cloud")).json()
        assert before["user"] == "dave" and before["needs_login"], before
        assert before["command"] == "sidecar auth login cloud --user dave"
        started = await dave.post("/v1/auth/cloud/login")
        assert started.status_code == 202, started.text
        await follow(started.json()["authorization_url"])
        deadline = anyio.current_time() + 20
        while not (await dave.get("/v1/auth/cloud")).json()["authorized"]:
            assert anyio.current_time() < deadline, "dave's login did not finish"
            await anyio.sleep(0.05)
        outcome = await call(dave, "d-1")
        assert outcome["status"] == "completed", outcome
        record = await grants.get("cloud@user:dave")
        assert record is not None
        assert protected.called[-1] == ("whoami", record["tokens"]["access_token"])
        for path in ("/v1/auth/exchanged", "/v1/auth/cloud?user=alice"):
            refused = await dave.get(path)
            assert refused.status_code == 403, refused.text
            assert refused.json()["error"]["code"] == "forbidden_role"
        alices = (await admin.get("/v1/auth/cloud", params={"user": "alice"})).json()
        assert alices["user"] == "alice" and alices["authorized"], alices


async def exchange(daemon: Daemon, protected: OAuthServer, provider: Provider) -> None:
    alice_jwt = await anyio.to_thread.run_sync(provider.token, "alice")
    local = json.loads(await sidecar(daemon, "token", "create", "--profile", "small",
                                     "--user", "alice", "--json"))["token"]
    async with httpx.AsyncClient(base_url=daemon.url, timeout=30, headers={
            "authorization": f"Bearer {alice_jwt}"}) as alice, httpx.AsyncClient(
            base_url=daemon.url, timeout=30, headers={
            "authorization": f"Bearer {local}"}) as alice_local:
        deadline = anyio.current_time() + 20
        while True:
            outcome = await call(alice, f"x-{anyio.current_time()}", "exchanged_whoami")
            if outcome["status"] == "completed" or anyio.current_time() > deadline:
                break
            await anyio.sleep(0.1)  # the server's own login is picked up within a second
        assert outcome["status"] == "completed", outcome
        subject, resource, issued = protected.exchanged[-1]
        assert (subject, resource) == (alice_jwt, f"{protected.base}/mcp")
        assert protected.called[-1] == ("whoami", issued)
        exchanges = len(protected.exchanged)
        refused = await call(alice_local, "x-local", "exchanged_whoami")
        assert refused["status"] == "error", refused
        assert "carries no access token of the identity provider" in refused["error"]["message"]
        assert len(protected.exchanged) == exchanges

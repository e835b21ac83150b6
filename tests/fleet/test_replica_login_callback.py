"""An OAuth login started on one replica completes on another: two `sidecar serve` replicas (A,
B) on one real PostgreSQL database, both with `SIDECAR_PUBLIC_URL` pointing at B's address
(what a load balancer in front of the fleet does: the browser's redirect may reach any
replica), in front of a real OAuth-protected MCP server and its authorization server
(tests/bridges/oauth_server.py).

The login starts with `POST /v1/auth/cloud/login` on A; the "browser" (httpx following the
authorize redirect) lands on B's `/v1/auth/cloud/callback` without a bearer token; B exchanges
the code (the verifier came through the database, sealed) and stores the grant; A (whose
login reports `authorized`) and B connect and call the server. Then the state attacks: the
same redirect again (used), a made-up state (unknown), none (missing), a state past its expiry
(expired), each 400 naming it and exchanging nothing; an `error=` from the authorization
server is 400 naming it and the login that started it reports it. Neither replica's log holds
the code or the state. Then the same through a real HAProxy in front of both replicas, with
the gateway's public name as the public URL. B shows A's login while it waits and once it
ended. A token endpoint that does not answer, or a receiving replica killed mid-exchange, fails
the login within the exchange bound (`SIDECAR_LOGIN_EXCHANGE_TIMEOUT`)."""

from __future__ import annotations

import base64
import os
import secrets
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import anyio
import asyncpg
import httpx
import pytest

from sidecar.stores.pending_logins import state_key
from tests.bridges.helpers import free_port
from tests.bridges.oauth_server import OAuthServer
from tests.fleet.haproxy import HAProxy
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replica_grants import call_whoami, replicas, until
from tests.live_server import live_server

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]


@asynccontextmanager
async def fleet(postgres_server: PostgresServer, tmp_path: Path, public_url: str,
                port_b: int = 0, extra: dict[str, str] | None = None) -> AsyncIterator[Fleet]:
    """Replicas A and B (B on `port_b`) on one database, both with `public_url` (and `extra`
    in their environment), in front of the OAuth-protected server; their logs are printed when
    the body fails."""
    protected = OAuthServer()
    dsn = await postgres_server.new_database()
    token = secrets.token_urlsafe(32)
    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        manifests = protected.manifests(tmp_path / "manifests")
        common = {"SIDECAR_MANIFESTS": str(manifests), "SIDECAR_DATABASE_URL": dsn,
                  "SIDECAR_TOKEN": token,
                  "SIDECAR_GRANT_KEY": base64.b64encode(os.urandom(32)).decode(),
                  "SIDECAR_PUBLIC_URL": public_url, **(extra or {})}
        processes: dict[str, subprocess.Popen[bytes]] = {}
        async with replicas(tmp_path, token, {"a": (common, 0), "b": (common, port_b)},
                            processes) as clients:
            yield Fleet(protected, clients["a"], clients["b"], dsn, token, processes)


@dataclass
class Fleet:
    protected: OAuthServer
    a: httpx.AsyncClient
    b: httpx.AsyncClient
    dsn: str
    token: str
    processes: dict[str, subprocess.Popen[bytes]]


async def test_a_login_started_on_a_completes_on_b_and_bad_states_are_refused(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    port_b = free_port()
    async with fleet(postgres_server, tmp_path, f"http://127.0.0.1:{port_b}/", port_b) as f:
        await _scenario(f.protected, {"a": f.a, "b": f.b}, f.dsn, tmp_path)


async def test_logins_through_a_load_balancer_complete_on_either_replica(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """A real HAProxy (round-robin) in front of A and B, which know the gateway's public name:
    each login is started through the proxy and its redirect comes back through the proxy,
    whichever replica each lands on; across the two logins (a request in between flips the
    round-robin) one is started and finished on different replicas."""
    async with fleet(postgres_server, tmp_path, "http://gateway.test") as f:
        ports = [int(str(c.base_url).rsplit(":", 1)[1].strip("/")) for c in (f.a, f.b)]
        proxy = await anyio.to_thread.run_sync(lambda: HAProxy.start(tmp_path, ports))
        try:
            async with httpx.AsyncClient(
                base_url=proxy.url, timeout=30,
                headers={"authorization": f"Bearer {f.token}", "host": "gateway.test"},
            ) as gateway, httpx.AsyncClient(timeout=30) as browser:
                pairs = []
                for turn in range(2):
                    begun = await gateway.post("/v1/auth/cloud/login")
                    assert begun.status_code == 202, begun.text
                    if turn == 1:
                        await gateway.get("/v1/health")
                    back = httpx.URL((await browser.get(
                        begun.json()["authorization_url"])).headers["location"])
                    assert (back.host, back.path) == ("gateway.test", "/v1/auth/cloud/callback")
                    landed = await browser.get(f"{proxy.url}{back.raw_path.decode()}",
                                               headers={"host": "gateway.test"})
                    assert landed.headers["sidecar-login"] == "authorized", landed.text
                    pairs.append((begun.headers["sidecar-replica"],
                                  landed.headers["sidecar-replica"]))
                    # the next POST comes at once: a login whose redirect came back is never
                    # joined, even before its replica has looked at the outcome
                assert any(started != finished for started, finished in pairs), pairs
                assert f.protected.grants.count("authorization_code") == 2
                for client in (f.a, f.b):
                    await until(lambda c=client: _ready(c), "connected after the logins")
                    called = await call_whoami(client, f"whoami-{secrets.token_hex(4)}")
                    assert called["status"] == "completed", called
        finally:
            await anyio.to_thread.run_sync(proxy.stop)


async def test_a_login_finished_elsewhere_is_never_joined(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """A new login on A right after B finished A's previous one (before A's next look at the
    outcome, every 0.5 s) starts afresh: joining would hand out the spent state, and the
    browser would get `used_state`. Each turn's login is the one the turn before started."""
    port_b = free_port()
    async with fleet(postgres_server, tmp_path, f"http://127.0.0.1:{port_b}/", port_b) as f:
        begun = await f.a.post("/v1/auth/cloud/login")
        for _ in range(3):
            assert begun.status_code == 202, begun.text
            url = begun.json()["authorization_url"]
            landed = await browse(url)
            assert (landed.headers["sidecar-replica"], landed.headers["sidecar-login"]) == (
                "replica-b", "authorized"), landed.text
            again = await f.a.post("/v1/auth/cloud/login")  # at once
            assert again.status_code == 202, again.text
            assert _state(again.json()["authorization_url"]) != _state(url)
            begun = again
        assert f.protected.grants.count("authorization_code") == 3
        await until(lambda: _ready(f.a), "A connected")
        called = await call_whoami(f.a, "whoami-after-three")
        assert called["status"] == "completed", called


async def test_a_slow_token_endpoint_or_a_receiver_that_dies_mid_exchange_fails_the_login(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    """With `SIDECAR_LOGIN_EXCHANGE_TIMEOUT=2`: a token endpoint that never answers is a 502
    on the page after 2 s, and the login on A fails with it (A would call it unfinished only
    after 4 s); a receiving replica killed (-9) while it waits on the token endpoint fails the
    login on A within twice the timeout (not the 5 minutes of the state), naming that
    replica."""
    port_b = free_port()
    async with fleet(postgres_server, tmp_path, f"http://127.0.0.1:{port_b}/", port_b,
                     {"SIDECAR_LOGIN_EXCHANGE_TIMEOUT": "2"}) as f:
        f.protected.token_gate = gate = anyio.Event()
        try:
            begun = await f.a.post("/v1/auth/cloud/login")
            assert begun.status_code == 202, begun.text
            landed = await browse(begun.json()["authorization_url"])
            assert (landed.status_code, landed.headers["sidecar-login"]) == (
                502, "exchange_failed"), landed.text
            assert "did not answer within 2 s" in landed.text
            failed = await until(lambda: _login_ended(f.a), "A's login reporting the 502")
            assert failed["state"] == "failed" and "within 2 s" in failed["message"], failed

            begun = await f.a.post("/v1/auth/cloud/login")
            assert begun.status_code == 202, begun.text
            asked = len(f.protected.grants)
            async with httpx.AsyncClient(timeout=30) as browser:
                back = (await browser.get(begun.json()["authorization_url"])).headers["location"]
                async with anyio.create_task_group() as tg:
                    tg.start_soon(_quietly, browser.get(back))  # B takes it, asks for tokens
                    await until(lambda: _true(len(f.protected.grants) > asked),
                                "B at the token endpoint")
                    f.processes["b"].kill()
                    await anyio.to_thread.run_sync(f.processes["b"].wait)
            ended = await until(lambda: _login_ended(f.a), "A's login failing, B gone")
            assert ended["state"] == "failed", ended
            assert "replica-b" in ended["message"] and "did not finish" in ended["message"]
            assert ended == (await f.a.get("/v1/auth/cloud")).json()["login"]
        finally:
            gate.set()


async def _quietly(request: Any) -> None:
    """A request whose end does not matter (its server is about to die)."""
    try:
        await request
    except httpx.HTTPError:
        pass


async def _true(value: bool) -> bool:
    return value


async def _ready(client: httpx.AsyncClient) -> bool:
    return bool((await client.get("/v1/health")).json()["servers"]["cloud"]["state"] == "ready")


def _state(url: str) -> str:
    return parse_qs(urlsplit(url).query)["state"][0]


async def _login_ended(client: httpx.AsyncClient) -> dict[str, Any] | None:
    login = (await client.get("/v1/auth/cloud")).json()["login"]
    return login if login is not None and login["state"] != "pending" else None


async def browse(url: str) -> httpx.Response:
    """The user's browser: opens the URL and follows the redirects, with no bearer token."""
    async with httpx.AsyncClient(follow_redirects=True, timeout=30) as browser:
        return await browser.get(url)


async def _scenario(protected: OAuthServer, clients: dict[str, httpx.AsyncClient], dsn: str,
                    tmp_path: Path) -> None:
    a, b = clients["a"], clients["b"]
    public = str(b.base_url).rstrip("/")

    async def ready(client: httpx.AsyncClient) -> bool:
        health = (await client.get("/v1/health")).json()["servers"]["cloud"]
        return bool(health["state"] == "ready")

    assert not await ready(a) and not await ready(b)

    # The login starts on A; its redirect URI is the public URL (B), not A's loopback.
    begun = await a.post("/v1/auth/cloud/login")
    assert begun.status_code == 202, begun.text
    authorize = begun.json()["authorization_url"]
    asked = parse_qs(urlsplit(authorize).query)
    assert asked["redirect_uri"] == [f"{public}/v1/auth/cloud/callback"]
    # B did not start it and has no URL to show, but knows the login is waiting, and where
    on_b = (await b.get("/v1/auth/cloud")).json()["login"]
    assert (on_b["state"], on_b["replica"], on_b["authorization_url"]) == (
        "pending", "replica-a", None), on_b
    assert (await a.get("/v1/auth/cloud")).json()["login"]["authorization_url"] == authorize
    landed = await browse(authorize)
    assert landed.status_code == 200, landed.text
    assert landed.headers["sidecar-replica"] == "replica-b"
    assert landed.headers["sidecar-login"] == "authorized"
    assert "cloud: authorized" in landed.text
    redirect = str(landed.url)  # what the browser was sent to: code and state
    code = parse_qs(urlsplit(redirect).query)["code"][0]
    state = parse_qs(urlsplit(redirect).query)["state"][0]
    assert code not in landed.text and state not in landed.text

    await until(lambda: ready(a), "A ready after the login finished on B")
    await until(lambda: ready(b), "B ready after the login it finished")

    login = await until(lambda: _login_ended(a), "A's login reporting its end")
    assert login["state"] == "authorized", login
    on_b = (await b.get("/v1/auth/cloud")).json()["login"]
    assert (on_b["state"], on_b["replica"]) == ("authorized", "replica-a"), on_b
    called = await call_whoami(a, "whoami-a-1")
    assert called["status"] == "completed", called
    assert called["content"][0]["text"] == "authorized"
    assert protected.grants.count("authorization_code") == 1

    # The state attacks, on B's callback (no bearer token, as a browser).
    callback = f"{public}/v1/auth/cloud/callback"
    replay = await browse(redirect)
    assert (replay.status_code, replay.headers["sidecar-login"]) == (400, "used_state")
    assert "already completed" in replay.text
    unknown = await browse(f"{callback}?state={secrets.token_urlsafe(32)}&code=abc")
    assert (unknown.status_code, unknown.headers["sidecar-login"]) == (400, "unknown_state")
    missing = await browse(f"{callback}?code=abc")
    assert (missing.status_code, missing.headers["sidecar-login"]) == (400, "missing_state")
    assert "no state" in missing.text
    elsewhere = await browse(f"{public}/v1/auth/other/callback?{urlsplit(redirect).query}")
    assert elsewhere.status_code == 400  # a state of `cloud` does not serve another server

    again = await a.post("/v1/auth/cloud/login")  # a second login, left past its expiry
    assert again.status_code == 202, again.text
    async with httpx.AsyncClient(timeout=30) as browser:
        sent_back = (await browser.get(again.json()["authorization_url"])).headers["location"]
    late_state = parse_qs(urlsplit(sent_back).query)["state"][0]
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute("UPDATE sidecar_pending_logins SET expires_at = now() - "
                           "interval '1 second' WHERE key = $1", state_key(late_state))
    finally:
        await conn.close()
    expired = await browse(sent_back)
    assert (expired.status_code, expired.headers["sidecar-login"]) == (400, "expired_state")
    assert "expired" in expired.text
    assert protected.grants.count("authorization_code") == 1  # nothing exchanged

    # The authorization server refuses (the user said no): named on the page, and the login
    # (started on B this time: A's second one is still pending) reports it.
    protected.deny = "access_denied"
    denied_login = await b.post("/v1/auth/cloud/login")
    assert denied_login.status_code == 202, denied_login.text
    denied = await browse(denied_login.json()["authorization_url"])
    assert (denied.status_code, denied.headers["sidecar-login"]) == (
        400, "authorization_refused")
    assert "error=access_denied" in denied.text and "the user said no" in denied.text

    failed = await until(lambda: _login_ended(b), "B's refused login reporting its end")
    assert failed["state"] == "failed" and "access_denied" in failed["message"], failed

    for name in ("a", "b"):
        log = (tmp_path / name / "serve.log").read_text(errors="replace")
        assert code not in log and state not in log and late_state not in log, name

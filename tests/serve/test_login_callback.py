"""The OAuth login callback of one `sidecar serve` without a fleet database (pending logins in
memory), against a real OAuth-protected server (tests/bridges/oauth_server.py).

With `SIDECAR_PUBLIC_URL=https://gateway.test/sidecar/` (a reverse proxy in front, which the
test plays: it forwards the redirect with the public Host and without the path prefix) the
login redirects to `https://gateway.test/sidecar/v1/auth/cloud/callback`, which the browser
reaches without a bearer token; the public Host is allowed, another is not; the server becomes
ready, and the same redirect again is refused as used. Without it, nothing
changes: the login redirects to a loopback listener (`http://127.0.0.1:PORT/callback`) and
the callback route answers 404 `not_configured`. A malformed public URL or exchange timeout
stops `serve` with one line naming the variable."""

from __future__ import annotations

import os
import secrets
import subprocess
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

import anyio
import httpx
import pytest

from sidecar.stores.pending_logins import exchange_timeout_from_env, public_url_from_env
from tests.bridges.helpers import free_port
from tests.bridges.oauth_server import OAuthServer
from tests.fleet.test_replica_grants import SIDECAR, start, stop, until
from tests.live_server import live_server

# the daemon is a process of its own: one event loop in the test is enough
one_loop = pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])


@pytest.mark.anyio
@one_loop
async def test_public_url_callback_in_memory_and_loopback_without_it(tmp_path: Path) -> None:
    protected = OAuthServer()
    token = secrets.token_urlsafe(32)
    port = free_port()
    async with live_server(protected) as upstream:
        protected.base = f"http://127.0.0.1:{upstream}"
        manifests = protected.manifests(tmp_path / "manifests")
        common = {"SIDECAR_MANIFESTS": str(manifests), "SIDECAR_TOKEN": token}
        public, _ = await anyio.to_thread.run_sync(lambda: start(
            tmp_path / "public", "public",
            {**common, "SIDECAR_PUBLIC_URL": "https://gateway.test/sidecar/"}, port))
        try:
            await _through_the_public_url(f"http://127.0.0.1:{port}", token)
        finally:
            await anyio.to_thread.run_sync(stop, public)
        plain, url = await anyio.to_thread.run_sync(
            lambda: start(tmp_path / "plain", "plain", common))
        try:
            await _loopback_as_before(url, token)
        finally:
            await anyio.to_thread.run_sync(stop, plain)


async def _through_the_public_url(base: str, token: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30,
                                 headers={"authorization": f"Bearer {token}"}) as client:
        begun = await client.post("/v1/auth/cloud/login")
        assert begun.status_code == 202, begun.text
        authorize = begun.json()["authorization_url"]
        assert parse_qs(urlsplit(authorize).query)["redirect_uri"] == [
            "https://gateway.test/sidecar/v1/auth/cloud/callback"]
        async with httpx.AsyncClient(timeout=30) as browser:
            sent_back = urlsplit((await browser.get(authorize)).headers["location"])
            assert (sent_back.netloc, sent_back.path) == (
                "gateway.test", "/sidecar/v1/auth/cloud/callback")
            # what the reverse proxy forwards: the path without its prefix, the public Host
            # (allowed because it is the public URL's; another name is not), no bearer token
            forwarded = f"{base}/v1/auth/cloud/callback?{sent_back.query}"
            other = await browser.get(forwarded, headers={"host": "elsewhere.test"})
            assert (other.status_code, other.json()["error"]["code"]) == (403, "forbidden_host")
            landed = await browser.get(forwarded, headers={"host": "gateway.test"})
            assert landed.status_code == 200, landed.text
            assert landed.headers["sidecar-login"] == "authorized"
            assert landed.headers["content-type"].startswith("text/html")
            assert landed.headers["cache-control"] == "no-store"
            again = await browser.get(forwarded, headers={"host": "gateway.test"})
            assert (again.status_code, again.headers["sidecar-login"]) == (400, "used_state")

        async def ready() -> bool:
            health = (await client.get("/v1/health")).json()["servers"]["cloud"]
            login = (await client.get("/v1/auth/cloud")).json()["login"]
            return health["state"] == "ready" and login["state"] == "authorized"

        await until(ready, "ready and the login authorized")


async def _loopback_as_before(base: str, token: str) -> None:
    async with httpx.AsyncClient(base_url=base, timeout=30,
                                 headers={"authorization": f"Bearer {token}"}) as client:
        refused = await client.get("/v1/auth/cloud/callback?state=x&code=y")
        assert (refused.status_code, refused.headers["sidecar-login"]) == (404, "not_configured")
        assert "SIDECAR_PUBLIC_URL" in refused.text
        begun = await client.post("/v1/auth/cloud/login")
        assert begun.status_code == 202, begun.text
        redirect = parse_qs(urlsplit(begun.json()["authorization_url"]).query)["redirect_uri"]
        loopback = urlsplit(redirect[0])
        assert (loopback.hostname, loopback.path) == ("127.0.0.1", "/callback")


@pytest.mark.parametrize(("variable", "value", "said"), [
    ("SIDECAR_PUBLIC_URL", "gateway.example",
     "SIDECAR_PUBLIC_URL='gateway.example' is not an absolute http(s) URL"),
    ("SIDECAR_LOGIN_EXCHANGE_TIMEOUT", "soon",
     "SIDECAR_LOGIN_EXCHANGE_TIMEOUT='soon' is not a number of seconds in (0, 3600]"),
])
def test_a_malformed_login_setting_stops_serve_with_one_line(
    tmp_path: Path, variable: str, value: str, said: str
) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "state"), SIDECAR_TOKEN=secrets.token_urlsafe(32),
               SIDECAR_PUBLIC_URL="https://gateway.example")
    env[variable] = value
    run = subprocess.run([*SIDECAR, "serve", "--port", "0"], env=env, capture_output=True,
                         text=True, timeout=60, check=False)
    assert run.returncode == 6, run.stderr
    assert said in run.stderr
    assert "Traceback" not in run.stderr


def test_the_exchange_timeout_setting() -> None:
    assert exchange_timeout_from_env({}) == 30.0
    assert exchange_timeout_from_env({"SIDECAR_LOGIN_EXCHANGE_TIMEOUT": " 2.5 "}) == 2.5
    for bad in ("0", "-1", "nan", "inf", "3601", "soon"):
        with pytest.raises(ValueError, match="SIDECAR_LOGIN_EXCHANGE_TIMEOUT"):
            exchange_timeout_from_env({"SIDECAR_LOGIN_EXCHANGE_TIMEOUT": bad})


def test_the_public_url_setting() -> None:
    assert public_url_from_env({}) is None
    assert public_url_from_env({"SIDECAR_PUBLIC_URL": " "}) is None
    assert public_url_from_env({"SIDECAR_PUBLIC_URL": "https://gw.example/sidecar/"}) == (
        "https://gw.example/sidecar")
    for bad in ("gw.example", "ftp://gw.example", "https://gw.example/?a=1",
                "https://user@gw.example", "https://gw.example/#x"):
        with pytest.raises(ValueError, match="SIDECAR_PUBLIC_URL"):
            public_url_from_env({"SIDECAR_PUBLIC_URL": bad})

"""OAuth grants shared by replicas: `sidecar serve` replicas A and B (each its own state
directory) and C on one real PostgreSQL database, in front of a real OAuth-protected MCP
server whose authorization server rotates refresh tokens (tests/bridges/oauth_server.py, served
by this test on 127.0.0.1).

One `sidecar auth login cloud --store URL` (the CLI, with the replicas' SIDECAR_GRANT_KEY)
serves both A and B: they leave `needs_auth`, `GET /v1/auth/cloud` on B says authorized, and a
call through B reaches the protected server. Both refresh the shared grant ahead of its
expiry (every ~2 s here) without ever presenting a spent refresh token, and never log in
again. After `sidecar auth logout` a call through B is refused; a login started through A's
`POST /v1/auth/cloud/login` then serves B. C runs without the key: its health and
`/v1/auth/cloud` name SIDECAR_GRANT_KEY."""

from __future__ import annotations

import base64
import os
import secrets
import signal
import subprocess
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.bridges.oauth_server import OAuthServer
from tests.bridges.test_oauth import follow
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import SIDECAR
from tests.live_server import live_server

# the replicas are processes of their own: one event loop in the test is enough
pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]
WAIT = 60.0
"""A hang guard for what the replicas do on their own (reconnect, refresh)."""


async def until(check: Any, what: str) -> Any:
    deadline = time.monotonic() + WAIT
    while not (result := await check()):
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}"
        await anyio.sleep(0.1)
    return result


async def call_whoami(client: httpx.AsyncClient, call_id: str) -> dict[str, Any]:
    snapshot = (await client.post("/v1/snapshots", json={"session_id": "s"})).json()["id"]
    answer = await client.post(f"/v1/snapshots/{snapshot}/calls", json={
        "name": "cloud_whoami", "input": {}, "context": {
            "session_id": "s", "agent": "a", "message_id": "m", "call_id": call_id}})
    return dict(answer.json())


def start(root: Path, name: str, env_extra: dict[str, str],
          port: int = 0) -> tuple[subprocess.Popen[bytes], str]:
    """`sidecar serve` with its log in `root/serve.log` (read back when a check fails)."""
    root.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_REPLICA_ID=f"replica-{name}",
               **env_extra)
    log = root / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*SIDECAR, "serve", "--port", str(port)], env=env, stderr=out)
    deadline = time.monotonic() + WAIT
    while "listening on " not in (text := log.read_text(errors="replace")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"replica {name} did not start: {text}")
        time.sleep(0.05)
    return proc, text.split("listening on ", 1)[1].split()[0]


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise


@asynccontextmanager
async def replicas(tmp_path: Path, token: str, envs: dict[str, tuple[dict[str, str], int]],
                   processes: dict[str, subprocess.Popen[bytes]] | None = None,
                   ) -> AsyncIterator[dict[str, httpx.AsyncClient]]:
    """`sidecar serve` replicas started at once (name -> its environment and port, 0: any),
    a client for each with the bearer token; their logs printed when the body fails; all
    stopped at the end. `processes`, when given, gets each replica's process (to kill one)."""
    started: dict[str, tuple[subprocess.Popen[bytes], str]] = {}

    async def start_one(name: str, env: dict[str, str], port: int) -> None:
        started[name] = await anyio.to_thread.run_sync(
            lambda: start(tmp_path / name, name, env, port))

    try:
        async with anyio.create_task_group() as tg:
            for name, (env, port) in envs.items():
                tg.start_soon(start_one, name, env, port)
        clients = {name: httpx.AsyncClient(
            base_url=url, timeout=30, headers={"authorization": f"Bearer {token}"})
            for name, (_, url) in started.items()}
        if processes is not None:
            processes.update({name: proc for name, (proc, _) in started.items()})
        try:
            yield clients
        except BaseException:
            for name in started:
                print(f"--- replica {name} ---\n" + (tmp_path / name / "serve.log")
                      .read_text(errors="replace")[-6000:])
            raise
        finally:
            for client in clients.values():
                await client.aclose()
    finally:
        for proc, _ in started.values():
            await anyio.to_thread.run_sync(stop, proc)


async def test_one_login_serves_every_replica_and_refreshes_never_collide(
    postgres_server: PostgresServer, tmp_path: Path
) -> None:
    protected = OAuthServer(expires_in=4)
    dsn = await postgres_server.new_database()
    key = base64.b64encode(os.urandom(32)).decode()
    token = secrets.token_urlsafe(32)
    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        manifests = protected.manifests(tmp_path / "cloud-manifests")
        common = {"SIDECAR_MANIFESTS": str(manifests), "SIDECAR_DATABASE_URL": dsn,
                  "SIDECAR_TOKEN": token}
        async with replicas(tmp_path, token, {
                "a": ({**common, "SIDECAR_GRANT_KEY": key}, 0),
                "b": ({**common, "SIDECAR_GRANT_KEY": key}, 0), "c": (common, 0)}) as clients:
            await _scenario(protected, clients, dsn, manifests, key, tmp_path)


async def _scenario(protected: OAuthServer, clients: dict[str, httpx.AsyncClient], dsn: str,
                    manifests: Path, key: str, tmp_path: Path) -> None:
    a, b, c = clients["a"], clients["b"], clients["c"]
    before = (await b.get("/v1/auth/cloud")).json()
    assert before["needs_login"] and before["command"] == "sidecar auth login cloud"

    # One login, through the CLI on the fleet database (not through any replica).
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(tmp_path / "cli-state"),
               SIDECAR_MANIFESTS=str(manifests), SIDECAR_GRANT_KEY=key)
    async with await anyio.open_process(
        [*SIDECAR, "auth", "login", "cloud", "--no-browser", "--store", dsn], env=env,
    ) as cli:
        assert cli.stdout is not None
        line = b""
        while not line.endswith(b"\n"):
            line += await cli.stdout.receive(1)
        await follow(line.decode().strip())
        assert await cli.wait() == 0

    async def ready(client: httpx.AsyncClient) -> bool:
        health = (await client.get("/v1/health")).json()["servers"]["cloud"]
        return bool(health["state"] == "ready")

    await until(lambda: ready(a), "A ready after the login")
    await until(lambda: ready(b), "B ready after the login")
    on_b = (await b.get("/v1/auth/cloud")).json()
    assert on_b["authorized"] and not on_b["needs_login"], on_b
    called = await call_whoami(b, "whoami-b-1")
    assert called["status"] == "completed", called
    assert called["content"][0]["text"] == "authorized"

    # Both replicas refresh the one grant ahead of its expiry: never with a spent token.
    async def refreshed_thrice() -> bool:
        return protected.grants.count("refresh_token") >= 3

    await until(refreshed_thrice, "three refreshes of the shared grant")
    for client, call_id in ((a, "whoami-a-2"), (b, "whoami-b-2")):
        again = await call_whoami(client, call_id)
        assert again["status"] == "completed", again
    assert protected.reused == 0, "a replica presented a spent refresh token"
    assert protected.grants.count("authorization_code") == 1  # no replica logged in again
    assert await ready(a) and await ready(b)

    # Logged out once (the CLI revokes and forgets the grant), then logged in again through
    # replica A's `/v1/auth`: B follows both without being told.
    logout = await anyio.run_process(
        [*SIDECAR, "auth", "logout", "cloud", "--store", dsn], env=env, check=False)
    assert logout.returncode == 0 and b"revoked and forgotten" in logout.stdout, logout
    calls = iter(range(3, 10_000))

    async def b_is_refused() -> bool:  # at once, or once an older access token B holds ends
        answer = await call_whoami(b, f"whoami-b-{next(calls)}")
        return bool(answer["status"] == "error")

    await until(b_is_refused, "a call through B refused after the logout")
    assert protected.reused == 0
    started = await a.post("/v1/auth/cloud/login")
    assert started.status_code == 202, started.text
    await follow(started.json()["authorization_url"])

    async def b_calls_again() -> bool:
        answer = await call_whoami(b, f"whoami-b-{next(calls)}")
        return bool(answer["status"] == "completed")

    await until(b_calls_again, "a call through B after the login through A")
    assert protected.grants.count("authorization_code") == 2

    # C has no SIDECAR_GRANT_KEY: it says so, and never reads or writes the grant.
    unavailable = await c.get("/v1/auth/cloud")
    assert unavailable.status_code == 503, unavailable.text
    assert unavailable.json()["error"]["code"] == "grant_store_unavailable"
    assert "SIDECAR_GRANT_KEY" in unavailable.json()["error"]["message"]

    async def c_names_the_key() -> bool:  # and keeps waiting (its grant poll raised before)
        health = (await c.get("/v1/health")).json()["servers"]["cloud"]
        return health["state"] == "needs_auth" and "SIDECAR_GRANT_KEY" in (
            health.get("last_error") or "")

    await until(c_names_the_key, "C's health naming SIDECAR_GRANT_KEY")

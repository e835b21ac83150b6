"""A failure inside a running `sidecar serve` neither leaves it half-alive nor deaf to SIGTERM
(seen 2026-12-05).

The trigger is real: a replica on its own PostgreSQL, an upstream server protected by OAuth and
not logged in (`needs_auth`: its supervisor polls the grant in the fleet database), then the
database stops. The grant poll failing used to escape the server's supervisor, end the server
pool's task group, and with it the daemon's Location under a still-listening HTTP server. Now
the failure is contained where it happens: the server's health names it
(`last_error` "internal error: ..."), the daemon keeps serving, the server is back to
`needs_auth` once the database answers again, and SIGTERM stops the daemon cleanly (exit 0)."""

from __future__ import annotations

import base64
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.bridges.oauth_server import OAuthServer
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import SIDECAR
from tests.live_server import live_server

pytestmark = [pytest.mark.anyio,
              pytest.mark.parametrize("anyio_backend", [("asyncio", {"use_uvloop": False})])]
WAIT = 60.0
"""A hang guard, far above the daemon's shutdown bound (10 s for requests, then the stores)."""


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    """A PostgreSQL server of this test alone: the test stops and restarts it."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


def _start(root: Path, env_extra: dict[str, str]) -> tuple[subprocess.Popen[bytes], Path, str]:
    root.mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), **env_extra)
    log = root / "serve.log"
    with log.open("wb") as out:
        proc = subprocess.Popen([*SIDECAR, "serve", "--port", "0"], env=env, stderr=out)
    deadline = time.monotonic() + WAIT
    while "listening on " not in (text := log.read_text(errors="replace")):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            pytest.fail(f"sidecar serve did not start: {text}")
        time.sleep(0.05)
    return proc, log, text.split("listening on ", 1)[1].split()[0]


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-6000:]


async def _until(client: httpx.AsyncClient, log: Path, proc: subprocess.Popen[bytes],
                 check: Any, what: str) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT
    while True:
        assert proc.poll() is None, \
            f"sidecar serve exited ({proc.returncode}) before {what}:\n{_tail(log)}"
        cloud = (await client.get("/v1/health")).json().get("servers", {}).get("cloud", {})
        if check(cloud):
            return dict(cloud)
        assert time.monotonic() < deadline, f"not within {WAIT:g} s: {what}:\n{cloud}\n" \
            f"{_tail(log)}"
        await anyio.sleep(0.1)


async def test_the_grant_store_failing_under_a_supervisor_is_contained(
    own_postgres: PostgresServer, tmp_path: Path
) -> None:
    protected = OAuthServer()
    dsn = await own_postgres.new_database()
    async with live_server(protected) as port:
        protected.base = f"http://127.0.0.1:{port}"
        manifests = protected.manifests(tmp_path / "manifests")
        proc, log, url = _start(tmp_path / "replica", {
            "SIDECAR_MANIFESTS": str(manifests), "SIDECAR_DATABASE_URL": dsn,
            "SIDECAR_GRANT_KEY": base64.b64encode(os.urandom(32)).decode(),
            "SIDECAR_DATABASE_TIMEOUT": "2"})
        try:
            token = (tmp_path / "replica" / "state" / "token").read_text().strip()
            async with httpx.AsyncClient(base_url=url, timeout=10, headers={
                    "authorization": f"Bearer {token}"}) as client:
                await _until(client, log, proc, lambda s: s.get("state") == "needs_auth",
                             "cloud needs_auth")
                await anyio.to_thread.run_sync(own_postgres.pause)
                failed = await _until(
                    client, log, proc,
                    lambda s: "internal error" in (s.get("last_error") or ""),
                    "cloud's health naming the failed grant poll")
                assert "Connect" in failed["last_error"] or "refused" in failed["last_error"]
                live = await client.get("/v1/health", params={"probe": "liveness"})
                assert live.status_code == 200, live.text
                await anyio.to_thread.run_sync(own_postgres.resume)
                await _until(client, log, proc, lambda s: s.get("state") == "needs_auth"
                             and "internal error" not in (s.get("last_error") or ""),
                             "cloud needs_auth again once the database answers")
            proc.send_signal(signal.SIGTERM)
            code = await anyio.to_thread.run_sync(lambda: proc.wait(timeout=WAIT))
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    text = log.read_text(errors="replace")
    assert code == 0, text[-6000:]
    assert "[cloud] supervisor error" in text
    assert "unhandled errors in a TaskGroup" not in text

"""`/v1/health` of a `sidecar serve` replica whose fleet database stops (a real PostgreSQL
server of its own, stopped and started again): 503 with `status` "unavailable" and the reason
naming the database while it is down, the Kubernetes readiness probe fails and the liveness
and startup probes pass (deploy/kubernetes/gateway/deployment.yaml, run as written), and
health is 200 "ok" again once the database is back."""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest

from tests.deploy.files import health_commands
from tests.deploy.test_probes import run_probe
from tests.fleet.postgres import PostgresServer
from tests.fleet.test_replicas import start_replica, stop


@pytest.fixture
def own_server() -> Iterator[PostgresServer]:
    """A server this test may stop: the shared `postgres_server` serves the other tests."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


def gateway_probes() -> dict[str, list[str]]:
    found = {where.rsplit(" ", 1)[1]: command for where, command in health_commands()
             if "gateway/deployment.yaml" in where}
    assert set(found) == {"startupProbe", "readinessProbe", "livenessProbe"}
    return found


def health(url: str, token: str, query: str = "") -> httpx.Response:
    return httpx.get(f"{url}/v1/health{query}", headers={"authorization": f"Bearer {token}"},
                     timeout=30)


def wait_for(url: str, token: str, status: int) -> dict[str, Any]:
    deadline = time.monotonic() + 60  # a hang guard: the check answers within seconds
    while (answer := health(url, token)).status_code != status:
        assert time.monotonic() < deadline, answer.text
        time.sleep(0.1)
    return dict(answer.json())


def test_health_says_when_the_database_is_unreachable_and_recovers(
    tmp_path: Path, own_server: PostgresServer,
) -> None:
    dsn = anyio.run(own_server.new_database)
    database = f"127.0.0.1:{own_server.port}/{dsn.rsplit('/', 1)[1]}"
    token = secrets.token_urlsafe(32)
    proc, url = start_replica(tmp_path / "a", dsn, token, tmp_path / "runs.txt",
                              name="replica-a")
    port = int(url.rsplit(":", 1)[1])
    probes = gateway_probes()
    try:
        up = health(url, token)
        assert up.status_code == 200 and up.json()["status"] == "ok", up.text
        assert up.json()["database"] == {"reachable": True}
        assert all(run_probe(probes[p], port, token) == 0 for p in probes)

        own_server.pause()
        down = wait_for(url, token, 503)
        assert down["status"] == "unavailable" and down["replica"] == "replica-a"
        assert down["database"]["reachable"] is False
        assert down["database"]["error"].startswith(f"the fleet database {database} ")
        assert "test@" not in down["database"]["error"]  # never the user (or a password)
        live = health(url, token, "?probe=liveness")
        assert live.status_code == 200 and live.json()["status"] == "unavailable"
        assert run_probe(probes["readinessProbe"], port, token) != 0  # out of the Service
        assert run_probe(probes["livenessProbe"], port, token) == 0  # not restarted
        assert run_probe(probes["startupProbe"], port, token) == 0

        own_server.resume()
        back = wait_for(url, token, 200)
        assert back["status"] == "ok" and back["database"] == {"reachable": True}
        assert "state" in back and "store" in back
        assert run_probe(probes["readinessProbe"], port, token) == 0
        assert proc.poll() is None  # the replica itself never stopped
    finally:
        stop(proc)

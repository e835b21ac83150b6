"""Identities in fleet mode: two `sidecar serve` replicas sharing a real PostgreSQL trust one
real OpenID provider; the user a call ran as is stored on its history row (read on the
other replica, filtered by user), and a scoped token made for a user through the database
works on either replica as that user."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from tests.fleet.postgres import PostgresServer
from tests.serve.identities.conftest import (
    SIDECAR,
    Daemon,
    Provider,
    auth_manifest,
    running_provider,
    start_daemon,
)
from tests.serve.identities.test_access_tokens import call, error
from tests.serve.test_observability import stop


@pytest.fixture(scope="module")
def oidc_provider() -> Iterator[Provider]:
    with running_provider() as provider:
        yield provider


@pytest.fixture
def replicas(oidc_provider: Provider, postgres_server: PostgresServer, tmp_path: Path
             ) -> Iterator[tuple[Daemon, Daemon]]:
    dsn = anyio.run(postgres_server.new_database)
    manifest = auth_manifest(oidc_provider.issuer)
    started: list[tuple[subprocess.Popen[str], Daemon]] = []
    try:
        for name in ("a", "b"):  # one at a time: the first migrates the database
            replica = start_daemon(tmp_path / name, manifest, {"SIDECAR_DATABASE_URL": dsn})
            started.append(replica)
        yield started[0][1], started[1][1]
    finally:
        for proc, _ in started:
            stop(proc)


def rows(daemon: Daemon, bearer: str | None, expected: int, **params: str
         ) -> set[tuple[str, str | None]]:
    deadline = time.monotonic() + 15
    while True:  # each replica writes its history off the call's path
        with daemon.client(bearer) as client:
            response = client.get("/v1/calls", params=params)
        assert response.status_code == 200, response.text
        found = {(r["call_id"], r["username"]) for r in response.json()["calls"]}
        if len(found) >= expected or time.monotonic() > deadline:
            return found
        time.sleep(0.05)


def test_users_on_history_rows_and_user_tokens_across_replicas(
        replicas: tuple[Daemon, Daemon], oidc_provider: Provider) -> None:
    a, b = replicas
    with a.client(oidc_provider.token("alice")) as alice:
        assert call(alice, "numbers", {"n": 1}, "fleet-alice", "small").status_code == 200
    made = subprocess.run([*SIDECAR, "token", "create", "--profile", "small", "--user",
                           "carol", "--json"], env=a.env, capture_output=True, text=True,
                          timeout=60)
    assert made.returncode == 0, made.stderr
    carol = json.loads(made.stdout)["token"]
    with b.client(carol) as client:  # made through the database, used on the other replica
        assert call(client, "numbers", {"n": 2}, "fleet-carol", "small").status_code == 200
    olga = oidc_provider.token("olga")
    assert rows(b, olga, 2) == {("fleet-alice", "alice"), ("fleet-carol", "carol")}
    assert rows(a, olga, 1, user="carol") == {("fleet-carol", "carol")}
    assert rows(a, carol, 1) == {("fleet-carol", "carol")}
    with b.client(oidc_provider.token("alice")) as alice:
        assert error(alice.get("/v1/calls", params={"user": "carol"}))[:2] == (
            403, "forbidden_role")

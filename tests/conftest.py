"""Shared fixtures: every async test runs on asyncio and on uvloop; no daemon a test started
on demand (`sidecar stdio`, CLI commands) outlives the test session."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.daemons import stop_daemons
from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server

# A daemon started on demand exits after this long without clients (instead of 300 s), and
# `stop_leftover_daemons` stops the rest at the end of the session.
os.environ.setdefault("SIDECAR_IDLE_EXIT", "10")


@pytest.fixture(
    params=[
        pytest.param(("asyncio", {"use_uvloop": False}), id="asyncio"),
        pytest.param(("asyncio", {"use_uvloop": True}), id="uvloop"),
    ]
)
def anyio_backend(request: pytest.FixtureRequest) -> tuple[str, dict[str, bool]]:
    return request.param  # type: ignore[no-any-return]


@pytest.fixture(autouse=True, scope="session")
def stop_leftover_daemons(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    yield
    stop_daemons(info.parent for info in tmp_path_factory.getbasetemp().rglob("daemon.json"))


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    """One real PostgreSQL server for the session (tests/fleet/postgres.py); tests take a
    database each (`await postgres_server.new_database()`)."""
    server = PostgresServer.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    """One real S3-compatible server for the session (SeaweedFS `weed mini`, tests/fleet/s3.py);
    tests take a prefix each (`s3_server.new_location()`)."""
    server = S3Server.start()
    try:
        yield server
    finally:
        server.stop()

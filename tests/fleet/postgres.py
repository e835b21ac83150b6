"""A real PostgreSQL server for the tests: Debian's binaries (`scripts/bootstrap-system`
installs them), a throw-away cluster on 127.0.0.1 and a free port, run as the `postgres` user
(initdb and postgres refuse root), fsync off. One per test session; each test gets a
database of its own. The class lives in `bench/fleet_servers.py`, which the fleet benchmark
shares."""

from __future__ import annotations

from bench.fleet_servers import PostgresServer

__all__ = ["PostgresServer"]

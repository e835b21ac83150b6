"""A real `sidecar serve` replica writing managed objects behind to S3 (SeaweedFS) says in its
health what it staged and has not uploaded yet (`store.staged`), so an operator sees an upload
that does not end: `GET /v1/health`, `sidecar health` and `/metrics`.

The upload is held back for real: the SeaweedFS process is paused (SIGSTOP) while the replica
bounds a large output into a managed ref, then resumed (SIGCONT)."""

from __future__ import annotations

import asyncio
import os
import secrets
import signal
import subprocess
from pathlib import Path

import httpx

from tests.fleet.postgres import PostgresServer
from tests.fleet.s3 import S3Server
from tests.fleet.test_replicas import SIDECAR, start_replica, stop
from tests.fleet.test_s3_replicas import BIG, _call

WAIT = 60.0
"""A hang guard for the upload to end once the bucket answers again."""


def _gauges(text: str) -> dict[str, float]:
    """The unlabelled samples of a Prometheus text page, by name."""
    return {name: float(value) for line in text.splitlines()
            if line and not line.startswith("#") and "{" not in line
            for name, value in [line.split(" ", 1)]}


def _cli_health(env: dict[str, str]) -> str:
    done = subprocess.run([*SIDECAR, "health"], env=env, capture_output=True, text=True,
                          timeout=WAIT, check=False)
    return done.stdout + done.stderr


async def _staged_then_uploaded(tmp_path: Path, postgres: PostgresServer,
                                s3: S3Server) -> None:
    dsn = await postgres.new_database()
    manifests = tmp_path / "big"
    manifests.mkdir()
    (manifests / "big.toml").write_text(BIG)
    env = {**s3.env(s3.new_location()), "SIDECAR_MANIFESTS": str(manifests)}
    token = secrets.token_urlsafe(32)
    proc, url = start_replica(tmp_path / "a", dsn, token, tmp_path / "runs.txt",
                              name="replica-a", env_extra=env)
    cli_env = {k: v for k, v in os.environ.items() if not k.startswith("SIDECAR_")}
    cli_env.update(SIDECAR_STATE_DIR=str(tmp_path / "a" / "state"), SIDECAR_TOKEN=token,
                   SIDECAR_DATABASE_URL=dsn, NO_COLOR="1")
    try:
        async with httpx.AsyncClient(base_url=url, timeout=WAIT, headers={
                "authorization": f"Bearer {token}"}) as client:
            before = (await client.get("/v1/health")).json()["store"]["staged"]
            assert before == {"objects": 0, "bytes": 0, "oldest_seconds": 0.0, "retrying": 0,
                              "last_error": None}
            os.kill(s3.process.pid, signal.SIGSTOP)  # no upload can end
            try:
                made = await _call(client, "big", {}, "big-1")
                [managed] = made["managed"]
                health = (await client.get("/v1/health")).json()
                staged = health["store"]["staged"]
                assert staged["objects"] == 1
                assert staged["bytes"] == managed["size_bytes"]
                assert staged["oldest_seconds"] >= 0
                assert health["store"]["objects"] == 1  # the index counts it at its commit
                metrics = _gauges((await client.get("/metrics")).text)
                assert metrics["sidecar_store_staged_objects"] == 1
                assert metrics["sidecar_store_staged_bytes"] == managed["size_bytes"]
                assert metrics["sidecar_store_staged_oldest_seconds"] >= 0
                printed = await asyncio.to_thread(_cli_health, cli_env)
                assert "staged here, not uploaded yet: 1 objects, " \
                    f"{managed['size_bytes']:,} bytes, oldest committed " in printed, printed
            finally:
                os.kill(s3.process.pid, signal.SIGCONT)
            async with asyncio.timeout(WAIT):
                while True:
                    staged = (await client.get("/v1/health")).json()["store"]["staged"]
                    if not staged["objects"]:
                        break
                    await asyncio.sleep(0.1)
            assert staged["bytes"] == 0 and staged["retrying"] == 0
            metrics = _gauges((await client.get("/metrics")).text)
            assert metrics["sidecar_store_staged_objects"] == 0
            assert metrics["sidecar_store_staged_bytes"] == 0
    finally:
        stop(proc)


def test_health_names_what_waits_for_its_upload(
        tmp_path: Path, postgres_server: PostgresServer, s3_server: S3Server) -> None:
    asyncio.run(_staged_then_uploaded(tmp_path, postgres_server, s3_server))

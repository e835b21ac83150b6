"""What the deployment files must agree with, read from the daemon itself: the environment
variables it reads, the routes it serves, and the health request the probes and health
checks run (`health_probe_url`)."""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

from sidecar.serve.openapi import openapi_document

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("sidecar", "bridges", "managed_store")

FLEET_CONTRACT_ENV = frozenset({
    "SIDECAR_DATABASE_URL", "SIDECAR_OBJECT_STORE", "SIDECAR_REPLICA_ID",
    "AWS_ENDPOINT_URL", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION",
})
"""The fleet configuration every replica is given (docs/fleet.md; the shared names of the fleet
backends, 2026-12-04). S3 credentials and endpoint are the usual AWS variables, which the S3
client reads as well as the daemon."""

CHILD_ENV = frozenset({"HOME"})
"""Not read by the daemon but by the upstream servers it starts (npx, uvx caches)."""

_NAME = re.compile(r"""["']((?:SIDECAR|AWS)_[A-Z0-9_]+)["']""")
_PROBE_URL = re.compile(r"http://(127\.0\.0\.1):(\d+)(/[^'\"\s]*)")


@cache
def daemon_env_names() -> frozenset[str]:
    """Every `SIDECAR_*`/`AWS_*` name the daemon's code spells, plus the fleet contract."""
    found: set[str] = set()
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            found.update(_NAME.findall(path.read_text(encoding="utf-8")))
    return frozenset(found) | FLEET_CONTRACT_ENV


@cache
def daemon_routes() -> frozenset[str]:
    """The paths of the daemon's OpenAPI document: the documented routes a deployment may
    rely on (the probe's request also runs against a real daemon, `test_probes.py`)."""
    return frozenset(openapi_document()["paths"])


def health_probe_url(command: list[str]) -> tuple[str, int, str]:
    """(host, port, path) of the one URL a health command requests (the path without its
    query: the route)."""
    urls = [match for part in command for match in _PROBE_URL.findall(part)]
    assert len(urls) == 1, f"expected one http://127.0.0.1:PORT/PATH in {command}"
    host, port, path = urls[0]
    return host, int(port), path.split("?", 1)[0]


def probe_query(command: list[str]) -> str:
    """The query string of the URL a health command requests ("" when none)."""
    urls = [match for part in command for match in _PROBE_URL.findall(part)]
    assert len(urls) == 1, f"expected one http://127.0.0.1:PORT/PATH in {command}"
    return urls[0][2].partition("?")[2]


def serve_port(command: list[str]) -> int:
    """The `--port` of a `sidecar serve` command line."""
    assert command[:2] == [".venv/bin/sidecar", "serve"], command
    return int(command[command.index("--port") + 1])

"""A real OpenID provider (npm `oidc-provider@9`, provider.mjs) for the session, and a real
`sidecar serve` process per module whose manifest trusts it (`[auth.oidc]`)."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from tests.serve.test_observability import started, stop

REPO = Path(__file__).resolve().parents[3]
MODULES = REPO / ".deps" / "npm" / "node_modules"
SIDECAR = [sys.executable, "-m", "sidecar.cli"]


@dataclass
class Provider:
    issuer: str
    other: str
    """A second issuer signing with the same key (a token of it has the wrong `iss`)."""

    def token(self, client: str, *, resource: str = "urn:sidecar",
              issuer: str | None = None) -> str:
        """A JWT access token for `client` by client_credentials (`sub` = the client id)."""
        response = httpx.post(f"{issuer or self.issuer}/token", data={
            "grant_type": "client_credentials", "client_id": client,
            "client_secret": f"{client}-secret", "resource": resource, "scope": "mcp"})
        assert response.status_code == 200, response.text
        return str(response.json()["access_token"])


@pytest.fixture(scope="session")
def oidc_provider() -> Iterator[Provider]:
    with running_provider() as provider:
        yield provider


@contextmanager
def running_provider() -> Iterator[Provider]:
    """provider.mjs in a node process, until the block ends (tests/fleet uses it too)."""
    if not (MODULES / "oidc-provider").is_dir():
        pytest.fail("oidc-provider is not installed: run scripts/bootstrap-servers")
    env = {**os.environ, "NPM_MODULES": str(MODULES)}
    proc = subprocess.Popen(["node", str(Path(__file__).with_name("provider.mjs"))], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    found: dict[str, str] = {}
    while len(found) < 2:
        line = proc.stdout.readline()
        assert line, "the OpenID provider exited early"
        key, _, value = line.strip().partition(" ")
        found[key] = value
    threading.Thread(target=proc.stdout.read, daemon=True).start()
    try:
        yield Provider(found["ISSUER"], found["OTHER"])
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@dataclass
class Daemon:
    url: str
    token: str
    env: dict[str, str]
    state: Path

    def client(self, bearer: str | None = None) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, headers={
            "authorization": f"Bearer {bearer or self.token}"})


def auth_manifest(issuer: str, extra: str = "") -> str:
    return f"""
[auth.oidc]
issuer = {json.dumps(issuer)}
client_id = "sidecar-console"
client_secret = "${{env:TEST_OIDC_SECRET}}"
audience = "urn:sidecar"
leeway = 1

[[auth.grants]]
groups = ["engineering"]
role = "user"
profiles = ["small"]

[[auth.grants]]
groups = ["ops"]
role = "operator"

[[auth.grants]]
users = ["root"]
role = "admin"

[tools.numbers]
kind = "command"
description = "Print the numbers 1..n, one per line"
input = {{ type = "object", properties = {{ n = {{ type = "integer" }} }}, required = ["n"] }}
argv = ["seq", "{{n}}"]

[tools.letters]
kind = "command"
description = "Print a word"
input = {{ type = "object", properties = {{ w = {{ type = "string" }} }}, required = ["w"] }}
argv = ["echo", "{{w}}"]

[profiles.small]
include = ["numbers"]
{extra}"""


def start_daemon(root: Path, manifest: str, env_extra: dict[str, str] | None = None,
                 args: tuple[str, ...] = ()) -> tuple[subprocess.Popen[str], Daemon]:
    (root / "manifests").mkdir(parents=True, exist_ok=True)
    (root / "manifests" / "auth.toml").write_text(manifest)
    token = secrets.token_urlsafe(32)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SIDECAR_", "OTEL_"))}
    env.update(SIDECAR_STATE_DIR=str(root / "state"), SIDECAR_MANIFESTS=str(root / "manifests"),
               SIDECAR_TOKEN=token, TEST_OIDC_SECRET="console-secret", **(env_extra or {}))
    proc, url = started([*SIDECAR, "serve", "--port", "0", *args], env, "listening on ")
    return proc, Daemon(url, token, env, root / "state")


@pytest.fixture(scope="module")
def daemon(oidc_provider: Provider, tmp_path_factory: pytest.TempPathFactory
           ) -> Iterator[Daemon]:
    proc, served = start_daemon(tmp_path_factory.mktemp("identities"),
                                auth_manifest(oidc_provider.issuer))
    try:
        yield served
    finally:
        stop(proc)

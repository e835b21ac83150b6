"""MCP Server Cards (SEP-2127) of a real `sidecar serve`: the default endpoint's card and a
profile's, at the well-known path and at the SEP's `<endpoint>/server-card`, read without a
token; the catalog; what a card says agrees with the live `server/discover`."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from tests.hardening.daemon_process import Daemon, serving

pytestmark = pytest.mark.anyio

REPO = Path(__file__).resolve().parents[3]
TESTSERVER = REPO / "tests/bridges/servers/testserver.py"
MANIFEST = f"""
[mcpServers.t]
command = {json.dumps(sys.executable)}
args = [{json.dumps(str(TESTSERVER))}]
protocol = "legacy"

[profiles.readers]
servers = ["t"]
"""
MEDIA = "application/mcp-server-card+json"
SCHEMA = "https://static.modelcontextprotocol.io/schemas/v2/server-card.schema.json"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon under test is its own process with its own loop


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("card")
    (base / "manifests").mkdir()
    (base / "manifests" / "card.toml").write_text(MANIFEST)
    with serving(base / "state", manifests=base / "manifests") as running:
        yield running


def test_cards_are_public_and_describe_each_endpoint(daemon: Daemon) -> None:
    with httpx.Client(base_url=daemon.url, timeout=30,
                      headers={"Accept": MEDIA}) as http:  # no token
        card = http.get("/.well-known/mcp/server-card")
        assert card.status_code == 200, card.text
        assert card.headers["content-type"].startswith(MEDIA)
        assert card.headers["access-control-allow-origin"] == "*"
        body = card.json()
        assert body["$schema"] == SCHEMA
        assert body["name"] == "io.mcp-sidecar/gateway" and body["version"]
        assert 0 < len(body["description"]) <= 100
        (remote,) = body["remotes"]
        assert remote["type"] == "streamable-http" and remote["url"] == f"{daemon.url}/mcp"
        assert {"2026-07-28", "2025-11-25", "2025-06-18"} <= set(
            remote["supportedProtocolVersions"])
        (header,) = remote["headers"]
        assert header["name"] == "Authorization" and header["isRequired"] and header["isSecret"]
        meta = body["_meta"]
        assert meta["io.mcp-sidecar/auth"] == {"type": "bearer", "required": True}
        assert "io.modelcontextprotocol/ui" in meta["io.mcp-sidecar/extensions"]
        assert http.get("/mcp/server-card").json() == body  # the SEP's reserved location
        assert http.get("/.well-known/mcp/server-card.json").json() == body

        profile = http.get("/.well-known/mcp/server-card/readers").json()
        assert profile["name"] == "io.mcp-sidecar/gateway.readers"
        assert profile["remotes"][0]["url"] == f"{daemon.url}/mcp/readers"
        assert profile["_meta"]["io.mcp-sidecar/profile"] == "readers"
        assert http.get("/mcp/readers/server-card").json() == profile
        missing = http.get("/.well-known/mcp/server-card/nope")
        assert missing.status_code == 404 and "nope" in missing.text

        catalog = http.get("/.well-known/mcp/catalog.json").json()
        urls = {entry["url"] for entry in catalog["entries"]}
        assert {f"{daemon.url}/mcp/server-card", f"{daemon.url}/mcp/readers/server-card"} <= urls
        assert {entry["type"] for entry in catalog["entries"]} == {MEDIA}

        # the token is still required everywhere else, /mcp included
        assert http.post("/mcp/readers/server-card").status_code == 401
        assert http.get("/mcp").status_code == 401


async def test_card_agrees_with_server_discover(daemon: Daemon) -> None:
    async with httpx.AsyncClient(timeout=30) as http:
        body = (await http.get(f"{daemon.url}/mcp/server-card")).json()
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {daemon.token}"},
                                  timeout=httpx2.Timeout(60)) as http2, \
            Client(streamable_http_client(body["remotes"][0]["url"], http_client=http2),
                   mode="auto", cache=None) as client:
        discovered = client.session.discover_result
        assert discovered is not None
        assert set(discovered.supported_versions) <= set(
            body["remotes"][0]["supportedProtocolVersions"])
        capabilities = client.session.server_capabilities
        assert capabilities is not None
        assert (capabilities.extensions or {}) == body["_meta"]["io.mcp-sidecar/extensions"]

"""Agent Skills (SEP-2640) through `sidecar serve` `/mcp`: two real skills-declaring upstreams
(`servers/skills_server.py`, the same two skills each; one pages `skills/list` one entry at a
time) and the mcp Python client in both eras. The extension is advertised, `skills/list`
merges both servers' entries (every page) under `skill://<namespace>/...`, `skills/get`,
`resources/read` and `resources/directory/read` reach the server a URI names, and the bytes
read match the entry's digest and size."""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict

from tests.hardening.daemon_process import Daemon, serving

pytestmark = pytest.mark.anyio

SERVER = Path(__file__).resolve().parent / "servers" / "skills_server.py"
SKILLS = "io.modelcontextprotocol/skills"


class Answer(BaseModel):
    model_config = ConfigDict(extra="allow")


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"  # the daemon under test is its own process with its own loop


@pytest.fixture(scope="module")
def daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Daemon]:
    base = tmp_path_factory.mktemp("skills")
    servers = {
        "docs": {"command": sys.executable, "args": [str(SERVER)]},
        "more": {"command": sys.executable, "args": [str(SERVER), "--page-size", "1"]},
    }
    (base / "manifests").mkdir()
    (base / "manifests" / "servers.json").write_text(json.dumps({"mcpServers": servers}))
    with serving(base / "state", manifests=base / "manifests") as running:
        yield running


@asynccontextmanager
async def connect(daemon: Daemon, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {daemon.token}"},
                                  timeout=httpx2.Timeout(60)) as http, \
            Client(streamable_http_client(f"{daemon.url}/mcp", http_client=http), mode=mode,
                   cache=None) as client:
        yield client


async def ask(client: Client, method: str, **params: Any) -> dict[str, Any]:
    answer = await client.session.send_request(
        types.Request[dict[str, Any], str](method=method, params=params), Answer)
    return dict(answer.model_extra or {})


async def listed(client: Client) -> list[dict[str, Any]]:
    for _ in range(300):  # the upstream servers start in the background: up to 30 s
        skills: list[dict[str, Any]] = (await ask(client, "skills/list"))["skills"]
        if len(skills) == 4:
            return skills
        await anyio.sleep(0.1)
    pytest.fail(f"skills/list never merged both servers: {skills}")


@pytest.mark.parametrize("mode", ["auto", "legacy"])
async def test_skills_of_two_servers_through_one_endpoint(daemon: Daemon, mode: str) -> None:
    async with connect(daemon, mode) as client:
        if mode == "auto":  # server/discover (2026-07-28) carries the extension
            capabilities = client.session.server_capabilities
            assert capabilities is not None
            assert (capabilities.extensions or {}).get(SKILLS) == {"directoryRead": True}
        skills = await listed(client)
        uris = [entry["uri"] for entry in skills]
        assert uris == ["skill://docs/pdf-processing/SKILL.md", "skill://docs/csv-cleaning/SKILL.md",
                        "skill://more/pdf-processing/SKILL.md",
                        "skill://more/csv-cleaning/SKILL.md"]
        pdf = skills[0]
        assert pdf["frontmatter"]["name"] == "pdf-processing"
        files = {f["uri"]: f for f in pdf["resources"]}
        assert set(files) == {"skill://docs/pdf-processing/SKILL.md",
                              "skill://docs/pdf-processing/references/FORMS.md"}
        for uri, listed_file in files.items():  # the bytes are the upstream's: digests hold
            (content,) = (await client.read_resource(uri)).contents
            assert isinstance(content, types.TextResourceContents) and str(content.uri) == uri
            raw = content.text.encode()
            assert listed_file["size"] == len(raw)
            assert listed_file["digest"] == "sha256:" + hashlib.sha256(raw).hexdigest()

        got = await ask(client, "skills/get", uri="skill://more/csv-cleaning/SKILL.md")
        assert got["skill"]["uri"] == "skill://more/csv-cleaning/SKILL.md"
        assert got["skill"]["resources"][0]["uri"] == "skill://more/csv-cleaning/SKILL.md"
        assert "nextCursor" not in got and got["ttlMs"] == 0
        for unknown in ("skill://more/nope/SKILL.md", "skill://elsewhere/x/SKILL.md"):
            with pytest.raises(MCPError) as refused:
                await ask(client, "skills/get", uri=unknown)
            assert refused.value.code == types.INVALID_PARAMS

        directory = await ask(client, "resources/directory/read", uri="skill://docs/pdf-processing")
        children = {r["uri"]: r.get("mimeType") for r in directory["resources"]}
        assert children == {"skill://docs/pdf-processing/SKILL.md": "text/markdown",
                            "skill://docs/pdf-processing/references": "inode/directory"}
        nested = await ask(client, "resources/directory/read",
                           uri="skill://docs/pdf-processing/references")
        assert [r["uri"] for r in nested["resources"]] == [
            "skill://docs/pdf-processing/references/FORMS.md"]
        with pytest.raises(MCPError) as refused:
            await ask(client, "resources/directory/read",
                      uri="skill://docs/pdf-processing/SKILL.md")
        assert refused.value.code == types.INVALID_PARAMS

        resources = {str(r.uri) for r in (await client.list_resources()).resources}
        assert "skill://more/pdf-processing/SKILL.md" in resources

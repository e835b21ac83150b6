"""A small MCP Registry for the tests: the official API's shapes (`GET /v0.1/servers` with
`search`, `cursor`, `limit` and `version`, `GET /v0.1/servers/{name}/versions` and
`/versions/{version}`, answers wrapped as `{"server": ..., "_meta": ...}`), serving server.json
documents in the 2025-12-11 format for real published servers: server-everything (npm) and
mcp-server-time (PyPI) at the versions scripts/bootstrap-servers installs, plus a remote, an
OCI-only server and a second server named `time`. Pages hold at most 2 servers, so clients
must follow `nextCursor`. `ServedRegistry` runs it with uvicorn on 127.0.0.1 in a thread.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path
from typing import Any

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

EVERYTHING_VERSION = "2026.8.31"
TIME_VERSION = "2026.10.19"
SCHEMA = "https://static.modelcontextprotocol.io/schemas/2025-12-11/server.schema.json"
PAGE = 2


def _response(server: dict[str, Any], latest: bool) -> dict[str, Any]:
    return {"server": {"$schema": SCHEMA, **server}, "_meta": {
        "io.modelcontextprotocol.registry/official": {
            "status": "active", "publishedAt": "2026-11-02T09:00:00Z",
            "updatedAt": "2026-11-02T09:00:00Z", "isLatest": latest}}}


def everything(version: str) -> dict[str, Any]:
    return {
        "name": "io.github.modelcontextprotocol/everything",
        "title": "Everything",
        "description": "MCP server that exercises all the features of the MCP protocol",
        "repository": {"url": "https://github.com/modelcontextprotocol/servers",
                       "source": "github", "subfolder": "src/everything"},
        "version": version,
        "packages": [{
            "registryType": "npm", "registryBaseUrl": "https://registry.npmjs.org",
            "identifier": "@modelcontextprotocol/server-everything", "version": version,
            "runtimeHint": "npx", "transport": {"type": "stdio"},
            "packageArguments": [{"type": "positional", "value": "stdio",
                                  "valueHint": "transport"}],
        }],
    }


def time_server() -> dict[str, Any]:
    return {
        "name": "io.github.modelcontextprotocol/time",
        "description": "Time and timezone conversion capabilities",
        "repository": {"url": "https://github.com/modelcontextprotocol/servers",
                       "source": "github", "subfolder": "src/time"},
        "version": TIME_VERSION,
        "packages": [{
            "registryType": "pypi", "registryBaseUrl": "https://pypi.org",
            "identifier": "mcp-server-time", "version": TIME_VERSION, "runtimeHint": "uvx",
            "transport": {"type": "stdio"},
            "packageArguments": [{"type": "named", "name": "--local-timezone",
                                  "description": "IANA timezone used as local",
                                  "default": "UTC"}],
            "environmentVariables": [
                {"name": "TIME_API_KEY", "description": "Key of the time service",
                 "isRequired": True, "isSecret": True},
                {"name": "TIME_LOG_LEVEL", "description": "Log level", "default": "info",
                 "choices": ["debug", "info", "warning"]},
            ],
        }],
    }


def weather_remote(host: str) -> dict[str, Any]:
    return {
        "name": "com.example/weather",
        "title": "Weather",
        "description": "Hosted weather forecasts over streamable HTTP",
        "version": "2.1.0",
        "websiteUrl": "https://example.com/weather",
        "remotes": [{
            "type": "streamable-http", "url": "http://{host}/mcp",
            "variables": {"host": {"description": "API host", "default": host}},
            "headers": [{"name": "Authorization", "description": "API token",
                         "value": "Bearer {token}", "isRequired": True,
                         "variables": {"token": {"description": "Your API token",
                                                 "isRequired": True, "isSecret": True}}}],
        }],
    }


def documents(remote_host: str) -> list[dict[str, Any]]:
    """The registry's ServerResponse entries (every version of every server)."""
    return [
        _response(everything("2025.9.25"), latest=False),
        _response(everything(EVERYTHING_VERSION), latest=True),
        _response(time_server(), latest=True),
        _response(weather_remote(remote_host), latest=True),
        _response({
            "name": "io.github.someone/time", "description": "Another clock, on npm",
            "version": "1.0.0",
            "packages": [{"registryType": "npm", "identifier": "someone-time-mcp",
                          "version": "1.0.0", "transport": {"type": "stdio"}}],
        }, latest=True),
        _response({
            "name": "io.docker/dockerized", "description": "Only a container image",
            "version": "0.3.0",
            "packages": [{"registryType": "oci", "identifier": "docker.io/example/mcp:0.3.0",
                          "transport": {"type": "stdio"}}],
        }, latest=True),
    ]


def write_catalog(path: Path, remote_host: str) -> Path:
    """The same servers as a local catalog file."""
    entries = documents(remote_host)
    path.write_text(json.dumps({"servers": entries, "metadata": {"count": len(entries)}}))
    return path


def _latest(entry: dict[str, Any]) -> bool:
    return bool(entry["_meta"]["io.modelcontextprotocol.registry/official"]["isLatest"])


def build_app(remote_host: str) -> Starlette:
    entries = documents(remote_host)

    async def servers(request: Request) -> JSONResponse:
        query = request.query_params.get("search", "").lower()
        version = request.query_params.get("version")
        found = [e for e in entries
                 if query in (e["server"]["name"] + "\n" + e["server"]["description"]).lower()
                 and (version is None or (_latest(e) if version == "latest"
                                          else e["server"]["version"] == version))]
        start = int(request.query_params.get("cursor") or 0)
        limit = min(int(request.query_params.get("limit") or PAGE), PAGE)
        page = found[start:start + limit]
        metadata: dict[str, Any] = {"count": len(page)}
        if start + limit < len(found):
            metadata["nextCursor"] = str(start + limit)
        return JSONResponse({"servers": page, "metadata": metadata})

    def named(name: str) -> list[dict[str, Any]]:
        return [e for e in entries if e["server"]["name"] == name]

    async def versions(request: Request) -> JSONResponse:
        found = named(request.path_params["name"])
        if not found:
            return JSONResponse({"error": "Server not found"}, status_code=404)
        return JSONResponse({"servers": found, "metadata": {"count": len(found)}})

    async def one(request: Request) -> JSONResponse:
        wanted = request.path_params["version"]
        found = [e for e in named(request.path_params["name"])
                 if (_latest(e) if wanted == "latest" else e["server"]["version"] == wanted)]
        if not found:
            return JSONResponse({"error": "Server not found"}, status_code=404)
        return JSONResponse(found[0])

    return Starlette(routes=[
        Route("/v0.1/servers", servers),
        Route("/v0.1/servers/{name:path}/versions", versions),
        Route("/v0.1/servers/{name:path}/versions/{version}", one),
    ])


class ServedRegistry:
    """The registry app on 127.0.0.1 (uvicorn in a thread); `url` while it runs."""

    def __init__(self, remote_host: str) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self._socket.getsockname()[1]}"
        self._server = uvicorn.Server(uvicorn.Config(
            build_app(remote_host), lifespan="off", log_level="warning", access_log=False,
            timeout_graceful_shutdown=1, loop="asyncio", http="h11", ws="none"))
        self._thread = threading.Thread(
            target=lambda: asyncio.run(self._server.serve(sockets=[self._socket])),
            name="test-registry", daemon=True)

    def __enter__(self) -> ServedRegistry:
        self._thread.start()
        deadline = time.monotonic() + 10
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test registry did not start")
            time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.should_exit = True
        self._thread.join(10)
        self._socket.close()

"""The upstream servers' resources, prompts, restarts and stderr, for people and scripts: the
plain answers `/v1/resources`, `/v1/prompts` and `/v1/servers/{name}/...` give and the console
shows. Resources and prompts are seen as an MCP client of `/mcp` sees them (URIs and prompt
names namespaced when several servers are configured: `mcp_facade.upstream`), through a
profile's `resources`/`prompts` filter, each with the key of the server it comes from.

Imports the core, the face `bridges.mcp` (types only) and `sidecar.serve.mcp_facade.upstream`.
Exports `UpstreamProblem`, `list_resources`, `read_resource`, `list_prompts`, `get_prompt`,
`restart_server`, `server_stderr` and `REQUEST_SECONDS`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import anyio
import mcp_types as types
from mcp.shared.exceptions import MCPError

from sidecar.registry.profiles import UnknownProfile
from sidecar.serve.mcp_facade.upstream import Upstream, Upstreams, every_page, send

if TYPE_CHECKING:
    from sidecar.location.location import Location

REQUEST_SECONDS = 30.0
"""How long one request to an upstream server may take here."""
RESTART_EXTRA_SECONDS = 5.0
"""A restart answers once the new attempt settled, or its `timeouts.startup` plus this."""


class UpstreamProblem(Exception):
    """Why an answer could not be given: `status` (HTTP), `code` and a message naming the
    server or the value."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(message)
        self.status, self.code, self.message = status, code, message


def _upstreams(location: Location, profile: str | None, which: str) -> Upstreams:
    try:
        chosen = location.profiles.resolve(profile)
    except UnknownProfile as exc:
        raise UpstreamProblem(404, "unknown_profile", str(exc)) from None

    def admits(server: str) -> bool:
        if chosen is None:
            return True
        return chosen.passes_resources(server) if which == "resources" else (
            chosen.passes_prompts(server))

    return Upstreams(lambda: location.upstreams, admits)


def _plain(model: Any) -> dict[str, Any]:
    data: dict[str, Any] = model.model_dump(mode="json", exclude_none=True)
    data.pop("meta", None)
    return data


async def _asked(what: str, request: Any) -> Any:
    """One request to an upstream, bounded; its JSON-RPC error as an `UpstreamProblem`."""
    try:
        with anyio.fail_after(REQUEST_SECONDS):
            return await request
    except TimeoutError:
        raise UpstreamProblem(504, "upstream_timeout",
                              f"{what}: no answer within {REQUEST_SECONDS:g} s") from None
    except MCPError as exc:
        missing = exc.error.code == types.INVALID_PARAMS
        raise UpstreamProblem(404 if missing else 502, "not_found" if missing else "upstream",
                              f"{what}: {exc.error.message}") from None


async def list_resources(location: Location, profile: str | None) -> dict[str, Any]:
    """`{"resources": [...], "templates": [...]}`, each item with its `server`."""
    upstreams = _upstreams(location, profile, "resources")
    resources: list[dict[str, Any]] = []
    templates: list[dict[str, Any]] = []
    for up in upstreams.with_capability("resources"):
        found = await _asked(f"MCP server {up.key!r}: resources/list", every_page(
            up, types.ListResourcesRequest, types.ListResourcesResult,
            lambda page: page.resources))
        resources += [{"server": up.key, **_plain(r), "uri": up.uri_out(r.uri)} for r in found]
        try:
            shapes = await _asked(f"MCP server {up.key!r}: resources/templates/list",
                                  every_page(up, types.ListResourceTemplatesRequest,
                                             types.ListResourceTemplatesResult,
                                             lambda page: page.resource_templates))
        except UpstreamProblem:
            shapes = []  # a server with resources but no templates may not know the method
        templates += [{"server": up.key, **_plain(t),
                       "uri_template": up.uri_out(t.uri_template)} for t in shapes]
    return {"resources": resources, "templates": templates}


async def read_resource(location: Location, profile: str | None, uri: str) -> dict[str, Any]:
    """`{"server", "uri", "contents": [{"uri", "mime_type", "text" | "blob" (base64)}]}`."""
    upstreams = _upstreams(location, profile, "resources")
    up, original = _resolved(upstreams.resolve_uri, uri)
    result = await _asked(f"MCP server {up.key!r}: resources/read {original}", send(
        up, types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=original)),
        types.ReadResourceResult))
    contents = [{**_plain(c), "uri": up.uri_out(c.uri)} for c in result.contents]
    return {"server": up.key, "uri": uri, "contents": contents}


async def list_prompts(location: Location, profile: str | None) -> dict[str, Any]:
    """`{"prompts": [...]}`, each with its `server` and `arguments`."""
    upstreams = _upstreams(location, profile, "prompts")
    prompts: list[dict[str, Any]] = []
    for up in upstreams.with_capability("prompts"):
        found = await _asked(f"MCP server {up.key!r}: prompts/list", every_page(
            up, types.ListPromptsRequest, types.ListPromptsResult, lambda page: page.prompts))
        prompts += [{"server": up.key, **_plain(p), "name": up.name_out(p.name)} for p in found]
    return {"prompts": prompts}


async def get_prompt(location: Location, profile: str | None, name: str,
                     arguments: dict[str, str]) -> dict[str, Any]:
    """`{"server", "name", "description", "messages": [{"role", "content"}]}`."""
    upstreams = _upstreams(location, profile, "prompts")
    up, original = _resolved(upstreams.resolve_prompt, name)
    result = await _asked(f"MCP server {up.key!r}: prompts/get {original}", send(
        up, types.GetPromptRequest(params=types.GetPromptRequestParams(
            name=original, arguments=arguments or None)), types.GetPromptResult))
    return {"server": up.key, "name": name, **_plain(result)}


def _resolved(resolve: Callable[[str], tuple[Upstream, str]],
              public: str) -> tuple[Upstream, str]:
    """The upstream serving `public` (a resource URI or prompt name) and its own name for
    it; 404 `not_found` when no upstream serves it."""
    try:
        return resolve(public)
    except MCPError as exc:
        raise UpstreamProblem(404, "not_found", exc.error.message) from None


def _pool(location: Location, name: str) -> Any:
    pool = location.upstreams
    if pool is None or pool.config(name) is None:
        known = ", ".join(sorted(location.server_health())) or "none"
        raise UpstreamProblem(404, "unknown_server",
                              f"no MCP server named {name!r} (configured: {known})")
    return pool


async def restart_server(location: Location, name: str) -> dict[str, Any]:
    """Restart server `name`; its health once the new attempt settled (or once its start-up
    timeout and `RESTART_EXTRA_SECONDS` passed: then usually `starting`)."""
    pool = _pool(location, name)
    patience = pool.config(name).timeouts.startup + RESTART_EXTRA_SECONDS
    with anyio.move_on_after(patience):
        await pool.restart(name)
    return dict(location.server_health()[name].to_json())


def server_stderr(location: Location, name: str, after: int = 0) -> tuple[int, str]:
    """(mark, text): what server `name` wrote to stderr after mark `after` (the last 64 KiB
    are kept, redacted), and the mark to read on from."""
    found = _pool(location, name).stderr(name, after)
    if found is None:
        raise UpstreamProblem(404, "unknown_server", f"no MCP server named {name!r}")
    mark, text = found
    return int(mark), str(text)

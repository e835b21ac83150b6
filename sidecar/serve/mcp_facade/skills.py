"""Agent Skills of the upstream servers (SEP-2640, `io.modelcontextprotocol/skills`) as one
server's: `skills/list`, `skills/get` and `resources/directory/read` across every upstream
that declares the extension, named by the rules of `upstream.Upstreams` (with several servers
`skill://<rest>` is `skill://<namespace>/<rest>`, in entries, their `resources` and directory
listings alike; the files' bytes, digests and frontmatter are the upstream's own).

`settings(upstreams)` is what the facade advertises (None: no upstream has skills). May import
the core, the face `bridges.mcp` and the rest of `sidecar.serve`. Exports `SKILLS_EXTENSION`,
`settings`, `advertise`, `list_skills`, `get_skill`, `read_directory` and `register`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import mcp_types as types
from mcp.server import Server
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, ConfigDict

from sidecar.serve.mcp_facade.upstream import Upstream, Upstreams

SKILLS_EXTENSION = "io.modelcontextprotocol/skills"
MAX_PAGES = 1000
CACHE = {"ttlMs": 0, "cacheScope": "private"}
"""Cache hints (SEP-2549) of every answer: merged from servers that may change at any time."""
_Request = types.Request[dict[str, Any], str]


class _Answer(BaseModel):
    """Any result object, kept as it came (an extension's results have no SDK model)."""

    model_config = ConfigDict(extra="allow")


class ListParams(types.RequestParams):
    cursor: str | None = None


class GetParams(types.RequestParams):
    uri: str


class DirectoryParams(types.RequestParams):
    uri: str
    cursor: str | None = None


def _declared(upstream: Upstream) -> dict[str, Any] | None:
    caps = upstream.connection.client.session.server_capabilities
    extensions = (caps.extensions if caps is not None else None) or {}
    value = extensions.get(SKILLS_EXTENSION)
    return value if isinstance(value, dict) else None


def with_skills(upstreams: Upstreams) -> list[Upstream]:
    return [up for up in upstreams.all() if _declared(up) is not None]


def settings(upstreams: Upstreams) -> dict[str, Any] | None:
    """The extension's settings for clients: `{}`, with `directoryRead: true` when an upstream
    serves directories; None when no upstream declares skills."""
    declared = [d for up in upstreams.all() if (d := _declared(up)) is not None]
    if not declared:
        return None
    return {"directoryRead": True} if any(d.get("directoryRead") is True for d in declared) else {}


def advertise(extensions: dict[str, dict[str, Any]], upstreams: Upstreams) -> None:
    """`extensions` (the facade's advertised map, in place) with the skills extension while an
    upstream declares it (asked at each `initialize` and `server/discover`)."""
    found = settings(upstreams)
    if found is None:
        extensions.pop(SKILLS_EXTENSION, None)
    else:
        extensions[SKILLS_EXTENSION] = found


async def _send(up: Upstream, method: str, params: dict[str, Any]) -> dict[str, Any]:
    answer = await up.connection.client.session.send_request(
        _Request(method=method, params=params), _Answer)
    return dict(answer.model_extra or {})


def _entry_out(up: Upstream, entry: Any) -> Any:
    """A skill entry as clients see it: its URI and its files' URIs namespaced."""
    if not isinstance(entry, dict):
        return entry
    out = dict(entry)
    if isinstance(out.get("uri"), str):
        out["uri"] = up.uri_out(out["uri"])
    if isinstance(out.get("resources"), list):
        out["resources"] = [{**f, "uri": up.uri_out(f["uri"])}
                            if isinstance(f, dict) and isinstance(f.get("uri"), str) else f
                            for f in out["resources"]]
    return out


async def list_skills(upstreams: Upstreams) -> dict[str, Any]:
    """Every skill of every upstream that declares the extension, in configuration order and
    each server's own order, in one page (an entry is never split)."""
    merged: list[Any] = []
    for up in with_skills(upstreams):
        cursor: str | None = None
        for _ in range(MAX_PAGES):
            page = await _send(up, "skills/list", {"cursor": cursor} if cursor else {})
            merged += [_entry_out(up, e) for e in page.get("skills") or ()]
            cursor = page.get("nextCursor")
            if not isinstance(cursor, str) or not cursor:
                break
    return {"skills": merged, **CACHE}


async def get_skill(upstreams: Upstreams, uri: str) -> dict[str, Any]:
    """One skill by its URI, from the server the URI names (-32602: no such server, or the
    server's own -32602 for a skill it does not have)."""
    up, original = upstreams.resolve_uri(uri)
    _require(up, uri)
    result = await _send(up, "skills/get", {"uri": original})
    return {"skill": _entry_out(up, result.get("skill")), **CACHE}


async def read_directory(
    upstreams: Upstreams, uri: str, cursor: str | None
) -> dict[str, Any]:
    """A directory of a skill (`resources/directory/read`) from the server its URI names; the
    children's URIs namespaced, the server's `nextCursor` handed on (it comes back to it)."""
    up, original = upstreams.resolve_uri(uri)
    _require(up, uri)
    params: dict[str, Any] = {"uri": original}
    if cursor:
        params["cursor"] = cursor
    result = await _send(up, "resources/directory/read", params)
    out: dict[str, Any] = {"resources": [
        {**r, "uri": up.uri_out(r["uri"])} if isinstance(r, dict) and isinstance(
            r.get("uri"), str) else r
        for r in result.get("resources") or ()]}
    if isinstance(result.get("nextCursor"), str) and result["nextCursor"]:
        out["nextCursor"] = result["nextCursor"]
    return out


def _require(up: Upstream, uri: str) -> None:
    if _declared(up) is None:
        raise MCPError(types.INVALID_PARAMS,
                       f"{uri!r} names MCP server {up.key!r}, which serves no skills")


def register(server: Server[Any], upstreams: Callable[[], Upstreams]) -> None:
    """The three methods on the facade's SDK server (both eras)."""

    async def on_list(ctx: Any, params: ListParams) -> dict[str, Any]:
        return await list_skills(upstreams())

    async def on_get(ctx: Any, params: GetParams) -> dict[str, Any]:
        return await get_skill(upstreams(), params.uri)

    async def on_directory(ctx: Any, params: DirectoryParams) -> dict[str, Any]:
        return await read_directory(upstreams(), params.uri, params.cursor)

    server.add_request_handler("skills/list", ListParams, on_list)
    server.add_request_handler("skills/get", GetParams, on_get)
    server.add_request_handler("resources/directory/read", DirectoryParams, on_directory)

"""Resources, prompts and completion of the upstream servers, as one server's: `Upstreams`
(namespacing and merged listings are its docstring) and one function per MCP method.

Imports `sidecar.location` and the face `bridges.mcp`. Exports `Upstreams`, `Upstream`,
`list_resources`, `list_templates`, `read_resource`, `list_prompts`, `get_prompt`,
`complete`, `subscribe`, `send`, `every_page`, `prefixed_uri`, `URI_SEP`, `UI_SCHEME`,
`SKILL_SCHEME`, `UI_EXTENSION` and `PROMPT_SEP`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

import mcp_types as types
from mcp.shared.exceptions import MCPError
from pydantic import BaseModel, Discriminator, Tag, TypeAdapter, ValidationError

from bridges.mcp import Connection
from sidecar.location.sources import UpstreamPool
from sidecar.serve.mcp_facade.offered import cache_hints

R = TypeVar("R", bound=BaseModel)
T = TypeVar("T")
URI_SEP = "+"
PROMPT_SEP = "/"
UI_SCHEME = "ui://"
"""MCP Apps' scheme (SEP-1865): hosts render only `ui://` URIs, so these keep their scheme and
take the namespace as their first path segment instead of a `<namespace>+` prefix."""
SKILL_SCHEME = "skill://"
"""Agent Skills' scheme (SEP-2640): kept the same way, so a skill's name stays its URI's last
directory and its files stay within its directory."""
KEPT_SCHEMES = (UI_SCHEME, SKILL_SCHEME)
UI_EXTENSION = "io.modelcontextprotocol/ui"
"""MCP Apps' extension identifier, advertised by the facade (`server`)."""
UI_META_KEY = "ui/resourceUri"
"""The older flat `_meta` key of a tool's UI resource (`_meta.ui.resourceUri` is the new one)."""


@dataclass(frozen=True, slots=True)
class _Hints:
    ttl_ms: int
    cache_scope: str


def prefixed_uri(namespace: str, uri: str) -> str:
    """`uri` of the server with `namespace` as clients see it when several servers serve."""
    for scheme in KEPT_SCHEMES:
        if uri.startswith(scheme):
            return f"{scheme}{namespace}/{uri[len(scheme):]}"
    return f"{namespace}{URI_SEP}{uri}"


@dataclass(frozen=True, slots=True)
class Upstream:
    key: str
    namespace: str
    connection: Connection
    prefixed: bool

    def uri_out(self, uri: str) -> str:
        return prefixed_uri(self.namespace, uri) if self.prefixed else uri

    def name_out(self, name: str) -> str:
        return f"{self.namespace}{PROMPT_SEP}{name}" if self.prefixed else name


class Upstreams:
    """Per-upstream access through the pool (`pool()` may be None: no manifests loaded).

    Namespacing (only when more than one server is configured; a server whose namespace is ""
    is never prefixed, and neither is anything when there is a single server):

    - resource URI (and URI template) `u` -> `<namespace>+<u>`, except MCP Apps' `ui://<rest>`
      -> `ui://<namespace>/<rest>` (it stays `ui://`), also in a tool's `_meta.ui.resourceUri`
      and `_meta["ui/resourceUri"]` (`tool_meta_out`), and Agent Skills' `skill://<rest>` ->
      `skill://<namespace>/<rest>` (`skills`);
    - prompt name `p` -> `<namespace>/<p>`.

    Reversal: the longest namespace `ns` for which the value starts with `ns+` (URIs),
    `ui://ns/` or `skill://ns/` (URIs of those schemes) or `ns/` (prompt names) is the server;
    a value that matches none goes to the server whose namespace is "" (if any), unchanged.
    URIs in tool results (resource links, embedded resources) are rewritten the same way, for
    the server whose tool produced them (`rewrite_result_uris`), so that `resources/read` of a
    link a tool returned reaches that server.

    Listings merge every ready server that advertises the capability, in configuration order,
    in one page. A server that is down is left out of listings; a request aimed at it fails with
    a JSON-RPC error naming it."""

    def __init__(
        self, pool: Callable[[], UpstreamPool | None],
        admits: Callable[[str], bool] | None = None,
    ) -> None:
        self._pool = pool
        self._admits = admits
        """Which servers pass through (a profile's `resources`/`prompts`); None: all."""

    def _namespaces(self) -> dict[str, str]:
        pool = self._pool()
        return pool.namespaces() if pool is not None else {}

    def all(self) -> list[Upstream]:
        pool = self._pool()
        if pool is None:
            return []
        namespaces = self._namespaces()
        several = len(namespaces) > 1  # over every server: prefixes never depend on a profile
        found = []
        for key, namespace in namespaces.items():
            if self._admits is not None and not self._admits(key):
                continue
            connection = pool.connection(key)
            if connection is not None:
                found.append(Upstream(key, namespace, connection, several and namespace != ""))
        return found

    def by_key(self, key: str) -> Upstream | None:
        return next((u for u in self.all() if u.key == key), None)

    def tools_hints(self, servers: Sequence[str]) -> dict[str, Any]:
        """The cache hints of a `tools/list` listing the tools of `servers` (each server's
        last listing; a handshake-era server, or one not connected: 0 and `private`)."""
        pool = self._pool()
        pages = []
        for key in servers:
            connection = pool.connection(key) if pool is not None else None
            hints = connection.tools_hints if connection is not None else None
            pages.append(_Hints(*(hints or (0, "private"))))
        return cache_hints(pages)

    def _resolve(self, value: str, sep: str) -> tuple[str, str]:
        """(server key, upstream value) for a downstream URI or prompt name."""
        namespaces = self._namespaces()
        if len(namespaces) == 1:
            return next(iter(namespaces)), value
        best: tuple[str, str] | None = None
        head = next((s for s in KEPT_SCHEMES if value.startswith(s)), "") if sep == URI_SEP else ""
        ui = bool(head)  # a kept scheme: the namespace is the first path segment
        for key, ns in namespaces.items():
            start = f"{head}{ns}/" if ui else ns + sep
            if ns and value.startswith(start) and (best is None or len(ns) > len(best[1])):
                best = (key, ns)
        if best is not None:
            cut = len(head) + len(best[1]) + (1 if ui else len(sep))
            return best[0], head + value[cut:]
        bare = [key for key, ns in namespaces.items() if ns == ""]
        if bare:
            return bare[0], value
        raise MCPError(types.INVALID_PARAMS, f"{value!r} names no configured server")

    def uri_out(self, key: str, uri: str) -> str:
        """`uri` of server `key` as clients see it (prefixed by the rule above)."""
        namespaces = self._namespaces()
        namespace = namespaces.get(key)
        if namespace and len(namespaces) > 1:
            return prefixed_uri(namespace, uri)
        return uri

    def tool_meta_out(self, meta: dict[str, Any], key: str) -> dict[str, Any]:
        """A tool's `_meta` of server `key` with its MCP Apps UI resource URIs
        (`_meta.ui.resourceUri`, `_meta["ui/resourceUri"]`) as clients see them; the same
        object when there is nothing to change."""
        ui = meta.get("ui")
        nested = ui.get("resourceUri") if isinstance(ui, dict) else None
        flat = meta.get(UI_META_KEY)
        if not isinstance(nested, str) and not isinstance(flat, str):
            return meta
        out = dict(meta)
        if isinstance(ui, dict) and isinstance(nested, str):
            out["ui"] = {**ui, "resourceUri": self.uri_out(key, nested)}
        if isinstance(flat, str):
            out[UI_META_KEY] = self.uri_out(key, flat)
        return out

    def rewrite_result_uris(self, wire: dict[str, Any], key: str) -> None:
        """The URIs of the resource links and embedded resources in a `CallToolResult` (wire
        form, in place) produced by server `key`, as clients see them."""
        for item in wire.get("content", ()):
            kind = item.get("type")
            if kind == "resource_link" and isinstance(item.get("uri"), str):
                item["uri"] = self.uri_out(key, item["uri"])
            elif kind == "resource" and isinstance(item.get("resource"), dict):
                resource = item["resource"]
                if isinstance(resource.get("uri"), str):
                    resource["uri"] = self.uri_out(key, resource["uri"])

    def resolve_uri(self, uri: str) -> tuple[Upstream, str]:
        key, original = self._resolve(uri, URI_SEP)
        return self._ready(key), original

    def resolve_prompt(self, name: str) -> tuple[Upstream, str]:
        key, original = self._resolve(name, PROMPT_SEP)
        return self._ready(key), original

    def _ready(self, key: str) -> Upstream:
        upstream = self.by_key(key)
        if upstream is None:
            raise MCPError(types.INTERNAL_ERROR, f"MCP server {key!r} is not connected")
        return upstream

    def with_capability(self, name: str) -> list[Upstream]:
        found = []
        for upstream in self.all():
            caps = upstream.connection.client.session.server_capabilities
            if caps is not None and getattr(caps, name, None) is not None:
                found.append(upstream)
        return found


async def send(upstream: Upstream, request: Any, result: type[R]) -> R:
    """One request to one upstream; its JSON-RPC error is handed on as it is."""
    return await upstream.connection.client.session.send_request(request, result)


def _result_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "input" if value.get("resultType") == "input_required" else "complete"
    return "input" if isinstance(value, types.InputRequiredResult) else "complete"


@functools.cache
def or_input(result: type[R]) -> TypeAdapter[Any]:
    """`result`, or a 2026-07-28 upstream's `input_required` round (tagged by `resultType`)."""
    tagged: Any = Annotated[
        Annotated[result, Tag("complete")]
        | Annotated[types.InputRequiredResult, Tag("input")],
        Discriminator(_result_kind),
    ]
    return TypeAdapter(tagged)


async def every_page(
    upstream: Upstream, request: Callable[..., Any], result: type[R],
    items: Callable[[R], Sequence[T]], pages: list[R] | None = None,
) -> list[T]:
    """Every page of one upstream's listing (`request` takes `params=`), in order; each page
    is also appended to `pages` when given (their cache hints)."""
    found: list[T] = []
    cursor: str | None = None
    while True:
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page = await send(upstream, request(params=params), result)
        found += items(page)
        if pages is not None:
            pages.append(page)
        cursor = getattr(page, "next_cursor", None)
        if not cursor:
            return found


async def list_resources(upstreams: Upstreams) -> types.ListResourcesResult:
    merged: list[types.Resource] = []
    seen: list[types.ListResourcesResult] = []
    for up in upstreams.with_capability("resources"):
        pages = await every_page(up, types.ListResourcesRequest, types.ListResourcesResult,
                                 lambda page: page.resources, seen)
        merged += [r.model_copy(update={"uri": up.uri_out(r.uri)}) for r in pages]
    return types.ListResourcesResult(resources=merged, **cache_hints(seen))


async def list_templates(upstreams: Upstreams) -> types.ListResourceTemplatesResult:
    merged: list[types.ResourceTemplate] = []
    seen: list[types.ListResourceTemplatesResult] = []
    for up in upstreams.with_capability("resources"):
        pages = await every_page(
            up, types.ListResourceTemplatesRequest, types.ListResourceTemplatesResult,
            lambda page: page.resource_templates, seen)
        merged += [t.model_copy(update={"uri_template": up.uri_out(t.uri_template)})
                   for t in pages]
    return types.ListResourceTemplatesResult(resource_templates=merged, **cache_hints(seen))


async def read_resource(
    upstreams: Upstreams, uri: str, params: types.ReadResourceRequestParams | None = None
) -> types.ReadResourceResult | types.InputRequiredResult:
    """An upstream's `input_required` round passes through with its keys and `requestState`;
    the client's `inputResponses` and `requestState` go back to the same server."""
    up, original = upstreams.resolve_uri(uri)
    update: dict[str, Any] = {"uri": original, "meta": None}
    request_params = (params.model_copy(update=update) if params is not None
                      else types.ReadResourceRequestParams(uri=original))
    result: types.ReadResourceResult | types.InputRequiredResult = (
        await up.connection.client.session.send_request(
            types.ReadResourceRequest(params=request_params),
            or_input(types.ReadResourceResult)))
    if isinstance(result, types.InputRequiredResult):
        return result
    contents = [c.model_copy(update={"uri": up.uri_out(c.uri)}) for c in result.contents]
    return result.model_copy(update={"contents": contents})


async def list_prompts(upstreams: Upstreams) -> types.ListPromptsResult:
    merged: list[types.Prompt] = []
    seen: list[types.ListPromptsResult] = []
    for up in upstreams.with_capability("prompts"):
        pages = await every_page(up, types.ListPromptsRequest, types.ListPromptsResult,
                                 lambda page: page.prompts, seen)
        merged += [p.model_copy(update={"name": up.name_out(p.name)}) for p in pages]
    return types.ListPromptsResult(prompts=merged, **cache_hints(seen))


async def get_prompt(
    upstreams: Upstreams, params: types.GetPromptRequestParams
) -> types.GetPromptResult | types.InputRequiredResult:
    """As `read_resource`: an `input_required` round passes through both ways."""
    up, original = upstreams.resolve_prompt(params.name)
    result: types.GetPromptResult | types.InputRequiredResult = (
        await up.connection.client.session.send_request(types.GetPromptRequest(
            params=params.model_copy(update={"name": original, "meta": _own_meta(params)})),
            or_input(types.GetPromptResult)))
    return result


def _own_meta(params: Any) -> Any:
    """A request's `_meta` without the caller's protocol envelope (`io.modelcontextprotocol/`
    keys): the upstream connection stamps its own, and a handshake-era one refuses them."""
    meta = params.meta
    if not meta or not any(key.startswith(ENVELOPE_PREFIX) for key in meta):
        return meta
    return {key: value for key, value in meta.items() if not key.startswith(ENVELOPE_PREFIX)}


ENVELOPE_PREFIX = "io.modelcontextprotocol/"


async def complete(
    upstreams: Upstreams, params: types.CompleteRequestParams
) -> types.CompleteResult:
    ref = params.ref
    if isinstance(ref, types.PromptReference):
        up, original = upstreams.resolve_prompt(ref.name)
        new_ref: Any = ref.model_copy(update={"name": original})
    else:
        up, original = upstreams.resolve_uri(ref.uri)
        new_ref = ref.model_copy(update={"uri": original})
    try:
        return await send(up, types.CompleteRequest(
            params=params.model_copy(update={"ref": new_ref, "meta": _own_meta(params)})),
            types.CompleteResult)
    except ValidationError as exc:
        if not _asks_for_input(exc):
            raise
        raise MCPError(types.INTERNAL_ERROR, COMPLETION_ASKS.format(server=up.key)) from None


COMPLETION_ASKS = (
    "MCP server {server!r} answered completion/complete with input_required: MCP 2026-07-28 "
    "admits input requests only on tools/call, prompts/get and resources/read (SEP-2322), and "
    "a completion request cannot carry the answers, so no completion values can be given")
"""An upstream that asks for input on `completion/complete`: the client cannot answer it
(`CompleteRequestParams` has no `inputResponses`), so the facade says so (docs/mcp-facade.md)."""


def _asks_for_input(exc: ValidationError) -> bool:
    """Whether a result the SDK refused was an `input_required` round (its errors quote it)."""
    return any(isinstance(error.get("input"), dict)
               and error["input"].get("resultType") == "input_required"
               for error in exc.errors())


async def subscribe(upstreams: Upstreams, uri: str, *, on: bool) -> tuple[str, str]:
    """Forward a (un)subscribe; returns (server key, upstream URI). A 2026-07-28 upstream has
    no `resources/subscribe` (removed with sessions): nothing is sent there (its subscriptions
    are asked for on its `subscriptions/listen` stream: `resource_subscriptions`)."""
    up, original = upstreams.resolve_uri(uri)
    if up.connection.modern:
        return up.key, original
    if on:
        request: Any = types.SubscribeRequest(params=types.SubscribeRequestParams(uri=original))
    else:
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=original))
    await send(up, request, types.EmptyResult)
    return up.key, original

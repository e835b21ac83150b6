"""What one facade serves, and the steps of a `tools/call` both routes take.

`ServedTools` holds a facade's profile over its Location: the snapshot a session lists, the
listing cache, the upstream servers still starting, a call's OAuth login first (`login_ask`)
and its result in wire form (bounded, URIs namespaced by `upstream`). The SDK route
(`server.McpFacade`) and the fast route (`fast_answers.FastAnswers`) are both given one, so the
two answer alike. `passes` is a profile's filter of upstream resources and prompts.
May import the core and the rest of `sidecar.serve`. Exports `ServedTools`, `passes`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from bridges.mcp import InflightCall
from sidecar.codemode.tool_search import called_tool
from sidecar.execution.snapshot import Snapshot
from sidecar.registry.profiles import UnknownProfile
from sidecar.serve.listing_cache import ListingCache
from sidecar.serve.mcp_facade import login_ask, tools
from sidecar.serve.mcp_facade.sessions import DownstreamCall, SessionState
from sidecar.serve.mcp_facade.upstream import Upstreams

if TYPE_CHECKING:
    from sidecar.location.location import Location

MCP_ORIGIN = "mcp:"
"""Label prefix of an MCP server's registration (`bridges.mcp.supervisor`)."""

ServerRequest = Callable[[str, Sequence[InflightCall], str, Any], Awaitable[Any]]
"""Sends an upstream server's request to the client of its call (`UpstreamRelay.server_request`)."""


def passes(location: Location, profile: str | None, server: str, which: str) -> bool:
    """Whether `profile` (None: the default one) passes `server`'s resources or prompts
    (`which`); a profile removed by a reload passes nothing."""
    try:
        chosen = location.profiles.resolve(profile)
    except UnknownProfile:
        return False
    if chosen is None:
        return True
    return chosen.passes_resources(server) if which == "resources" else (
        chosen.passes_prompts(server))


class ServedTools:
    """A facade's profile over its Location, and the steps every `tools/call` takes."""

    def __init__(
        self, location: Location, profile: str | None, upstreams: Upstreams,
        server_request: ServerRequest,
    ) -> None:
        self.location = location
        self.profile = profile
        """The profile served (`sidecar.registry.profiles`; None: the default one)."""
        self.upstreams = upstreams
        self._server_request = server_request
        self.listings = ListingCache[types.ListToolsResult](4)
        """`tools/list` results by era, cache hints and definitions (both routes share
        them)."""
        self._servers = ListingCache[tuple[str, ...]](4)
        """The upstream servers whose tools a snapshot lists, by definitions."""

    def snapshot(self, session_id: str) -> Snapshot:
        """What one session's `tools/list` advertises now, through this facade's profile; a
        profile removed by a reload advertises nothing (and every call fails)."""
        try:
            return self.location.snapshot(session_id=session_id, keep=False,
                                          profile=self.profile)
        except UnknownProfile:
            return Snapshot(self.location.seam, {}, session_id=session_id)

    def listing(self, snapshot: Snapshot, *, modern: bool) -> types.ListToolsResult:
        """The `tools/list` result of `snapshot`, cached per registry state. Its 2026-07-28
        cache hints (`modern`) are those of the upstream listings of the servers whose tools
        it lists (the daemon's own tools constrain nothing; none listed: 0 and `private`)."""
        def meta_out(name: str, meta: dict[str, Any]) -> dict[str, Any]:
            entry = snapshot.entry(name)
            if entry is None or not entry.origin.startswith(MCP_ORIGIN):
                return meta
            return self.upstreams.tool_meta_out(meta, entry.origin.removeprefix(MCP_ORIGIN))

        def build() -> types.ListToolsResult:
            return tools.tool_list(snapshot, modern=modern, meta_out=meta_out)

        if not modern:  # a handshake-era listing carries no cache hints
            return self.listings.get(modern, snapshot.definitions, build)
        hints = self.upstreams.tools_hints(self._servers.get(
            None, snapshot.definitions, lambda: _servers_of(snapshot)))
        return self.listings.get((modern, hints["ttl_ms"], hints["cache_scope"]),
                                 snapshot.definitions,
                                 lambda: build().model_copy(update=hints))

    @staticmethod
    def app_tool(snapshot: Snapshot, name: str) -> str:
        """The tool a `tools/call` of `name` means. An MCP App's View calls its own server's
        tools by their upstream names (`get-time`), and its host relays the call unchanged,
        with nothing that says which server the View came from: a name the snapshot does not
        list, that is the upstream name of exactly one listed MCP server tool, means that tool
        (`basic_get-time`). Any other name is left as it is (an unknown tool stays unknown)."""
        if snapshot.entry(name) is not None:
            return name
        found = [listed for listed in snapshot.names
                 if (entry := snapshot.entry(listed)) is not None
                 and entry.origin.startswith(MCP_ORIGIN) and entry.key == name]
        return found[0] if len(found) == 1 else name

    def starting(self) -> list[str]:
        """The upstream servers still on their first attempt (the daemon starts them in the
        background): their tools are not listed yet."""
        pool = self.location.upstreams
        return pool.starting() if pool is not None else []

    async def settled_snapshot(self, state: SessionState) -> Snapshot:
        """For a call of a name the session's snapshot lacks (a client that remembers a tool
        from before, or calls one listed since): a fresh snapshot, once the servers still
        starting have settled their first attempts. Fresh even when nothing is starting: a
        server that settled between the session's listing and the call has its tools
        registered by then."""
        pool = self.location.upstreams
        if pool is not None and pool.starting():
            await pool.settled()  # each first attempt is bounded by its timeouts.startup
        state.snapshot = self.snapshot(state.id)
        return state.snapshot

    async def login_first(
        self, snapshot: Snapshot, tool: str, call: DownstreamCall, arguments: Any = None
    ) -> None:
        """A tool of a server that waits for an OAuth login, called by a client that can open
        a URL: that login first (`login_ask`; the URL goes out like an upstream's request).
        A `call_tool` (search mode) is judged by the tool its `arguments` name."""
        if not login_ask.opens_urls(call.session):  # nobody to ask: nothing to do
            return

        async def ask(server: str, params: types.ElicitRequestURLParams) -> Any:
            inflight = [InflightCall(call.state.id, call.call_id)]
            return await self._server_request(server, inflight, "elicitation/create", params)

        await login_ask.log_in_first(self.location, snapshot, called_tool(tool, arguments),
                                     call.session, ask, owner=call.state.owner)

    async def result(
        self, outcome: Any, snapshot: Snapshot, *, modern: bool
    ) -> types.CallToolResult:
        missing = _missing_capability(outcome) if modern else None
        if missing is not None:  # the spec's protocol error, not a tool failure (HTTP 400)
            raise MCPError(MISSING_CAPABILITY, *missing)
        wire = await self.result_wire(outcome, snapshot, modern=modern)
        return types.CallToolResult.model_validate(wire)

    async def result_wire(
        self, outcome: Any, snapshot: Snapshot, *, modern: bool
    ) -> dict[str, Any]:
        """The result of a call as sent: `structuredContent` relayed by the tool's rule, and
        the URIs in its content namespaced like listed resources (`upstream`)."""
        seam = self.location.seam
        wire = await tools.bounded_result_wire(outcome, snapshot, modern=modern,
                                               store=seam.store, namespace=seam.location,
                                               bounds=seam.bounds)
        entry = snapshot.entry(outcome.tool)
        if entry is not None and entry.origin.startswith(MCP_ORIGIN):
            self.upstreams.rewrite_result_uris(wire, entry.origin.removeprefix(MCP_ORIGIN))
        return wire


MISSING_CAPABILITY = -32021
"""2026-07-28: the request needs a client capability the caller did not declare."""


def _servers_of(snapshot: Snapshot) -> tuple[str, ...]:
    """The upstream servers whose tools `snapshot` lists, in name order."""
    found = {entry.origin.removeprefix(MCP_ORIGIN) for name in snapshot.names
             if (entry := snapshot.entry(name)) is not None
             and entry.origin.startswith(MCP_ORIGIN)}
    return tuple(sorted(found))


def _missing_capability(outcome: Any) -> tuple[str, Any] | None:
    """The message and data of an upstream's -32021 answer to the call (as `bridges.mcp`
    words a server's JSON-RPC error and keeps its data), or None."""
    error = getattr(outcome, "error", None)
    if getattr(outcome, "status", None) != "error" or error is None:
        return None
    message = str(error.message)
    if not message.endswith(f"(JSON-RPC code {MISSING_CAPABILITY})"):
        return None
    partial = getattr(outcome, "partial", None) or {}
    return message, partial.get("data")

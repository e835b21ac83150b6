"""One live MCP session with an upstream server, over stdio, streamable HTTP or SSE. Imports the
rest of `bridges` and `sidecar.model`; exports `open_connection`,
`Connection`, `Era`, `configured_mode` (the protocol eras: its docstring), `ConfigProblem`,
`UI_EXTENSION` and `UI_MIME_TYPE`.

`open_connection` builds the transport a `ServerConfig` names, wraps its read stream so we learn
when the connection ends, and enters an SDK `Client` over it (no response cache; our own
callbacks for notifications and logs). `Connection` then lists tools (every page) and sends
tool calls, skipping the SDK's client-side output validation (`output_validation` in the
manifest decides what is checked, in our codecs). Over stdio a call is written on the pipe
directly (`bridges.mcp.stdio.DirectRequests`), with the `_meta` the session stamps on every
request; over HTTP and SSE it goes through `session.send_request`. Either way the result is
parsed as a `CallToolResult` (or a 2026-07-28 `input_required` round, or a task) without the
fields only later protocol versions define (`bridges.mcp.call_results`).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Self, cast

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client._transport import ReadStream, Transport, TransportStreams
from mcp.client.extension import advertise
from mcp.client.session import (
    ElicitationFnT,
    ListRootsFnT,
    LoggingFnT,
    MessageHandlerFnT,
    SamplingFnT,
)
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import TypeAdapter

from bridges.manifest.loading import ServerConfig
from bridges.mcp.call_results import (
    CALL_RESULT,
    MAX_INPUT_ROUNDS,
    STATE_ONLY_PAUSE,
    AnswerFnT,
    PlainResult,
    answer_all,
    follow_task,
    later_revision_fields,
    plain_result,
)
from bridges.mcp.direct_requests import RESULT_TOO_LARGE
from bridges.mcp.http_limit import LISTING_REFUSAL, LimitedTransport
from bridges.mcp.http_parse import streamable_http_client
from bridges.mcp.listening import ResourceWatch
from bridges.mcp.listing import CheckedPage, Listing, ToolLimit, check_page
from bridges.mcp.passthrough import CALLER_CAPABILITIES, CALLER_INPUT_RESPONSES
from bridges.mcp.sse import sse_transport
from bridges.mcp.stdio import DirectRequests, StderrTail, stdio_transport
from bridges.mcp.transport_state import TransportState
from bridges.prestart import StdioSpec
from sidecar.model import tracing

log = logging.getLogger("bridges.mcp")

CLIENT_INFO = types.Implementation(name="mcp-sidecar", version="0.1.0")
UI_EXTENSION = "io.modelcontextprotocol/ui"
"""MCP Apps (SEP-1865), advertised to every upstream as a client extension."""
UI_MIME_TYPE = "text/html;profile=mcp-app"
MAX_LIST_PAGES = 1000
LIST_READ_TIMEOUT = 300.0
"""How long one `tools/list` page asked on the pipe may take (start-up has its own timeout)."""
HTTP_CONNECT_TIMEOUT = 30.0
MODES = ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS)



class ConfigProblem(Exception):
    """A server entry that cannot work as written; retrying will not help."""


def configured_mode(config: ServerConfig) -> str:
    """The `protocol` key of a server entry: a declared field once the manifest model has one,
    until then an extra key the manifest keeps.

    It picks how to connect: `auto` (the default: try `server/discover`, fall back to
    `initialize`), `legacy` (the 2025 handshake directly) or a 2026 version such as
    `2026-07-28`. `auto` costs one round trip against a plain 2025 server, which answers the
    unknown method at once; only a server that never answers unknown methods makes the probe
    wait its 10 s, and `protocol = "legacy"` is the remedy for those. Once connected, the
    supervisor remembers the era (`Connection.era`) and reconnects with it directly."""
    mode = getattr(config, "protocol", None) or (config.model_extra or {}).get("protocol", "auto")
    if mode not in MODES:
        raise ConfigProblem(f"protocol {mode!r} is not one of {', '.join(MODES)}")
    return str(mode)


@dataclass(frozen=True, slots=True)
class Era:
    """How to connect: a `Client` mode and, for a known 2026 server, its discover result."""

    mode: str
    prior: types.DiscoverResult | None = None


class Connection:
    """A connected session. Calls may come from any task; `lost` is set when it ends."""

    __slots__ = ("_client", "_direct", "lost", "pipe_stamped", "tools_hints", "watched")

    def __init__(
        self, client: Client, lost: anyio.Event, direct: DirectRequests | None = None
    ) -> None:
        self._client = client
        self.lost = lost
        self.tools_hints: tuple[int, str] | None = None
        """The cache hints (`ttlMs`, `cacheScope`) of the last `tools/list` (`list_tools`);
        None from a handshake-era server or before a listing."""
        self.watched = ResourceWatch()
        """The resource URIs clients subscribed to, which a 2026-07-28 connection's
        `subscriptions/listen` stream asks for (its supervisor's, kept across reconnects)."""
        # The session's request stamp (`_meta` of the negotiated era) is SDK-private; without
        # it, calls take the SDK's own way.
        stamp = getattr(client.session, "_stamp", None)
        on_pipe = pipe_stamp(stamp) if callable(stamp) else None
        if callable(stamp) and self.modern:
            stamp = _caller_stamp(stamp)
            client.session._stamp = stamp
            on_pipe = _caller_stamp(on_pipe) if on_pipe is not None else None
        self._direct = (
            (direct, on_pipe or stamp) if direct is not None and callable(stamp) else None)
        self.pipe_stamped = self._direct is not None and on_pipe is not None
        """Whether direct requests carry the session's `_meta` as taken once (`pipe_stamp`)."""

    @property
    def direct(self) -> bool:
        """Whether tool calls are written on the pipe directly (stdio)."""
        return self._direct is not None

    @property
    def client(self) -> Client:
        return self._client

    @property
    def protocol_version(self) -> str:
        return self._client.protocol_version

    @property
    def modern(self) -> bool:
        return self.protocol_version in MODERN_PROTOCOL_VERSIONS

    def era(self) -> Era:
        session = self._client.session
        if self.modern:
            return Era(self.protocol_version, session.discover_result)
        return Era("legacy")

    async def list_tools(
        self, max_page_bytes: int | None = None, limit: ToolLimit | None = None
    ) -> Listing:
        """Every page of `tools/list` (up to `limit.max_tools` offered tools), and a warning if
        the listing had to stop early.

        A page is checked in a worker thread, tool by tool (a page can be tens of megabytes:
        the SDK's session checks it on the event loop in one piece, 2-6 s for 50 MB), and the
        tools past the cap are counted, not checked (`bridges.mcp.listing`). Over stdio it is
        asked for on the pipe directly, and a page over `max_page_bytes` is refused unparsed
        (`MCPError` naming `max_listing_bytes`); over streamable HTTP the transport
        (`http_limit.LimitedTransport`) fails a listing over `max_listing_bytes` before it is
        parsed (off the loop, `http_parse`)."""
        limit = limit or ToolLimit()
        tools: list[types.Tool] = []
        seen: set[str] = set()
        cursor: str | None = None
        offered = 0
        hints: tuple[int, str] | None = None

        def done(warning: str | None = None, over_cap: int = 0) -> Listing:
            self.tools_hints = hints
            ttl, scope = hints if hints is not None else (None, None)
            return Listing(tools, warning, over_cap, limit.max_tools, ttl, scope)

        for _ in range(MAX_LIST_PAGES):
            room = limit.max_tools - offered
            if self._direct is not None:
                checked = await self._direct_list(cursor, max_page_bytes, room, limit)
            else:
                checked = await self._session_list(cursor, room, limit)
            page = checked.page
            tools.extend(page.tools)
            offered += checked.offered
            if self.modern:  # the smallest ttlMs, `public` only when every page says so
                scope = "public" if page.cache_scope == "public" else "private"
                hints = (page.ttl_ms, scope) if hints is None else (
                    min(hints[0], page.ttl_ms), scope if hints[1] == "public" else "private")
            cursor = page.next_cursor
            if checked.over_cap:
                return done(None, checked.over_cap)
            if cursor is None:
                return done()
            if cursor in seen:
                return done(
                    f"tools/list repeated the cursor {cursor!r}; kept the {len(tools)} tools "
                    "listed before it")
            seen.add(cursor)
        return done(f"tools/list did not end after {MAX_LIST_PAGES} pages; kept "
                    f"{len(tools)}")

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_timeout: float,
        progress: ProgressFnT | None,
        answer: AnswerFnT | None = None,
    ) -> types.CallToolResult | PlainResult:
        """One `tools/call` (a result of text blocks alone comes as a `PlainResult`). A
        2026-07-28 server that needs sampling, elicitation or roots answers with an
        `input_required` result instead; each embedded request goes to `answer` (None:
        refused) and the call is resent with the responses and the server's `requestState`,
        up to `MAX_INPUT_ROUNDS` times."""
        input_responses: types.InputResponses | None = (
            CALLER_INPUT_RESPONSES.get() if self.modern else None)
        request_state: str | None = None
        for _ in range(MAX_INPUT_ROUNDS + 1):
            meta: dict[str, Any] = {}
            tracing.inject_into(meta)  # W3C traceparent for the server, when tracing is on
            result = await self._send_call(name, arguments, input_responses, request_state,
                                           meta, call_timeout, progress)
            if isinstance(result, types.CallToolResult | PlainResult):
                return result
            if isinstance(result, dict):  # SEP-2663: the server made a task of the call
                return await follow_task(self._client.session, result, call_timeout, answer)
            input_responses = await answer_all(result.input_requests or {}, answer)
            request_state = result.request_state
            if not result.input_requests:
                await anyio.sleep(STATE_ONLY_PAUSE)
        raise MCPError(
            types.INTERNAL_ERROR,
            f"tool {name!r} still asked for input after {MAX_INPUT_ROUNDS} rounds",
        )

    async def _send_call(
        self, name: str, arguments: dict[str, Any],
        input_responses: types.InputResponses | None, request_state: str | None,
        meta: dict[str, Any], call_timeout: float, progress: ProgressFnT | None,
    ) -> types.CallToolResult | types.InputRequiredResult | PlainResult | dict[str, Any]:
        """One round of `call`: on the pipe (a plain call builds no request model) or through
        the SDK session."""
        if (self._direct is not None and input_responses is None and request_state is None
                and not meta):
            return await self._direct_call(
                {"name": name, "arguments": arguments}, call_timeout, progress)
        request = types.CallToolRequest(params=types.CallToolRequestParams(
            name=name, arguments=arguments,
            input_responses=input_responses, request_state=request_state,
            _meta=cast("types.RequestParamsMeta", meta) if meta else None,
        ))
        if self._direct is not None:
            return await self._direct_call(
                request.params.model_dump(by_alias=True, mode="json", exclude_none=True),
                call_timeout, progress)
        result: types.CallToolResult | types.InputRequiredResult | dict[str, Any]
        result = await self._client.session.send_request(
            request,
            cast("TypeAdapter[Any]", CALL_RESULT),
            request_read_timeout_seconds=call_timeout,
            progress_callback=progress,
        )
        return result

    async def _direct_list(
        self, cursor: str | None, max_bytes: int | None, room: int, limit: ToolLimit
    ) -> CheckedPage:
        """One `tools/list` page on the pipe, stamped as `ClientSession.send_request` does."""
        assert self._direct is not None
        direct, stamp = self._direct
        data: dict[str, Any] = {"method": "tools/list",
                                "params": {} if cursor is None else {"cursor": cursor}}
        stamp(data, {})
        raw = await direct.request(
            "tools/list", data["params"], read_timeout=LIST_READ_TIMEOUT,
            max_answer=None if max_bytes is None else (max_bytes, "max_listing_bytes"))
        foreign = later_revision_fields(self._client.protocol_version, "tools/list")
        box = [raw]
        del raw  # the thread frees the page
        # Not abandoned on cancellation: the page is dropped in the thread either way.
        return await anyio.to_thread.run_sync(check_page, box, foreign, self.modern, room,
                                              limit.offered)

    async def _session_list(self, cursor: str | None, room: int, limit: ToolLimit
                            ) -> CheckedPage:
        """One `tools/list` page through the SDK session's dispatcher (stamped and timed as
        `ClientSession.send_request` does), checked in a worker thread, then absorbed by the
        session (its per-tool state for later calls). Without those SDK internals, the
        session's own `list_tools`."""
        session = self._client.session
        send = getattr(getattr(session, "_dispatcher", None), "send_raw_request", None)
        stamp = getattr(session, "_stamp", None)
        absorb = getattr(session, "_absorb_tool_listing", None)
        if not (callable(send) and callable(stamp) and callable(absorb)):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            return CheckedPage(await session.list_tools(params=params), 0, 0)
        data: dict[str, Any] = {"method": "tools/list"}
        if cursor is not None:
            data["params"] = {"cursor": cursor}
        opts: dict[str, Any] = {}
        stamp(data, opts)
        timeout = getattr(session, "_session_read_timeout_seconds", None)
        if timeout is not None:
            opts["timeout"] = timeout
        try:
            raw = await send("tools/list", data.get("params"), opts)
        except MCPError as exc:
            # The SDK words a stream `http_limit` failed as a parse or stream failure; the
            # reason is the stdio one.
            at = exc.message.find(LISTING_REFUSAL)
            if at < 0 or "max_listing_bytes" not in exc.message:
                raise
            raise MCPError(RESULT_TOO_LARGE, exc.message[at:]) from None
        foreign = later_revision_fields(self._client.protocol_version, "tools/list")
        box = [raw]
        del raw  # the thread frees the page
        checked = await anyio.to_thread.run_sync(check_page, box, foreign, self.modern, room,
                                                 limit.offered)
        page = checked.page
        listed: types.ListToolsResult = absorb(
            page, complete=cursor is None and page.next_cursor is None and not checked.over_cap)
        return CheckedPage(listed, checked.offered, checked.over_cap)

    async def _direct_call(
        self, params: dict[str, Any], call_timeout: float, progress: ProgressFnT | None
    ) -> types.CallToolResult | types.InputRequiredResult | PlainResult | dict[str, Any]:
        """`tools/call` with these params (wire JSON) on the pipe, stamped and checked as
        `ClientSession.send_request` does (a result of text blocks alone is not made a model:
        `plain_result`)."""
        assert self._direct is not None
        direct, stamp = self._direct
        data: dict[str, Any] = {"method": "tools/call", "params": params}
        stamp(data, {})
        raw = await direct.request(
            "tools/call", data["params"], read_timeout=call_timeout, on_progress=progress
        )
        ttl = raw.get("ttlMs")
        if isinstance(ttl, int | float) and not isinstance(ttl, bool) and ttl < 0:
            raw["ttlMs"] = 0  # floored, as the SDK does (2026-07-28 caching SHOULD)
        # The SDK also runs the negotiated version's result schema here (a serialization of the
        # whole result); the tagged union below checks the same fields and the codecs check
        # the tool's own schemas, so that pass is left out (about 5 % of the bridge's CPU).
        version = self._client.protocol_version
        if not (foreign := later_revision_fields(version)).isdisjoint(raw):
            raw = {key: value for key, value in raw.items() if key not in foreign}
        return plain_result(raw) or CALL_RESULT.validate_python(raw, by_name=False)


def pipe_stamp(stamp: Callable[[dict[str, Any], Any], None]
               ) -> Callable[[dict[str, Any], Any], None] | None:
    """The session's request stamp as far as it touches a request line on a pipe: its
    `_meta`. The SDK's 2026-07-28 stamp also builds each request's HTTP headers
    (`Mcp-Method`, `Mcp-Name`, `Mcp-Param-*`), which a pipe never sends: ~17 µs a call under
    cProfile (2026-12-06). Its `_meta` (protocol version, client info, capabilities, a log
    level) does not depend on the request, so it is taken once from probes: the keys it
    assigns and the keys it only fills in when the request has none. None when the probes
    show a `_meta` that depends on the request (then the stamp runs on every request)."""
    probes: list[dict[str, Any]] = [{"method": method, "params": params} for method, params in (
        ("tools/call", {"name": "a", "arguments": {}}),
        ("tools/call", {"name": "b", "arguments": {"x": 1}}),
        ("tools/list", {}),
    )]
    metas = []
    for probe in probes:
        stamp(probe, {})
        metas.append(probe["params"].get("_meta") or {})
    first = metas[0]
    if any(meta.keys() != first.keys() or any(meta[k] is not v for k, v in first.items())
           for meta in metas[1:]):
        return None
    held: dict[str, Any] = {"method": "tools/call", "params": {"name": "a", "arguments": {},
                                               "_meta": dict.fromkeys(first, _HELD)}}
    stamp(held, {})
    kept = held["params"]["_meta"]
    if kept.keys() != first.keys():
        return None
    assigned = {key: value for key, value in first.items() if kept[key] is not _HELD}
    filled = {key: value for key, value in first.items() if kept[key] is _HELD}

    def stamped(data: dict[str, Any], opts: Any) -> None:
        if assigned or filled:
            meta = data.setdefault("params", {}).setdefault("_meta", {})
            meta.update(assigned)
            for key, value in filled.items():
                meta.setdefault(key, value)

    return stamped


_HELD = object()
"""A probe's own `_meta` value: still there after the stamp, the stamp only fills that key."""


def _caller_stamp(stamp: Callable[[dict[str, Any], Any], None]
                  ) -> Callable[[dict[str, Any], Any], None]:
    """The session's 2026-07-28 stamp, declaring the downstream caller's capabilities
    (`passthrough.CALLER_CAPABILITIES`) while a frontend serves that caller's request."""

    def stamped(data: dict[str, Any], opts: Any) -> None:
        stamp(data, opts)
        caps = CALLER_CAPABILITIES.get()
        if caps is not None:
            meta = data.setdefault("params", {}).setdefault("_meta", {})
            meta[CLIENT_CAPABILITIES_KEY] = caps

    return stamped


CLIENT_CAPABILITIES_KEY = "io.modelcontextprotocol/clientCapabilities"


@asynccontextmanager
async def open_connection(
    server: str,
    config: ServerConfig,
    *,
    era: Era,
    on_message: MessageHandlerFnT,
    on_log: LoggingFnT,
    stderr: StderrTail,
    state: TransportState,
    sampling: SamplingFnT | None = None,
    elicitation: ElicitationFnT | None = None,
    list_roots: ListRootsFnT | None = None,
    auth: httpx2.Auth | None = None,
) -> AsyncIterator[Connection]:
    """Connect (transport + handshake); leaving the block closes everything it opened.

    `sampling`, `elicitation` and `list_roots` answer those server-to-client requests; each one
    given is also advertised as a client capability (see `bridges.mcp.passthrough`). MCP Apps
    (`UI_EXTENSION`) is advertised too: the gateway hands `ui://` resources and tools' `_meta.ui`
    on, and a client without Apps still gets each tool's text. `auth` authorizes the requests
    of a streamable HTTP server (`bridges.mcp.oauth`)."""
    lost = anyio.Event()
    direct = DirectRequests(on_log) if config.transport == "stdio" else None
    async with AsyncExitStack() as stack:
        transport = await _transport(stack, server, config, stderr, state, direct, auth)
        client = Client(
            _watched(transport, lost),
            mode=era.mode,
            prior_discover=era.prior,
            cache=None,
            message_handler=on_message,
            logging_callback=on_log,
            log_level="info",
            client_info=CLIENT_INFO,
            sampling_callback=sampling,
            elicitation_callback=elicitation,
            list_roots_callback=list_roots,
            extensions=[advertise(UI_EXTENSION, {"mimeTypes": [UI_MIME_TYPE]})],
        )
        await stack.enter_async_context(client)
        if era.prior is None and era.mode not in ("legacy", "auto"):
            await _discover_pinned(client, era.mode, server)
        yield Connection(client, lost, direct)


async def _discover_pinned(client: Client, version: str, server: str) -> None:
    """A server pinned to a 2026 version (`protocol = "2026-07-28"`) connects without a
    probe, and the SDK then adopts an empty capability set for it: its resources and prompts
    would never be listed. So `server/discover` is asked at that version once, and adopted
    when the server supports it; a server that does not answer it keeps the empty set (one
    log line), as before."""
    session = client.session
    try:
        raw = await session.send_discover(version)
        found = types.DiscoverResult.model_validate(raw)
    except (MCPError, ValueError) as exc:
        log.info("[%s] server/discover at the pinned %s failed (%s): its capabilities are "
                 "not known, so only its tools are listed", server, version, exc)
        return
    if version not in found.supported_versions:
        log.warning("[%s] pinned to protocol %s, which the server does not list among its "
                    "versions (%s)", server, version, ", ".join(found.supported_versions))
        return
    session.adopt(found.model_copy(update={"supported_versions": [version]}))


async def _transport(
    stack: AsyncExitStack,
    server: str,
    config: ServerConfig,
    stderr: StderrTail,
    state: TransportState,
    direct: DirectRequests | None,
    auth: httpx2.Auth | None = None,
) -> Transport:
    # Reads on HTTP streams may legitimately stay silent for as long as a call may run.
    read_timeout = max(300.0, config.timeouts.call + 60.0)
    if config.transport == "stdio":
        spec = StdioSpec.of(config)
        return stdio_transport(spec, server=server, stderr=stderr, info=state, direct=direct)
    assert config.url is not None
    if config.transport == "sse":
        return sse_transport(
            config.url,
            headers=config.headers,
            connect_timeout=HTTP_CONNECT_TIMEOUT,
            read_timeout=read_timeout,
            max_event_size=config.max_result_bytes,
            state=state,
            auth=auth,
            max_listing_size=config.max_listing_bytes,
        )
    http = httpx2.AsyncClient(
        headers=dict(config.headers),
        timeout=httpx2.Timeout(HTTP_CONNECT_TIMEOUT, read=read_timeout),
        transport=LimitedTransport(httpx2.AsyncHTTPTransport(), config.max_result_bytes,
                                   config.max_listing_bytes),
        auth=auth,
    )
    await stack.enter_async_context(http)
    return streamable_http_client(
        config.url, http_client=http, max_sse_event_size=config.max_result_bytes
    )


@asynccontextmanager
async def _watched(transport: Transport, lost: anyio.Event) -> AsyncIterator[TransportStreams]:
    async with transport as (read, write):
        yield _WatchedReadStream(read, lost), write


class _WatchedReadStream:
    """A read stream that sets `lost` when the transport ends it."""

    __slots__ = ("_inner", "_lost")

    def __init__(self, inner: ReadStream[SessionMessage | Exception], lost: anyio.Event) -> None:
        self._inner = inner
        self._lost = lost

    @property
    def last_context(self) -> Any:
        # The dispatcher runs handlers in the sender's context when the stream carries one.
        return getattr(self._inner, "last_context", None)

    async def receive(self) -> SessionMessage | Exception:
        try:
            return await self._inner.receive()
        except (anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError):
            self._lost.set()
            raise

    async def aclose(self) -> None:
        self._lost.set()
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        try:
            return await self.receive()
        except anyio.EndOfStream:
            raise StopAsyncIteration from None

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc_val: BaseException | None,
        exc_tb: TracebackType | None,
    ) -> None:
        await self.aclose()

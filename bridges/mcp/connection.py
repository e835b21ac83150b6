"""One live MCP session with an upstream server, over stdio, streamable HTTP or SSE.

`open_connection` builds the transport a `ServerConfig` names, wraps its read stream so we learn
when the connection ends, and enters an SDK `Client` over it (no response cache; our own
callbacks for notifications and logs). `Connection` then lists tools (every page) and sends
tool calls with `session.send_request`, which skips the SDK's client-side output validation:
`output_validation` in the manifest decides what is checked, in our codecs.

Protocol eras. `protocol` in a server's manifest entry picks how to connect: `auto` (the
default: try `server/discover`, fall back to `initialize`), `legacy` (the 2025 handshake
directly) or a 2026 version such as `2026-07-28`. `auto` costs one round trip against a plain
2025 server, which answers the unknown method at once; only a server that never answers unknown
methods makes the probe wait its 10 s, and `protocol = "legacy"` is the remedy for those. Once
connected, the supervisor remembers the era (`Connection.era`) and reconnects with it directly.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import Annotated, Any, Self

import anyio
import httpx2
import mcp_types as types
from mcp import Client
from mcp.client._transport import ReadStream, Transport, TransportStreams
from mcp.client.session import (
    ElicitationFnT,
    ListRootsFnT,
    LoggingFnT,
    MessageHandlerFnT,
    SamplingFnT,
)
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import Discriminator, Tag, TypeAdapter

from bridges.manifest import ServerConfig
from bridges.mcp.http_limit import LimitedTransport
from bridges.mcp.sse import sse_transport
from bridges.mcp.stdio import StderrTail, StdioSpec, stdio_transport
from bridges.mcp.transport_state import TransportState

log = logging.getLogger("bridges.mcp")

CLIENT_INFO = types.Implementation(name="mcp-sidecar", version="0.1.0")
MAX_LIST_PAGES = 1000
HTTP_CONNECT_TIMEOUT = 30.0
MODES = ("auto", "legacy", *MODERN_PROTOCOL_VERSIONS)



class ConfigProblem(Exception):
    """A server entry that cannot work as written; retrying will not help."""


def configured_mode(config: ServerConfig) -> str:
    """The `protocol` key of a server entry: a declared field once the manifest model has one,
    until then an extra key the manifest keeps."""
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

    __slots__ = ("_client", "lost")

    def __init__(self, client: Client, lost: anyio.Event) -> None:
        self._client = client
        self.lost = lost

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

    async def list_tools(self) -> tuple[list[types.Tool], str | None]:
        """Every page of `tools/list`, and a warning if the listing had to stop early."""
        tools: list[types.Tool] = []
        seen: set[str] = set()
        cursor: str | None = None
        for _ in range(MAX_LIST_PAGES):
            params = types.PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            page = await self._client.session.list_tools(params=params)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if cursor is None:
                return tools, None
            if cursor in seen:
                return tools, (
                    f"tools/list repeated the cursor {cursor!r}; kept the {len(tools)} tools "
                    "listed before it"
                )
            seen.add(cursor)
        return tools, f"tools/list did not end after {MAX_LIST_PAGES} pages; kept {len(tools)}"

    async def call(
        self,
        name: str,
        arguments: dict[str, Any],
        *,
        call_timeout: float,
        progress: ProgressFnT | None,
        answer: AnswerFnT | None = None,
    ) -> types.CallToolResult:
        """One `tools/call`. A 2026-07-28 server that needs sampling, elicitation or roots
        answers with an `input_required` result instead; each embedded request goes to
        `answer` (None: refused) and the call is resent with the responses and the server's
        `requestState`, up to `MAX_INPUT_ROUNDS` times."""
        input_responses: types.InputResponses | None = None
        request_state: str | None = None
        for _ in range(MAX_INPUT_ROUNDS + 1):
            request = types.CallToolRequest(params=types.CallToolRequestParams(
                name=name, arguments=arguments,
                input_responses=input_responses, request_state=request_state,
            ))
            result = await self._client.session.send_request(
                request,
                _CALL_RESULT,
                request_read_timeout_seconds=call_timeout,
                progress_callback=progress,
            )
            if isinstance(result, types.CallToolResult):
                return result
            input_responses = await _answer_all(result.input_requests or {}, answer)
            request_state = result.request_state
            if not result.input_requests:
                await anyio.sleep(STATE_ONLY_PAUSE)
        raise MCPError(
            types.INTERNAL_ERROR,
            f"tool {name!r} still asked for input after {MAX_INPUT_ROUNDS} rounds",
        )


AnswerFnT = Callable[[types.InputRequest], Awaitable[types.InputResponse | types.ErrorData]]
"""Answers one request embedded in an `input_required` result (sampling, elicitation, roots)."""

MAX_INPUT_ROUNDS = 10
STATE_ONLY_PAUSE = 0.05


def _result_kind(value: Any) -> str:
    if isinstance(value, dict):
        return "input" if value.get("resultType") == "input_required" else "complete"
    return "input" if isinstance(value, types.InputRequiredResult) else "complete"


# Tagged by `resultType` so a large result is validated once, as a `CallToolResult`.
_CALL_RESULT: TypeAdapter[types.CallToolResult | types.InputRequiredResult] = TypeAdapter(
    Annotated[
        Annotated[types.CallToolResult, Tag("complete")]
        | Annotated[types.InputRequiredResult, Tag("input")],
        Discriminator(_result_kind),
    ]
)


async def _answer_all(
    requests: dict[str, types.InputRequest], answer: AnswerFnT | None
) -> types.InputResponses | None:
    """Every embedded request answered concurrently; the first refusal ends the call."""
    if not requests:
        return None
    responses: types.InputResponses = {}
    refused: list[types.ErrorData] = []

    async def one(key: str, request: types.InputRequest) -> None:
        if answer is None:
            reply: types.InputResponse | types.ErrorData = types.ErrorData(
                code=types.INVALID_REQUEST, message=f"{request.method} cannot be answered here")
        else:
            reply = await answer(request)
        if isinstance(reply, types.ErrorData):
            refused.append(reply)
            tg.cancel_scope.cancel()
        else:
            responses[key] = reply

    async with anyio.create_task_group() as tg:
        for key, request in requests.items():
            tg.start_soon(one, key, request)
    if refused:
        raise MCPError.from_error_data(refused[0])
    return responses


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
) -> AsyncIterator[Connection]:
    """Connect (transport + handshake); leaving the block closes everything it opened.

    `sampling`, `elicitation` and `list_roots` answer those server-to-client requests; each one
    given is also advertised as a client capability (see `bridges.mcp.passthrough`)."""
    lost = anyio.Event()
    async with AsyncExitStack() as stack:
        transport = await _transport(stack, server, config, stderr, state)
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
        )
        await stack.enter_async_context(client)
        yield Connection(client, lost)


async def _transport(
    stack: AsyncExitStack,
    server: str,
    config: ServerConfig,
    stderr: StderrTail,
    state: TransportState,
) -> Transport:
    # Reads on HTTP streams may legitimately stay silent for as long as a call may run.
    read_timeout = max(300.0, config.timeouts.call + 60.0)
    if config.transport == "stdio":
        assert config.command is not None
        spec = StdioSpec(
            command=config.command,
            args=tuple(config.args),
            env=config.env,
            cwd=config.cwd,
            max_message_bytes=config.max_result_bytes,
        )
        return stdio_transport(spec, server=server, stderr=stderr, info=state)
    assert config.url is not None
    if config.transport == "sse":
        return sse_transport(
            config.url,
            headers=config.headers,
            connect_timeout=HTTP_CONNECT_TIMEOUT,
            read_timeout=read_timeout,
            max_event_size=config.max_result_bytes,
            state=state,
        )
    http = httpx2.AsyncClient(
        headers=dict(config.headers),
        timeout=httpx2.Timeout(HTTP_CONNECT_TIMEOUT, read=read_timeout),
        transport=LimitedTransport(httpx2.AsyncHTTPTransport(), config.max_result_bytes),
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

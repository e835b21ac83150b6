"""What an upstream call returns, in the core's terms. Imports `bridges.mcp.stdio`, `sidecar.model`;
exports `tool_response` (and its `STRUCTURED_KEY`), `tool_error`, `rpc_failure`,
`transport_failure`, `is_*`, `content_item`.

    CallToolResult                         -> ToolResponse
      content (text/image/audio/resource/resource_link) -> our content items, same meaning
      structuredContent                    -> output (when the tool has an output codec), else
                                              metadata {"structuredContent": ...} (a View's data)
      _meta                                -> metadata {"_meta": ...}
      isError                              -> ToolFailure(the tool's text)          tool_failure
    JSON-RPC error (any code)              -> ToolFailure(kind=upstream), the server's message
    an answer that is not a valid result   -> ToolFailure(kind=upstream), at once
    connection lost / transport failure    -> ToolFailure(kind=upstream) (the server restarts)
    our call timeout                       -> ToolFailure(kind=timeout)

Every message names the server and the tool. Text values are handed on as the same `str`
objects the parser produced: a large result is never copied here.
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types
from mcp.shared.exceptions import MCPError

from bridges.mcp.call_results import PROTOCOL_META_PREFIX, PlainResult
from bridges.mcp.stdio import ConnectionLost, RequestTimedOut
from sidecar.model.content import (
    AudioContent,
    ContentItem,
    ImageContent,
    ResourceContent,
    ResourceLink,
    TextContent,
)
from sidecar.model.errors import ErrorKind, ToolFailure
from sidecar.model.tool import ToolResponse

NO_CONTENT = "(no content)"
STRUCTURED_KEY = "structuredContent"
"""Metadata key of an upstream `structuredContent` when the tool declares no `outputSchema`."""


def content_item(block: types.ContentBlock) -> ContentItem:
    """One MCP content block as our content item (annotations on blocks are not kept)."""
    if isinstance(block, types.TextContent):
        return TextContent(block.text)
    if isinstance(block, types.ImageContent):
        return ImageContent(block.data, block.mime_type)
    if isinstance(block, types.AudioContent):
        return AudioContent(block.data, block.mime_type)
    if isinstance(block, types.ResourceLink):
        return ResourceLink(
            uri=block.uri,
            name=block.name,
            description=block.description,
            mime_type=block.mime_type,
        )
    resource = block.resource
    if isinstance(resource, types.TextResourceContents):
        return ResourceContent(uri=resource.uri, mime_type=resource.mime_type, text=resource.text)
    return ResourceContent(uri=resource.uri, mime_type=resource.mime_type, blob=resource.blob)


def tool_response(result: types.CallToolResult, *, has_output: bool) -> ToolResponse:
    """A successful (`isError` false) result as a `ToolResponse`.

    With an output codec, `structuredContent` is the output and empty content is derived from it
    by the seam. Without one, content is what the model reads: empty content becomes the
    structured content as JSON text, or "(no content)"; the structured content itself rides in
    the metadata under `STRUCTURED_KEY` (bounded like all metadata, redacted by guardrails), and
    the MCP facade hands it on as `structuredContent` (an MCP App's View renders it).
    """
    content: list[ContentItem] = [content_item(block) for block in result.content]
    meta = vendor_meta(result.meta)
    metadata = {"_meta": meta} if meta else None
    if has_output:
        return ToolResponse(output=result.structured_content, content=content or None,
                            metadata=metadata)
    structured = result.structured_content
    if not content:
        text = NO_CONTENT if structured is None else _json(structured)
        content = [TextContent(text)]
    if structured is not None:  # no outputSchema: the data an MCP App's View renders
        metadata = {**(metadata or {}), STRUCTURED_KEY: structured}
    return ToolResponse(content=content, metadata=metadata)


def plain_response(result: PlainResult, *, has_output: bool) -> ToolResponse:
    """`tool_response` of a result of text blocks alone (`plain_result`)."""
    content: list[ContentItem] = [TextContent(text) for text in result.texts]
    if has_output:
        return ToolResponse(output=None, content=content)
    return ToolResponse(content=content)


def vendor_meta(meta: dict[str, Any] | None) -> dict[str, Any]:
    """A result's `_meta` without the protocol's own keys (e.g. the 2026 serverInfo stamp)."""
    return {k: v for k, v in (meta or {}).items() if not k.startswith(PROTOCOL_META_PREFIX)}


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def tool_error(result: types.CallToolResult, *, server: str, tool: str) -> ToolFailure:
    """An `isError` result: the tool's own words, for the model."""
    text = "\n".join(b.text for b in result.content if isinstance(b, types.TextContent)).strip()
    if not text and result.structured_content is not None:
        text = _json(result.structured_content)
    return _reported(text, server, tool)


def plain_error(result: PlainResult, *, server: str, tool: str) -> ToolFailure:
    """`tool_error` of a result of text blocks alone (`plain_result`)."""
    return _reported("\n".join(result.texts).strip(), server, tool)


def _reported(text: str, server: str, tool: str) -> ToolFailure:
    return ToolFailure(
        text or f"tool {tool!r} of MCP server {server!r} reported an error without a message",
        metadata={"server": server, "tool": tool},
    )


_SDK_CLOSED = "Connection closed"


def is_transport_loss(exc: MCPError, *, direct: bool) -> bool:
    """Whether `exc` says our transport ended (not a server's error response with the same
    code). Requests written on the pipe directly (`direct`) raise `ConnectionLost` for that;
    the SDK's own requests raise its plain `Connection closed` error without data.

    A server's error response may carry any code, the ones the SDK uses for its own conditions
    included (-32000 "connection closed", -32001 "request timeout": servers use both for their
    own errors). Only our side's conditions (this and `is_our_timeout`) mean a lost transport
    or an expired call; an error response never restarts the server."""
    if isinstance(exc, ConnectionLost):
        return True
    return (not direct and exc.code == types.CONNECTION_CLOSED and exc.message == _SDK_CLOSED
            and exc.data is None)


def is_our_timeout(exc: MCPError, *, direct: bool, method: str = "tools/call") -> bool:
    """Whether `exc` is our own read timeout (not a server's -32001 error response)."""
    if isinstance(exc, RequestTimedOut):
        return True
    return (not direct and exc.code == types.REQUEST_TIMEOUT
            and exc.message == f"Request {method!r} timed out" and exc.data is None)


MISSING_CAPABILITY = -32021
"""2026-07-28: a request needs a client capability the caller did not declare."""


def rpc_failure(
    exc: MCPError, *, server: str, tool: str, timeout: float, detail: str = "",
    lost: bool = False, timed_out: bool = False,
) -> ToolFailure:
    """A JSON-RPC level failure of a call; `lost` / `timed_out`: our side's condition (see
    `is_transport_loss`, `is_our_timeout`), else the server's error response."""
    where = f"MCP server {server!r}, tool {tool!r}"
    meta: dict[str, Any] = {"server": server, "tool": tool, "code": exc.code}
    if exc.code == MISSING_CAPABILITY and exc.data is not None:
        meta["data"] = exc.data  # which capabilities: the facade relays this error as it is
    if timed_out:
        return ToolFailure(
            f"{where}: no result within {timeout:g} s (timeouts.call); the call was cancelled "
            "upstream",
            meta,
            kind=ErrorKind.TIMEOUT,
        )
    # Ours name max_result_bytes (RESULT_TOO_LARGE is in the server-error range: a server may
    # send that code for its own errors too).
    if (
        "max_result_bytes" in exc.message
        or (exc.message.startswith("SSE stream failed") and "exceeded" in exc.message)
    ):
        return ToolFailure(
            f"{where}: the result is larger than max_result_bytes and was not accepted; raise "
            f"max_result_bytes for this server to accept it ({exc.message})",
            meta,
            kind=ErrorKind.UPSTREAM,
        )
    if lost:
        hint = f"; {detail}" if detail else ""
        return ToolFailure(
            f"{where}: the connection to the server was lost during the call ({exc.message})"
            f"{hint}. The server is being restarted; retry the call later.",
            meta,
            kind=ErrorKind.UPSTREAM,
        )
    return ToolFailure(
        f"{where}: the server answered with an error: {exc.message} (JSON-RPC code {exc.code})",
        meta,
        kind=ErrorKind.UPSTREAM,
    )


def transport_failure(exc: BaseException, *, server: str, tool: str) -> ToolFailure:
    """The call could not complete for a reason below JSON-RPC (network, invalid result)."""
    detail = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    if len(detail) > 300:
        detail = detail[:300] + "..."
    return ToolFailure(
        f"MCP server {server!r}, tool {tool!r}: the call failed upstream: {detail}",
        {"server": server, "tool": tool},
        kind=ErrorKind.UPSTREAM,
    )

"""`tools/list` and `tools/call`: the registry through a per-session snapshot and the seam.
A call's runner context is `call_context`'s docstring, its result `bounded_result_wire`'s.

Imports the core, `sidecar.formats`, `managed_store` and the rest of `sidecar.serve`. Exports
`tool_list`, `call_context`, `bounded_result_wire`, `call_result_wire`, `error_result`,
`error_wire` and the `_meta` keys (`CALL_ID_KEY`, `MESSAGE_ID_KEY`, `AGENT_KEY`,
`STARTING_KEY`) with `DEFAULT_AGENT`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any

import mcp_types as types

from bridges.mcp import STRUCTURED_KEY
from managed_store import TextStore
from sidecar.execution.snapshot import Snapshot
from sidecar.formats import definitions_for, result_for
from sidecar.formats.results import META_PREFIX
from sidecar.model.outcome import Outcome
from sidecar.model.tool import Bounds, ToolContext
from sidecar.serve.mcp_facade.structured import advertise_output_schemas, bound_structured

log = logging.getLogger("sidecar.mcp")

CALL_ID_KEY = "io.mcp-sidecar/call_id"
MESSAGE_ID_KEY = "io.mcp-sidecar/message_id"
AGENT_KEY = "io.mcp-sidecar/agent"
STARTING_KEY = "io.mcp-sidecar/starting"
"""In a `tools/list` result's `_meta`: the upstream servers still starting (their tools are not
listed yet; a `list_changed` follows when each is ready)."""
DEFAULT_AGENT = "mcp-client"
METADATA_META = f"{META_PREFIX}metadata"


def tool_list(
    snapshot: Snapshot, *, modern: bool,
    meta_out: Callable[[str, dict[str, Any]], dict[str, Any]] | None = None,
) -> types.ListToolsResult:
    """`meta_out(name, _meta)`: a tool's `_meta` as clients see it (MCP Apps' UI URIs)."""
    wire = definitions_for("mcp", snapshot.definitions, wrap_structured=not modern)
    advertise_output_schemas(wire, snapshot)
    if meta_out is not None:
        for tool in wire:
            if isinstance(tool.get("_meta"), dict):
                tool["_meta"] = meta_out(tool["name"], tool["_meta"])
    return types.ListToolsResult(tools=[types.Tool.model_validate(d) for d in wire])


def call_context(
    *,
    session_id: str,
    request_id: types.RequestId | None,
    meta: Mapping[str, Any] | None,
    client_name: str | None,
    owner: str | None = None,
) -> ToolContext:
    """The runner context of a call (`ToolContext`), from the request:

    - `session_id`: the MCP session (stdio: one id per process);
    - `call_id`: `_meta["io.mcp-sidecar/call_id"]`, else `<session id>:<JSON-RPC request id>`;
    - `message_id`: `_meta["io.mcp-sidecar/message_id"]`, else the call id;
    - `agent`: `_meta["io.mcp-sidecar/agent"]`, else the client's `clientInfo.name`, else
      `mcp-client`.
    """
    meta = meta or {}

    def given(key: str) -> str | None:
        value = meta.get(key)
        return value if isinstance(value, str) and value else None

    call_id = given(CALL_ID_KEY) or f"{session_id}:{request_id}"
    return ToolContext(
        session_id=session_id,
        agent=given(AGENT_KEY) or client_name or DEFAULT_AGENT,
        message_id=given(MESSAGE_ID_KEY) or call_id,
        call_id=call_id,
        owner=owner,
    )


async def bounded_result_wire(
    outcome: Outcome, snapshot: Snapshot, *, modern: bool, store: TextStore, namespace: str,
    bounds: Bounds,
) -> dict[str, Any]:
    """`call_result_wire` with `structuredContent` relayed by the tool's `structured_output`
    rule (see `structured`). Results are `result_for("mcp", outcome, ...)`: bounded content,
    `structuredContent` (wrapped as `{"result": ...}` for 2025-era sessions when not an object; a
    bounded result is always a success), `isError` for every failure (operational ones show
    only their error id). `tools/list` advertises `outputSchema` by the same rule."""
    wire = call_result_wire(outcome, snapshot, modern=modern)
    return await bound_structured(wire, outcome, snapshot, store=store, namespace=namespace,
                                  bounds=bounds)


def call_result_wire(outcome: Outcome, snapshot: Snapshot, *, modern: bool) -> dict[str, Any]:
    """The `CallToolResult` of an outcome as it goes on the wire (camelCase keys)."""
    entry = snapshot.entry(outcome.tool)
    schema = entry.definition.output_schema if entry is not None else None
    wire: dict[str, Any] = result_for(
        "mcp", outcome, tool_call_id="", wrap_structured=not modern, output_schema=schema
    )
    if schema is None and outcome.metadata and STRUCTURED_KEY in outcome.metadata:
        _lift_structured(wire)
    return wire


def _lift_structured(wire: dict[str, Any]) -> None:
    """An upstream tool without `outputSchema` returned `structuredContent` (kept in the
    outcome's metadata by `bridges.mcp`): sent as `structuredContent` again, the data an MCP
    App's View renders. The outcome's own metadata is not changed."""
    meta = wire.get("_meta")
    if not isinstance(meta, dict) or "structuredContent" in wire:
        return
    metadata = meta.get(METADATA_META)
    if not isinstance(metadata, dict):
        return
    rest = {k: v for k, v in metadata.items() if k != STRUCTURED_KEY}
    wire["structuredContent"] = metadata[STRUCTURED_KEY]
    meta = {k: v for k, v in meta.items() if k != METADATA_META}
    if rest:
        meta[METADATA_META] = rest
    if meta:
        wire["_meta"] = meta
    else:
        del wire["_meta"]


def error_result(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=message)], is_error=True)


def error_wire(message: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": message}], "isError": True}

"""Upstream tool listings -> the tool values one server registers. Imports `bridges.manifest`,
its `bridges.mcp` siblings, `sidecar.model` and `sidecar.registry`; exports `build_catalog`
(which tool is offered, left out or registered, and how: its docstring), `Catalog`,
`UpstreamTool`, `offered` and `permission_default`.

Checking and compiling schemas is CPU work that grows with their size: `build_catalog` is
synchronous and pure, so the supervisor runs it in a worker thread, never on the event loop.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types
import pydantic_core

from bridges.manifest.loading import AnnotationPermissions, ServerConfig
from bridges.manifest.loading import Decision as ManifestDecision
from bridges.mcp.codecs import PassCodec, WarnCodec
from bridges.mcp.health import SkippedTool
from sidecar.model.codec import Codec, JsonSchemaCodec
from sidecar.model.errors import RegistrationError, SchemaDefinitionError
from sidecar.model.names import RESERVED_NAMES, plain_names
from sidecar.model.permissions import Decision
from sidecar.model.tool import Annotations, Bounds, CallContext, Tool
from sidecar.registry.registry import build_entries

_RESTRICTIVENESS: dict[str, int] = {"allow": 0, "ask": 1, "deny": 2}


@dataclass(frozen=True, slots=True)
class UpstreamTool:
    """What a call needs to know about the upstream tool behind a registered value."""

    name: str
    has_output: bool
    permission_default: Decision | None


CallUpstream = Callable[[UpstreamTool, Any, CallContext], Awaitable[Any]]


@dataclass(frozen=True, slots=True)
class Catalog:
    """One server's registrable tools and what was left out."""

    tools: dict[str, Tool]
    skipped: tuple[SkippedTool, ...]
    filtered: int


def offered(name: str, config: ServerConfig) -> bool:
    allow = config.tools.allow
    if allow is not None and not any(fnmatch.fnmatchcase(name, p) for p in allow):
        return False
    return not any(fnmatch.fnmatchcase(name, p) for p in config.tools.deny)


def build_catalog(
    server: str, config: ServerConfig, listing: Sequence[types.Tool], call: CallUpstream
) -> Catalog:
    """The tool values of one server's listing. For each upstream tool, in listing order:

    1. `tools.allow` / `tools.deny` globs (over upstream names) decide whether it is offered;
       filtered tools are only counted.
    2. A repeated upstream name, a definition over the server's `max_definition_bytes` (as
       JSON; 1 MiB by default), an invalid `inputSchema` (or one that does not describe an
       object), an invalid `outputSchema` under `output_validation = "strict"`, an effective
       name already taken by an earlier tool of the same server, or an effective name reserved
       for a sidecar built-in (`managed_read`, `execute`, `search_tools`, `describe_tools`:
       possible with `namespace = ""`) leaves the tool out, with the reason recorded (health
       and the log). The server's other tools still register.
    3. The rest become `sidecar.Tool` values: input codec from `inputSchema` (we validate
       before dispatch), output codec from `outputSchema` per `output_validation`, title,
       annotations, `_meta`, the server's `bounds` and the permission default
       (`permission_default`).
    """
    namespace = config.effective_namespace(server)
    plain = plain_names(
        (upstream.name, namespace) for upstream in listing if offered(upstream.name, config))
    tools: dict[str, Tool] = {}
    skipped: list[SkippedTool] = []
    owners: dict[str, str] = {}  # effective name -> upstream name
    filtered = 0
    for upstream in listing:
        if not offered(upstream.name, config):
            filtered += 1
            continue
        if upstream.name in tools:
            skipped.append(SkippedTool(upstream.name, "the server lists this name twice"))
            continue
        size = len(pydantic_core.to_json(upstream))
        if size > config.max_definition_bytes:
            skipped.append(SkippedTool(upstream.name, (
                f"its definition is {size:,} bytes of JSON, over this server's "
                f"max_definition_bytes ({config.max_definition_bytes:,})")))
            continue
        try:
            tool = _tool_value(server, config, upstream, call)
            (effective,) = build_entries({upstream.name: tool}, namespace, plain=plain)
        except (SchemaDefinitionError, RegistrationError, ValueError) as exc:
            skipped.append(SkippedTool(upstream.name, _reason(upstream.name, exc)))
            continue
        if effective in RESERVED_NAMES:
            skipped.append(SkippedTool(upstream.name, (
                f"its effective name {effective!r} is reserved for the sidecar's built-in "
                "tool; give this server a namespace to offer it")))
            continue
        if effective in owners:
            skipped.append(SkippedTool(
                upstream.name,
                f"its effective name {effective!r} is already used by {owners[effective]!r}",
            ))
            continue
        owners[effective] = upstream.name
        tools[upstream.name] = tool
    return Catalog(tools=tools, skipped=tuple(skipped), filtered=filtered)


def _reason(name: str, exc: Exception) -> str:
    return str(exc).removeprefix(f"tool {name!r}: ") or type(exc).__name__


def _tool_value(
    server: str, config: ServerConfig, upstream: types.Tool, call: CallUpstream
) -> Tool:
    try:
        input_codec = JsonSchemaCodec(upstream.input_schema)
    except SchemaDefinitionError as exc:
        raise SchemaDefinitionError(f"invalid inputSchema: {exc.message}", exc.path) from None
    output_codec = _output_codec(server, config, upstream)
    annotations = _annotations(upstream.annotations)
    info = UpstreamTool(
        name=upstream.name,
        has_output=output_codec is not None,
        permission_default=permission_default(config.permissions, upstream.annotations),
    )

    async def execute(arguments: Any, ctx: CallContext) -> Any:
        return await call(info, arguments, ctx)

    bounds = config.bounds
    return Tool(
        description=upstream.description or "",
        input=input_codec,
        output=output_codec,
        execute=execute,
        title=upstream.title or (upstream.annotations.title if upstream.annotations else None),
        annotations=annotations,
        bounds=(
            Bounds(max_bytes=bounds.max_bytes, max_lines=bounds.max_lines)
            if bounds.max_bytes is not None or bounds.max_lines is not None
            else None
        ),
        meta=_with_task_support(upstream),
        structured_output=config.structured_output,
    )


TASK_SUPPORT_META = "io.mcp-sidecar/taskSupport"
"""In a tool's `_meta`: its upstream's `execution.taskSupport` (`optional` or `required`), so
the MCP facade can run calls of it as tasks (SEP-2663)."""


def _with_task_support(upstream: types.Tool) -> dict[str, Any] | None:
    support = upstream.execution.task_support if upstream.execution is not None else None
    if support not in ("optional", "required"):
        return upstream.meta or None
    return {**(upstream.meta or {}), TASK_SUPPORT_META: support}


def _output_codec(server: str, config: ServerConfig, upstream: types.Tool) -> Codec | None:
    schema = upstream.output_schema
    if schema is None:
        return None
    mode = config.output_validation
    if mode == "off":
        return PassCodec(schema)
    try:
        if mode == "warn":
            return WarnCodec(schema, server=server, tool=upstream.name)
        return JsonSchemaCodec(schema)
    except SchemaDefinitionError as exc:
        if mode == "warn":
            return PassCodec(schema)
        raise SchemaDefinitionError(f"invalid outputSchema: {exc.message}", exc.path) from None


def _annotations(upstream: types.ToolAnnotations | None) -> Annotations | None:
    if upstream is None:
        return None
    return Annotations(
        title=upstream.title,
        read_only_hint=upstream.read_only_hint,
        destructive_hint=upstream.destructive_hint,
        idempotent_hint=upstream.idempotent_hint,
        open_world_hint=upstream.open_world_hint,
    )


def permission_default(
    table: AnnotationPermissions, annotations: types.ToolAnnotations | None
) -> Decision | None:
    """The decision when no permission rule matches the tool: every hint that is true and has a
    decision in the server's `permissions` table contributes it, and the most restrictive
    contribution wins (deny > ask > allow); with none, `permissions.default` applies."""
    contributions: list[ManifestDecision] = []
    if annotations is not None:
        hints = (
            (annotations.read_only_hint, table.read_only),
            (annotations.destructive_hint, table.destructive),
            (annotations.open_world_hint, table.open_world),
        )
        contributions = [decision for hint, decision in hints if hint and decision is not None]
    if contributions:
        return max(contributions, key=_RESTRICTIVENESS.__getitem__)
    return table.default

"""Tool definitions in each provider's request format: `definitions_for` (one element per
format: the table is in its docstring), `mcp_output_schema`, `wraps_output`, `RESULT_KEY`,
`ANTHROPIC_TOOL_SEARCH`.
Imports its `sidecar.formats` siblings and `sidecar.registry` (`ToolDefinition`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sidecar.formats.formats import Format, parse_format
from sidecar.formats.gemini_schema import gemini_parameters
from sidecar.formats.openai_strict import NotStrictable, strict_schema
from sidecar.formats.schema_refs import is_object_schema, plain
from sidecar.registry.registry import ToolDefinition

RESULT_KEY = "result"
"""The property that holds a non-object output when MCP structured content is wrapped."""

_SKIP_REFS = frozenset({"enum", "const", "default", "examples", "example"})
_NAMED = frozenset(
    {"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"}
)
"""Keywords whose value maps names (which may be any word, `enum` too) to schemas."""


ANTHROPIC_TOOL_SEARCH: Mapping[str, str] = {
    "type": "tool_search_tool_bm25_20251119", "name": "tool_search_tool_bm25",
}
"""Anthropic's server-side tool search tool (BM25 variant), sent beside deferred tools."""


def definitions_for(
    format: Format,
    definitions: Sequence[ToolDefinition],
    *,
    strict: bool = False,
    wrap_structured: bool = True,
    deferred: Sequence[ToolDefinition] = (),
) -> list[dict[str, Any]]:
    """The `tools` value for `format` (`UnknownFormat` for any other name).

    `strict` asks OpenAI (`openai`, `openai-responses`) for strict mode; a tool whose schema
    cannot be made strict (see `openai_strict`) keeps its schema with `strict: false`. The other
    formats have no such mode and ignore it. `wrap_structured` (MCP only) wraps output schemas
    that do not describe an object as `{"result": <schema>}`, as MCP 2025-06-18 and 2025-11-25
    require; pass False for 2026-07-28 sessions, which take any output schema.

    Exactly the value of the request's `tools` field (MCP: the `tools` of a `tools/list`
    result), in the order given:

    format              one element
    `mcp`               MCP `Tool`: name, title?, description, inputSchema, outputSchema?,
                        annotations? (camelCase hints), _meta?
    `openai`            Chat Completions `{"type": "function", "function": {name, description,
                        parameters, strict?}}`
    `openai-responses`  Responses `{"type": "function", name, description, parameters, strict}`
                        (`strict` always present: the Responses API defaults it to true)
    `anthropic`         Messages `{name, description, input_schema}`
    `gemini`            ONE Tool `{"functionDeclarations": [{name, description, parameters?}]}`
                        holding every declaration (or `[]` when there are no tools)

    Every input schema gets `type: "object"` at its root when it lacks one (MCP, OpenAI and
    Anthropic require it); OpenAI also requires `properties` there. Schemas are otherwise passed
    unchanged, except for Gemini (see `gemini_schema`) and OpenAI strict mode (see
    `openai_strict`). Everything returned is a fresh copy: callers may mutate it.

    `deferred` (tool search, `expose = "search"`): tools the model finds by searching. Only
    Anthropic loads tools on demand: they follow with `defer_loading: true`, then Anthropic's
    tool search tool (`ANTHROPIC_TOOL_SEARCH`). The other formats leave them out.
    """
    fmt = parse_format(format)
    if fmt == "anthropic" and deferred:
        return [*(_anthropic(d, strict) for d in definitions),
                *({**_anthropic(d, strict), "defer_loading": True} for d in deferred),
                dict(ANTHROPIC_TOOL_SEARCH)]
    if fmt == "gemini":
        declarations = [_gemini(d) for d in definitions]
        return [{"functionDeclarations": declarations}] if declarations else []
    if fmt == "mcp":
        return [_mcp(d, wrap_structured) for d in definitions]
    build: Callable[[ToolDefinition, bool], dict[str, Any]] = _BUILDERS[fmt]
    return [build(d, strict) for d in definitions]


def mcp_output_schema(schema: Mapping[str, Any], *, wrap: bool = True) -> dict[str, Any]:
    """An output schema as MCP `outputSchema`.

    With `wrap`, a schema whose values are not all objects becomes
    `{"type": "object", "properties": {"result": <schema>}, "required": ["result"]}`; its
    `$defs`/`definitions` move to the new root and its local references are rebased, so they
    still resolve. `result_for("mcp", ..., output_schema=...)` wraps values by the same rule.
    """
    root: dict[str, Any] = plain(schema)
    if not wrap:
        return root
    if is_object_schema(root, root):
        return _object_root(root)
    hoisted = {k: root.pop(k) for k in ("$schema", "$defs", "definitions") if k in root}
    prefix = f"/properties/{RESULT_KEY}"
    wrapped: dict[str, Any] = {
        "type": "object",
        "properties": {RESULT_KEY: _rebase(root, prefix)},
        "required": [RESULT_KEY],
    }
    wrapped.update(_rebase(hoisted, prefix))
    return wrapped


def wraps_output(schema: Mapping[str, Any] | None, output: Any) -> bool:
    """Whether a 2025-era MCP result carries `output` as `{"result": output}`: by the output
    schema when known (the rule of `mcp_output_schema`), else by the value."""
    if schema is not None:
        return not is_object_schema(schema, schema)
    return not isinstance(output, dict)


def _mcp(d: ToolDefinition, wrap: bool) -> dict[str, Any]:
    tool: dict[str, Any] = {"name": d.name}
    if d.title is not None:
        tool["title"] = d.title
    tool["description"] = d.description
    tool["inputSchema"] = _object_root(d.input_schema)
    if d.output_schema is not None:
        tool["outputSchema"] = mcp_output_schema(d.output_schema, wrap=wrap)
    if d.annotations:
        tool["annotations"] = {_camel(k): plain(v) for k, v in d.annotations.items()}
    if d.meta:
        tool["_meta"] = plain(d.meta)
    return tool


def _openai_parameters(d: ToolDefinition, strict: bool) -> tuple[dict[str, Any], bool | None]:
    """(parameters, strict flag): the flag is None when strict mode was not asked for."""
    if strict:
        try:
            return strict_schema(_openai_root(d.input_schema)), True
        except NotStrictable:
            return _openai_root(d.input_schema), False
    return _openai_root(d.input_schema), None


def _openai_chat(d: ToolDefinition, strict: bool) -> dict[str, Any]:
    parameters, flag = _openai_parameters(d, strict)
    function: dict[str, Any] = {
        "name": d.name, "description": d.description, "parameters": parameters
    }
    if flag is not None:
        function["strict"] = flag
    return {"type": "function", "function": function}


def _openai_responses(d: ToolDefinition, strict: bool) -> dict[str, Any]:
    parameters, flag = _openai_parameters(d, strict)
    return {
        "type": "function",
        "name": d.name,
        "description": d.description,
        "parameters": parameters,
        "strict": bool(flag),
    }


def _anthropic(d: ToolDefinition, strict: bool) -> dict[str, Any]:
    return {
        "name": d.name,
        "description": d.description,
        "input_schema": _object_root(d.input_schema),
    }


def _gemini(d: ToolDefinition) -> dict[str, Any]:
    declaration: dict[str, Any] = {"name": d.name, "description": d.description}
    parameters = gemini_parameters(d.input_schema)
    if parameters is not None:
        declaration["parameters"] = parameters
    return declaration


_BUILDERS: dict[str, Callable[[ToolDefinition, bool], dict[str, Any]]] = {
    "openai": _openai_chat,
    "openai-responses": _openai_responses,
    "anthropic": _anthropic,
}


def _object_root(schema: Mapping[str, Any]) -> dict[str, Any]:
    root: dict[str, Any] = plain(schema)
    return root if "type" in root else {"type": "object", **root}


def _openai_root(schema: Mapping[str, Any]) -> dict[str, Any]:
    """OpenAI refuses an object root without `properties` ("object schema missing properties")."""
    root = _object_root(schema)
    if root.get("type") == "object" and "properties" not in root:
        root["properties"] = {}
    return root


def _camel(key: str) -> str:
    head, *rest = key.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _rebase(node: Any, prefix: str) -> Any:
    """Local `$ref`s that point into the schema itself (not into `$defs`/`definitions`) get
    `prefix`, after the schema moved to that place inside a new root."""
    if isinstance(node, list):
        return [_rebase(item, prefix) for item in node]
    if not isinstance(node, dict):
        return node
    out: dict[str, Any] = {}
    for key, value in node.items():
        if key == "$ref" and isinstance(value, str) and value.startswith("#"):
            inside = value[1:]
            keep = inside.startswith(("/$defs/", "/definitions/"))
            out[key] = value if keep else f"#{prefix}{inside}"
        elif key in _SKIP_REFS:
            out[key] = value  # data, not schemas
        elif key in _NAMED and isinstance(value, dict):
            out[key] = {name: _rebase(sub, prefix) for name, sub in value.items()}
        else:
            out[key] = _rebase(value, prefix)
    return out

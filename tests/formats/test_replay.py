"""Provider replay: golden files per provider, plus structural checks of every wire value.

Goldens live in `tests/formats/golden/<format>/<case>.json`. After a deliberate change, run
`UPDATE_GOLDEN=1 pytest tests/formats/test_replay.py` and review the diff by eye against the
provider's documented shape before committing it.
"""

from __future__ import annotations

import base64
import copy
import json
import os
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from pathlib import Path
from typing import Any

import jsonschema
import mcp.types
import pytest
from mcp_types import _v2025_11_25 as wire_2025

from sidecar.formats import (
    FORMATS,
    NotStrictable,
    UnknownFormat,
    definitions_for,
    gemini_parameters,
    input_from_strict,
    mcp_output_schema,
    parse_format,
    result_for,
    strict_schema,
)
from sidecar.model.content import (
    AudioContent,
    ContentItem,
    ImageContent,
    ResourceContent,
    ResourceLink,
    TextContent,
    content_from_output,
)
from sidecar.model.errors import CallError, ErrorKind
from sidecar.model.outcome import ManagedText, Outcome
from sidecar.registry.registry import ToolDefinition

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
CALL_ID = "call_7Fq2"
PNG = base64.b64encode(b"\x89PNG\r\n\x1a\n" + bytes(56)).decode()
SVG = base64.b64encode(b'<svg xmlns="http://www.w3.org/2000/svg"/>').decode()
WAV = base64.b64encode(b"RIFF" + bytes(40)).decode()
PDF = base64.b64encode(b"%PDF-1.7\n" + bytes(23)).decode()
BIN = base64.b64encode(bytes(range(10))).decode()


# --- definitions ---------------------------------------------------------------------------

ADDRESS = {
    "type": "object",
    "title": "Address",
    "properties": {
        "street": {"type": "string"},
        "city": {"type": "string"},
        "zip": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
    },
    "required": ["street", "city"],
}

DEFINITIONS: dict[str, ToolDefinition] = {
    "simple": ToolDefinition(
        name="weather_current",
        title="Current weather",
        description="Current weather for a city",
        input_schema={
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Paris"},
                "units": {"type": "string", "enum": ["metric", "imperial"], "default": "metric"},
            },
            "required": ["city"],
        },
        annotations={"read_only_hint": True, "open_world_hint": True},
    ),
    "nested": ToolDefinition(
        name="shop_create_order",
        description="Create an order",
        input_schema={
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "$defs": {
                "Address": ADDRESS,
                "Line": {
                    "type": "object",
                    "properties": {
                        "sku": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]+$"},
                        "quantity": {"type": "integer", "minimum": 1, "default": 1},
                    },
                    "required": ["sku"],
                },
                "Card": {
                    "type": "object",
                    "properties": {"kind": {"const": "card"}, "last4": {"type": "string"}},
                    "required": ["kind", "last4"],
                },
                "Invoice": {
                    "type": "object",
                    "properties": {"kind": {"const": "invoice"}, "days": {"type": "integer"}},
                    "required": ["kind"],
                },
            },
            "properties": {
                "ship_to": {"$ref": "#/$defs/Address", "description": "Where to ship"},
                "bill_to": {"allOf": [{"$ref": "#/$defs/Address"}], "description": "Billing"},
                "lines": {
                    "type": "array",
                    "items": {"$ref": "#/$defs/Line"},
                    "minItems": 1,
                },
                "payment": {
                    "oneOf": [{"$ref": "#/$defs/Card"}, {"$ref": "#/$defs/Invoice"}],
                    "discriminator": {"propertyName": "kind"},
                },
            },
            "required": ["ship_to", "lines", "payment"],
        },
    ),
    "recursive": ToolDefinition(
        name="fs_write_tree",
        description="Create a directory tree",
        input_schema={
            "type": "object",
            "$defs": {
                "Node": {
                    "type": "object",
                    "title": "Node",
                    "properties": {
                        "name": {"type": "string"},
                        "children": {
                            "type": "array",
                            "items": {"$ref": "#/$defs/Node"},
                            "description": "Entries inside a directory",
                        },
                    },
                    "required": ["name"],
                }
            },
            "properties": {"root": {"$ref": "#/$defs/Node"}},
            "required": ["root"],
        },
    ),
    "recursive-root": ToolDefinition(
        name="db_query",
        description="Run a query expression",
        input_schema={
            "type": "object",
            "properties": {
                "op": {"type": "string", "enum": ["and", "or", "eq"]},
                "field": {"type": "string"},
                "value": {"type": "string"},
                "args": {"type": "array", "items": {"$ref": "#"}},
            },
            "required": ["op"],
        },
    ),
    "nullable": ToolDefinition(
        name="notes_update",
        description="Update a note",
        input_schema={
            "type": "object",
            "properties": {
                "id": {"type": "integer"},
                "title": {"type": ["string", "null"], "description": "New title; null clears it"},
                "tags": {"type": ["array", "null"], "items": {"type": "string"}},
                "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
                "color": {"enum": ["red", "green", None]},
                "owner": {
                    "type": ["object", "null"],
                    "properties": {"login": {"type": "string"}},
                    "required": ["login"],
                },
                "pinned": {"type": "boolean"},
                "score": {"type": ["number", "string"]},
            },
            "required": ["id", "title"],
        },
    ),
    "enums": ToolDefinition(
        name="img_render",
        description="Render an image",
        input_schema={
            "type": "object",
            "properties": {
                "format": {"type": "string", "enum": ["png", "jpeg", "webp"]},
                "quality": {"type": "integer", "enum": [50, 75, 100]},
                "scale": {"enum": [0.5, 1, 2]},
                "version": {"const": 2},
                "engine": {"const": "skia"},
                "dither": {"const": True},
                "style": {"oneOf": [{"const": "flat"}, {"const": "shaded"}]},
            },
            "required": ["format"],
        },
    ),
    "freeform": ToolDefinition(
        name="http_request",
        description="Send an HTTP request",
        input_schema={
            "type": "object",
            "properties": {
                "url": {"type": "string", "format": "uri"},
                "headers": {"type": "object", "additionalProperties": {"type": "string"}},
                "body": {"description": "Any JSON body"},
                "options": {"type": "object"},
                "retries": {"type": "array"},
            },
            "required": ["url"],
        },
    ),
    "constraints": ToolDefinition(
        name="geo_search",
        description="Search places",
        input_schema={
            "type": "object",
            "properties": {
                "query": {"type": "string", "minLength": 1, "maxLength": 200},
                "when": {"type": "string", "format": "date-time"},
                "contact": {"type": "string", "format": "email", "examples": ["a@b.c"]},
                "radius": {"type": "number", "exclusiveMinimum": 0, "maximum": 50000},
                "step": {"type": "integer", "multipleOf": 5, "format": "int32"},
                "point": {
                    "type": "array",
                    "prefixItems": [{"type": "number"}, {"type": "number"}],
                    "minItems": 2,
                    "maxItems": 2,
                },
                "ids": {"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
                "legacy": {"type": "boolean", "deprecated": True},
            },
            "required": ["query"],
        },
    ),
    "no-params": ToolDefinition(
        name="clock_now",
        description="The current time",
        input_schema={"type": "object"},
    ),
    "output": ToolDefinition(
        name="weather_forecast",
        title="Forecast",
        description="Forecast for a city",
        input_schema={
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
        output_schema={
            "type": "object",
            "properties": {
                "city": {"type": "string"},
                "days": {"type": "array", "items": {"type": "number"}},
            },
            "required": ["city", "days"],
        },
        annotations={"title": "Forecast", "read_only_hint": True, "idempotent_hint": True},
        meta={"example.com/owner": "weather-team"},
    ),
    "output-scalar": ToolDefinition(
        name="search_hits",
        description="Search and return the hits",
        input_schema={"type": "object", "properties": {"q": {"type": "string"}}},
        output_schema={
            "$defs": {
                "Hit": {
                    "type": "object",
                    "properties": {"url": {"type": "string"}, "score": {"type": "number"}},
                    "required": ["url"],
                }
            },
            "type": "array",
            "items": {"$ref": "#/$defs/Hit"},
        },
    ),
}

STRICTABLE = {"simple", "nested", "recursive", "recursive-root", "nullable", "enums",
              "no-params", "output", "output-scalar"}
"""The other cases hold free-form maps or tuples, which strict mode cannot express."""

VALID_INPUTS: dict[str, list[dict[str, Any]]] = {
    "simple": [{"city": "Paris"}, {"city": "Oslo", "units": "imperial"}],
    "nested": [
        {
            "ship_to": {"street": "1 Main St", "city": "Lyon"},
            "bill_to": {"street": "2 Side St", "city": "Lyon", "zip": None},
            "lines": [{"sku": "ABC-1"}, {"sku": "XYZ-22", "quantity": 3}],
            "payment": {"kind": "card", "last4": "4242"},
        },
        {
            "ship_to": {"street": "1 Main St", "city": "Lyon", "zip": "69001"},
            "lines": [{"sku": "ABC-1", "quantity": 1}],
            "payment": {"kind": "invoice"},
        },
    ],
    "recursive": [
        {"root": {"name": "a"}},
        {"root": {"name": "a", "children": [{"name": "b", "children": [{"name": "c"}]}]}},
    ],
    "recursive-root": [
        {"op": "and", "args": [{"op": "eq", "field": "x", "value": "1"}, {"op": "or"}]},
    ],
    "nullable": [
        {"id": 1, "title": None},
        {"id": 2, "title": "t", "tags": None, "limit": None, "color": None, "owner": None},
        {"id": 3, "title": "t", "tags": ["a"], "limit": 5, "color": "red",
         "owner": {"login": "ann"}, "pinned": True, "score": "high"},
        {"id": 4, "title": "t", "score": 2.5},
    ],
    "enums": [
        {"format": "png"},
        {"format": "webp", "quality": 75, "scale": 0.5, "version": 2, "engine": "skia",
         "dither": True, "style": "shaded"},
    ],
    "freeform": [
        {"url": "https://example.com", "headers": {"a": "b"}, "body": [1, {"x": None}],
         "options": {"k": 1}, "retries": [1, "x"]},
    ],
    "constraints": [
        {"query": "cafe"},
        {"query": "cafe", "when": "2025-01-01T00:00:00Z", "contact": "a@b.c", "radius": 10,
         "step": 15, "point": [1.5, 2.5], "ids": [1, 2], "legacy": False},
    ],
    "no-params": [{}],
    "output": [{"city": "Paris", "days": 3}],
    "output-scalar": [{}, {"q": "x"}],
}


# --- outcomes ------------------------------------------------------------------------------


def completed(
    *items: ContentItem,
    output: Any = None,
    metadata: dict[str, Any] | None = None,
    managed: tuple[ManagedText, ...] = (),
    tool: str = "weather_current",
) -> Outcome:
    content = items or content_from_output(output)
    return Outcome(
        call_id="c1", tool=tool, status="completed", content=tuple(content), output=output,
        metadata=metadata, managed=managed,
    )


def failed(kind: ErrorKind, message: str, *, path: str | None = None,
           error_id: str | None = None, partial: dict[str, Any] | None = None) -> Outcome:
    error = CallError(kind, message, path=path, error_id=error_id)
    return Outcome.failed("c1", "weather_current", error, partial)


PREVIEW = (
    "line 1\nline 2\n\n[... 61,440 bytes omitted here (lines 3-1,998 of 2,000). The full text "
    '(71,680 bytes) is kept as mt_9c1d2e: read on with managed_read(ref="mt_9c1d2e", '
    'offset=3, limit=200) or search it with managed_read(ref="mt_9c1d2e", '
    'pattern="<regex>") ...]\n\nline 1999\nline 2000'
)

OUTCOMES: dict[str, Outcome] = {
    "text": completed(TextContent("Sunny, 21 °C in Paris")),
    "json-output": completed(output={"city": "Paris", "days": [21.5, 19.0]},
                             tool="weather_forecast"),
    "json-output-summary": completed(
        TextContent("3-day forecast for Paris: mild."),
        output={"city": "Paris", "days": [21.5, 19.0, 18.0]},
        tool="weather_forecast",
    ),
    "scalar-output": completed(output=[{"url": "https://a.example", "score": 0.9}],
                               tool="search_hits"),
    "two-texts": completed(TextContent("first"), TextContent("second")),
    "image-text": completed(TextContent("Here is the chart"), ImageContent(PNG, "image/png")),
    "image-svg": completed(ImageContent(SVG, "image/svg+xml")),
    "audio": completed(TextContent("Recording:"), AudioContent(WAV, "audio/wav")),
    "resource-text": completed(
        ResourceContent("file:///work/notes.md", "text/markdown", text="# Notes\n- one")
    ),
    "resource-pdf": completed(
        ResourceContent("file:///work/report%20q3.pdf", "application/pdf", blob=PDF)
    ),
    "resource-image": completed(ResourceContent("file:///work/chart.png", "image/png", blob=PNG)),
    "resource-binary": completed(ResourceContent("file:///work/data.bin", blob=BIN)),
    "resource-link": completed(
        TextContent("Found one file"),
        ResourceLink("file:///work/big.csv", name="big.csv", description="All rows",
                     mime_type="text/csv"),
        ResourceLink("https://example.com/items/42"),
    ),
    "truncated": completed(
        TextContent(PREVIEW), managed=(ManagedText("mt_9c1d2e", 71680, 2000),)
    ),
    "metadata": completed(TextContent("ok"), metadata={"elapsed_ms": 12, "cached": False}),
    "empty-text": completed(TextContent("")),
    "error-tool-failure": failed(
        ErrorKind.TOOL_FAILURE, "City not found: Atlantis", partial={"step": "geocode"}
    ),
    "error-invalid-input": failed(
        ErrorKind.INVALID_INPUT,
        "Invalid input for weather_current: 'city' is a required property. "
        "The tool was not executed.",
        path="$.city",
    ),
    "error-invalid-output": failed(
        ErrorKind.INVALID_OUTPUT,
        "weather_forecast returned an invalid value for its output schema: "
        "'x' is not of type 'number'",
        path="$.days[1]",
    ),
    "error-unknown-tool": failed(
        ErrorKind.UNKNOWN_TOOL, "Unknown tool: weather_now. Available tools: weather_current"
    ),
    "error-unavailable": failed(
        ErrorKind.UNAVAILABLE, "Tool weather_current is not available for this request."
    ),
    "error-denied": failed(
        ErrorKind.DENIED,
        "Permission denied: weather_current is not allowed by the permission policy.",
    ),
    "error-declined": failed(ErrorKind.DECLINED, "weather_current: the user declined this call."),
    "error-timeout": failed(
        ErrorKind.TIMEOUT, "weather_current did not finish within 30 s and was cancelled.",
        partial={"fetched": 2, "of": 5},
    ),
    "error-upstream": failed(
        ErrorKind.UPSTREAM, "weather: the MCP server exited (code 1) during the call"
    ),
    "error-operational": failed(
        ErrorKind.OPERATIONAL,
        "Traceback (most recent call last): KeyError: 'secret' in /srv/app/tool.py",
        error_id="op_3f9a0c1b2d4e",
        partial={"step": "secret-step"},
    ),
}

MEDIA_CASES = ("image-text", "image-svg", "audio", "resource-pdf", "resource-image",
               "resource-binary", "resource-link")
OUTPUT_SCHEMAS = {
    "json-output": DEFINITIONS["output"].output_schema,
    "json-output-summary": DEFINITIONS["output"].output_schema,
    "scalar-output": DEFINITIONS["output-scalar"].output_schema,
}


# --- golden machinery ------------------------------------------------------------------------


def golden_cases() -> Iterator[tuple[str, str, Callable[[], Any]]]:
    """(format, case file stem, producer) for every golden file."""
    for fmt in FORMATS:
        for case, definition in DEFINITIONS.items():
            yield fmt, f"def-{case}", partial(definitions_for, fmt, [definition])
            if fmt in ("openai", "openai-responses"):
                yield fmt, f"def-{case}.strict", partial(
                    definitions_for, fmt, [definition], strict=True
                )
        for case, outcome in OUTCOMES.items():
            yield fmt, f"result-{case}", partial(
                result_for, fmt, outcome, tool_call_id=CALL_ID,
                output_schema=OUTPUT_SCHEMAS.get(case),
            )
    yield "mcp", "def-output-scalar.unwrapped", partial(
        definitions_for, "mcp", [DEFINITIONS["output-scalar"]], wrap_structured=False
    )
    yield "mcp", "result-scalar-output.unwrapped", partial(
        result_for, "mcp", OUTCOMES["scalar-output"], tool_call_id=CALL_ID,
        wrap_structured=False,
    )
    yield "gemini", "def-all", partial(definitions_for, "gemini", list(DEFINITIONS.values()))


GOLDEN_CASES = list(golden_cases())


def as_json(value: Any) -> Any:
    return json.loads(json.dumps(value))


@pytest.mark.parametrize(("fmt", "case", "produce"), GOLDEN_CASES,
                         ids=[f"{f}/{c}" for f, c, _ in GOLDEN_CASES])
def test_golden(fmt: str, case: str, produce: Callable[[], Any]) -> None:
    actual = as_json(produce())
    path = GOLDEN / fmt / f"{case}.json"
    if UPDATE:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(actual, indent=2, ensure_ascii=False) + "\n")
    assert path.exists(), f"missing golden {path}; run with UPDATE_GOLDEN=1 and review it"
    assert actual == json.loads(path.read_text()), f"{path} differs (UPDATE_GOLDEN=1 rewrites)"


def test_no_stale_goldens() -> None:
    expected = {GOLDEN / fmt / f"{case}.json" for fmt, case, _ in GOLDEN_CASES}
    present = set(GOLDEN.glob("*/*.json"))
    stale = sorted(str(p.relative_to(GOLDEN)) for p in present - expected)
    if UPDATE:
        for name in stale:
            (GOLDEN / name).unlink()
        return
    assert not stale, f"golden files no case produces: {stale}"


# --- formats ---------------------------------------------------------------------------------


def test_formats_are_the_documented_names() -> None:
    assert FORMATS == ("mcp", "openai", "openai-responses", "anthropic", "gemini")
    assert parse_format("gemini") == "gemini"


@pytest.mark.parametrize("name", ["", "OpenAI", "claude", "openai_responses"])
def test_unknown_format_names_the_known_ones(name: str) -> None:
    with pytest.raises(UnknownFormat, match="expected one of mcp, openai, openai-responses"):
        definitions_for(name, [DEFINITIONS["simple"]])  # type: ignore[arg-type]
    with pytest.raises(UnknownFormat):
        result_for(name, OUTCOMES["text"], tool_call_id=CALL_ID)  # type: ignore[arg-type]


@pytest.mark.parametrize("fmt", FORMATS)
def test_definitions_are_fresh_copies(fmt: str) -> None:
    definition = DEFINITIONS["nested"]
    before = copy.deepcopy(dict(definition.input_schema))
    first = definitions_for(fmt, [definition], strict=True)  # type: ignore[arg-type]
    json.dumps(first)  # plain JSON, no mapping proxies or tuples

    def scribble(node: Any) -> None:
        if isinstance(node, dict):
            for value in node.values():
                scribble(value)
            node["scribbled"] = True
        elif isinstance(node, list):
            for value in node:
                scribble(value)

    scribble(first)
    assert dict(definition.input_schema) == before
    assert "scribbled" not in json.dumps(definitions_for(fmt, [definition]))  # type: ignore[arg-type]


def test_definitions_keep_the_given_order() -> None:
    defs = [DEFINITIONS["simple"], DEFINITIONS["no-params"], DEFINITIONS["nested"]]
    names = [d.name for d in defs]
    assert [t["name"] for t in definitions_for("mcp", defs)] == names
    assert [t["function"]["name"] for t in definitions_for("openai", defs)] == names
    assert [t["name"] for t in definitions_for("openai-responses", defs)] == names
    assert [t["name"] for t in definitions_for("anthropic", defs)] == names
    (tool,) = definitions_for("gemini", defs)
    assert [d["name"] for d in tool["functionDeclarations"]] == names
    assert definitions_for("gemini", []) == []


# --- MCP structure ---------------------------------------------------------------------------


def dump(model: Any) -> Any:
    return model.model_dump(mode="json", by_alias=True, exclude_unset=True)


@pytest.mark.parametrize("case", DEFINITIONS)
def test_mcp_definitions_parse_as_mcp_tools(case: str) -> None:
    (tool,) = definitions_for("mcp", [DEFINITIONS[case]])
    assert dump(mcp.types.Tool.model_validate(tool)) == tool  # no misspelt or stray key
    assert dump(wire_2025.Tool.model_validate(tool)) == tool  # object roots, as 2025-11-25 wants
    jsonschema.Draft202012Validator.check_schema(tool["inputSchema"])
    if "outputSchema" in tool:
        jsonschema.Draft202012Validator.check_schema(tool["outputSchema"])


def test_mcp_annotations_are_camel_case() -> None:
    (tool,) = definitions_for("mcp", [DEFINITIONS["output"]])
    assert tool["annotations"] == {"title": "Forecast", "readOnlyHint": True,
                                   "idempotentHint": True}
    assert tool["_meta"] == {"example.com/owner": "weather-team"}
    parsed = mcp.types.Tool.model_validate(tool)
    assert parsed.annotations is not None and parsed.annotations.read_only_hint is True


@pytest.mark.parametrize("case", OUTCOMES)
@pytest.mark.parametrize("wrap", [True, False])
def test_mcp_results_parse_as_call_tool_results(case: str, wrap: bool) -> None:
    result = result_for("mcp", OUTCOMES[case], tool_call_id=CALL_ID, wrap_structured=wrap,
                        output_schema=OUTPUT_SCHEMAS.get(case))
    assert dump(mcp.types.CallToolResult.model_validate(result)) == result
    if wrap:  # 2025-11-25 wants structuredContent to be an object
        assert dump(wire_2025.CallToolResult.model_validate(result)) == result
    assert result["isError"] is (OUTCOMES[case].status == "error")


@pytest.mark.parametrize(("case", "tool"), [("json-output", "output"),
                                            ("scalar-output", "output-scalar")])
def test_mcp_structured_content_matches_the_advertised_output_schema(case: str, tool: str) -> None:
    for wrap in (True, False):
        (definition,) = definitions_for("mcp", [DEFINITIONS[tool]], wrap_structured=wrap)
        for schema in (OUTPUT_SCHEMAS[case], None):
            result = result_for("mcp", OUTCOMES[case], tool_call_id=CALL_ID,
                                wrap_structured=wrap, output_schema=schema)
            jsonschema.validate(result["structuredContent"], definition["outputSchema"])


def test_mcp_output_schema_wrapping_rebases_references() -> None:
    schema = {
        "$defs": {"Tree": {"type": "object",
                           "properties": {"kids": {"type": "array", "items": {"$ref": "#"}}}}},
        "anyOf": [{"$ref": "#/$defs/Tree"}, {"type": "string"}],
    }
    wrapped = mcp_output_schema(schema)
    assert wrapped["required"] == ["result"]
    assert wrapped["$defs"]["Tree"]["properties"]["kids"]["items"] == {
        "$ref": "#/properties/result"
    }
    value = {"result": {"kids": [{"kids": []}, "leaf"]}}
    jsonschema.validate(value, wrapped)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"result": {"kids": [3]}}, wrapped)
    # an object-valued union is not wrapped; it only gains the root type MCP requires
    union = {"anyOf": [{"type": "object", "properties": {"a": {"type": "string"}}},
                       {"type": "object", "properties": {"b": {"type": "string"}}}]}
    assert mcp_output_schema(union) == {"type": "object", **union}
    assert mcp_output_schema(schema, wrap=False) == schema


def test_mcp_result_carries_metadata_managed_refs_and_error_kind_in_meta() -> None:
    meta = result_for("mcp", OUTCOMES["metadata"], tool_call_id=CALL_ID)["_meta"]
    assert meta == {"sidecar/metadata": {"elapsed_ms": 12, "cached": False}}
    meta = result_for("mcp", OUTCOMES["truncated"], tool_call_id=CALL_ID)["_meta"]
    assert meta == {"sidecar/managed": [{"ref": "mt_9c1d2e", "size_bytes": 71680,
                                         "lines": 2000}]}
    meta = result_for("mcp", OUTCOMES["error-declined"], tool_call_id=CALL_ID)["_meta"]
    assert meta == {"sidecar/error": {"kind": "declined"}}


# --- provider shapes -------------------------------------------------------------------------

NAME = {"type": "string", "pattern": "^[A-Za-z0-9_-]{1,64}$"}
OPENAI_TOOL = {
    "type": "object",
    "required": ["type", "function"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "function": {
            "type": "object",
            "required": ["name", "description", "parameters"],
            "additionalProperties": False,
            "properties": {
                "name": NAME,
                "description": {"type": "string"},
                "parameters": {"type": "object", "required": ["type", "properties"],
                               "properties": {"type": {"const": "object"}}},
                "strict": {"type": "boolean"},
            },
        },
    },
}
RESPONSES_TOOL = {
    "type": "object",
    "required": ["type", "name", "description", "parameters", "strict"],
    "additionalProperties": False,
    "properties": {
        "type": {"const": "function"},
        "name": NAME,
        "description": {"type": "string"},
        "parameters": {"type": "object", "required": ["type", "properties"],
                       "properties": {"type": {"const": "object"}}},
        "strict": {"type": "boolean"},
    },
}
ANTHROPIC_TOOL = {
    "type": "object",
    "required": ["name", "description", "input_schema"],
    "additionalProperties": False,
    "properties": {
        "name": NAME,
        "description": {"type": "string"},
        "input_schema": {"type": "object", "required": ["type"],
                         "properties": {"type": {"const": "object"}}},
    },
}
GEMINI_TOOL = {
    "type": "object",
    "required": ["functionDeclarations"],
    "additionalProperties": False,
    "properties": {
        "functionDeclarations": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["name", "description"],
                "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_.:-]{0,63}$"},
                    "description": {"type": "string"},
                    "parameters": {"type": "object", "required": ["type", "properties"],
                                   "properties": {"type": {"const": "object"},
                                                  "properties": {"minProperties": 1}}},
                },
            },
        }
    },
}
TOOL_SHAPES = {"openai": OPENAI_TOOL, "openai-responses": RESPONSES_TOOL,
               "anthropic": ANTHROPIC_TOOL, "gemini": GEMINI_TOOL}

DATA_URL = {"type": "string", "pattern": "^data:[a-z]+/[-+.a-z0-9]+;base64,[A-Za-z0-9+/=]+$"}
RESULT_SHAPES: dict[str, Any] = {
    "openai": {
        "type": "object",
        "required": ["role", "tool_call_id", "content"],
        "additionalProperties": False,
        "properties": {"role": {"const": "tool"}, "tool_call_id": {"const": CALL_ID},
                       "content": {"type": "string"}},
    },
    "openai-responses": {
        "type": "object",
        "required": ["type", "call_id", "output"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "function_call_output"},
            "call_id": {"const": CALL_ID},
            "output": {"anyOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": {
                "oneOf": [
                    {"type": "object", "required": ["type", "text"],
                     "additionalProperties": False,
                     "properties": {"type": {"const": "input_text"},
                                    "text": {"type": "string"}}},
                    {"type": "object", "required": ["type", "image_url"],
                     "additionalProperties": False,
                     "properties": {"type": {"const": "input_image"}, "image_url": DATA_URL,
                                    "detail": {"enum": ["auto", "low", "high"]}}},
                    {"type": "object", "required": ["type", "file_data", "filename"],
                     "additionalProperties": False,
                     "properties": {"type": {"const": "input_file"}, "file_data": DATA_URL,
                                    "filename": {"type": "string", "minLength": 1}}},
                ]}}]},
        },
    },
    "anthropic": {
        "type": "object",
        "required": ["type", "tool_use_id", "content", "is_error"],
        "additionalProperties": False,
        "properties": {
            "type": {"const": "tool_result"},
            "tool_use_id": {"const": CALL_ID},
            "is_error": {"type": "boolean"},
            "content": {"type": "array", "minItems": 1, "items": {"oneOf": [
                {"type": "object", "required": ["type", "text"], "additionalProperties": False,
                 "properties": {"type": {"const": "text"},
                                "text": {"type": "string", "minLength": 1}}},
                {"type": "object", "required": ["type", "source"], "additionalProperties": False,
                 "properties": {
                     "type": {"const": "image"},
                     "source": {"type": "object", "additionalProperties": False,
                                "required": ["type", "media_type", "data"],
                                "properties": {"type": {"const": "base64"},
                                               "media_type": {"enum": ["image/jpeg", "image/png",
                                                                       "image/gif", "image/webp"]},
                                               "data": {"type": "string"}}}}},
                {"type": "object", "required": ["type", "source"], "additionalProperties": False,
                 "properties": {
                     "type": {"const": "document"},
                     "source": {"type": "object", "additionalProperties": False,
                                "required": ["type", "media_type", "data"],
                                "properties": {"type": {"const": "base64"},
                                               "media_type": {"const": "application/pdf"},
                                               "data": {"type": "string"}}}}},
            ]}},
        },
    },
    "gemini": {
        "type": "object",
        "required": ["functionResponse"],
        "additionalProperties": False,
        "properties": {"functionResponse": {
            "type": "object",
            "required": ["name", "response"],
            "additionalProperties": False,
            "properties": {
                "id": {"const": CALL_ID},
                "name": NAME,
                "response": {"oneOf": [
                    {"type": "object", "required": ["output"], "additionalProperties": False,
                     "properties": {"output": {}}},
                    {"type": "object", "required": ["error"], "additionalProperties": False,
                     "properties": {"error": {
                         "type": "object", "required": ["kind", "message"],
                         "additionalProperties": False,
                         "properties": {"kind": {"enum": [k.value for k in ErrorKind]},
                                        "message": {"type": "string"},
                                        "path": {"type": "string"},
                                        "partial": {"type": "object"},
                                        "error_id": {"type": "string"}}}}},
                ]},
            },
        }},
    },
}


@pytest.mark.parametrize("fmt", list(TOOL_SHAPES))
@pytest.mark.parametrize("strict", [False, True])
def test_definitions_have_the_provider_shape(fmt: str, strict: bool) -> None:
    tools = definitions_for(fmt, list(DEFINITIONS.values()), strict=strict)  # type: ignore[arg-type]
    for tool in tools:
        jsonschema.validate(tool, TOOL_SHAPES[fmt])


@pytest.mark.parametrize("fmt", ["openai", "openai-responses", "anthropic"])
@pytest.mark.parametrize("case", DEFINITIONS)
def test_json_schema_providers_get_valid_json_schema(fmt: str, case: str) -> None:
    for strict in (False, True):
        (tool,) = definitions_for(fmt, [DEFINITIONS[case]], strict=strict)  # type: ignore[arg-type]
        schema = (tool.get("function", tool).get("parameters") or tool["input_schema"])
        jsonschema.Draft202012Validator.check_schema(schema)
        for value in VALID_INPUTS[case]:
            if not strict or not tool.get("function", tool).get("strict"):
                jsonschema.validate(value, schema)


@pytest.mark.parametrize("fmt", list(RESULT_SHAPES))
@pytest.mark.parametrize("case", OUTCOMES)
def test_results_have_the_provider_shape(fmt: str, case: str) -> None:
    result = result_for(fmt, OUTCOMES[case], tool_call_id=CALL_ID)  # type: ignore[arg-type]
    jsonschema.validate(result, RESULT_SHAPES[fmt])


# --- Gemini schema subset --------------------------------------------------------------------

GEMINI_KEYS = {"type", "nullable", "title", "description", "format", "enum", "properties",
               "required", "items", "anyOf", "minimum", "maximum", "minLength", "maxLength",
               "pattern", "minItems", "maxItems", "minProperties", "maxProperties", "default"}
GEMINI_FORMATS = {"string": {"enum", "date-time"}, "number": {"float", "double"},
                  "integer": {"int32", "int64"}}


def assert_gemini_subset(node: Any, where: str = "$") -> None:
    assert isinstance(node, dict), where
    assert set(node) <= GEMINI_KEYS, f"{where}: {set(node) - GEMINI_KEYS}"
    kind = node.get("type")
    assert kind in (None, "string", "number", "integer", "boolean", "array", "object"), where
    if "enum" in node:
        assert kind == "string" and all(isinstance(v, str) for v in node["enum"]), where
    if "format" in node:
        assert node["format"] in GEMINI_FORMATS.get(kind or "", set()), where
    if "properties" in node or "required" in node:
        assert kind == "object" and node["properties"], where
        assert set(node.get("required", [])) <= set(node["properties"]), where
        for name, sub in node["properties"].items():
            assert_gemini_subset(sub, f"{where}.{name}")
    if kind == "array" or "items" in node:
        assert kind == "array" and "items" in node, where
        if node["items"]:
            assert_gemini_subset(node["items"], f"{where}[*]")
    for i, branch in enumerate(node.get("anyOf", [])):
        assert_gemini_subset(branch, f"{where}.anyOf[{i}]")


def gemini_as_json_schema(node: Any) -> Any:
    """Gemini's OpenAPI reading of a schema, as JSON Schema (`nullable` -> null allowed)."""
    if not isinstance(node, dict):
        return node
    out = {k: v for k, v in node.items() if k not in ("nullable", "format", "default")}
    if "properties" in out:
        out["properties"] = {k: gemini_as_json_schema(v) for k, v in out["properties"].items()}
    if "items" in out:
        out["items"] = gemini_as_json_schema(out["items"])
    if "anyOf" in out:
        out["anyOf"] = [gemini_as_json_schema(b) for b in out["anyOf"]]
    if node.get("nullable"):
        if "enum" in out:
            out["enum"] = [*out["enum"], None]
        if "type" in out:
            out["type"] = [out["type"], "null"]
        if "anyOf" in out:
            out["anyOf"] = [*out["anyOf"], {"type": "null"}]
    return out


@pytest.mark.parametrize("case", DEFINITIONS)
def test_gemini_parameters_stay_in_the_subset_and_accept_every_valid_input(case: str) -> None:
    parameters = gemini_parameters(DEFINITIONS[case].input_schema)
    if parameters is None:
        assert case == "no-params"
        return
    assert parameters["type"] == "object"
    assert_gemini_subset(parameters)
    loose = gemini_as_json_schema(parameters)
    for value in VALID_INPUTS[case]:
        jsonschema.validate(value, DEFINITIONS[case].input_schema)
        jsonschema.validate(value, loose)  # adaptation only loosens


def test_gemini_cuts_cycles_with_a_described_object() -> None:
    parameters = gemini_parameters(DEFINITIONS["recursive"].input_schema)
    assert parameters is not None
    children = parameters["properties"]["root"]["properties"]["children"]
    assert children["description"] == "Entries inside a directory"
    assert children["items"] == {
        "type": "object",
        "description": "Recursive: an object with the same structure as the enclosing Node "
        "(not expanded again).",
    }
    root = gemini_parameters(DEFINITIONS["recursive-root"].input_schema)
    assert root is not None
    assert "the whole input" in root["properties"]["args"]["items"]["description"]


def test_gemini_handles_unresolvable_references_and_odd_nodes() -> None:
    parameters = gemini_parameters({
        "type": "object",
        "properties": {
            "remote": {"$ref": "https://example.com/schema.json", "description": "Remote"},
            "anything": True,
            "only_null": {"type": "null"},
            "both": {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                               {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]},
            "old_flag": {"type": "number", "minimum": 0, "exclusiveMinimum": True},
        },
        "required": ["remote", "ghost"],
    })
    assert parameters is not None
    assert_gemini_subset(parameters)
    props = parameters["properties"]
    assert props["remote"] == {
        "description": "Remote. Its structure (https://example.com/schema.json) cannot be "
        "shown here."
    }
    assert props["anything"] == {}
    assert props["only_null"] == {"nullable": True}
    assert props["both"]["properties"].keys() == {"a", "b"}
    assert props["both"]["required"] == ["a", "b"]
    assert props["old_flag"] == {"type": "number", "description": "Must be greater than 0.",
                                 "minimum": 0}
    assert parameters["required"] == ["remote"]


# --- OpenAI strict mode ----------------------------------------------------------------------

STRICT_FORBIDDEN = {"allOf", "oneOf", "not", "if", "then", "else", "default", "patternProperties",
                    "dependentRequired", "dependentSchemas", "prefixItems", "uniqueItems",
                    "$schema", "examples", "minProperties", "maxProperties", "nullable"}


def assert_strict(node: Any, where: str = "$") -> None:
    if isinstance(node, list):
        for i, item in enumerate(node):
            assert_strict(item, f"{where}[{i}]")
        return
    if not isinstance(node, dict):
        return
    assert not set(node) & STRICT_FORBIDDEN, f"{where}: {set(node) & STRICT_FORBIDDEN}"
    if "$ref" in node:
        assert set(node) == {"$ref"}, f"{where}: $ref with siblings"
    kinds = node.get("type")
    kinds = [kinds] if isinstance(kinds, str) else kinds or []
    if "object" in kinds or "properties" in node:
        assert node["additionalProperties"] is False, where
        assert node["required"] == list(node["properties"]), where
        for name, sub in node["properties"].items():
            assert_strict(sub, f"{where}.{name}")
    for key in ("items", "anyOf"):
        if key in node:
            assert_strict(node[key], f"{where}.{key}")
    for key in ("$defs", "definitions"):
        for name, sub in node.get(key, {}).items():
            assert_strict(sub, f"{where}.{key}.{name}")


def follow(root: Mapping[str, Any], node: Any) -> Any:
    while isinstance(node, Mapping) and "$ref" in node:
        ref = node["$ref"]
        node = root
        for part in ref[2:].split("/") if ref != "#" else []:
            node = node[part]
    return node


def as_strict_call(root: Mapping[str, Any], schema: Any, value: Any) -> Any:
    """What a model sends under the strict schema for `value`: every optional key, as null."""
    schema = follow(root, schema)
    if "anyOf" in schema and value is not None:
        validator = jsonschema.Draft202012Validator(root)
        for branch in schema["anyOf"]:
            candidate = as_strict_call(root, branch, value)
            if not any(True for _ in validator.descend(candidate, branch)):
                return candidate
        raise AssertionError(f"no branch of {schema} takes {value}")
    if isinstance(value, dict):
        props = schema["properties"]
        return {k: as_strict_call(root, props[k], value[k]) if k in value else None
                for k in props}
    if isinstance(value, list):
        return [as_strict_call(root, schema["items"], v) for v in value]
    return value


def without_added_nulls(back: Any, value: Any) -> Any:
    """`back` less the null keys `value` does not have (absent and null mean the same to a
    tool whose optional property also accepts null)."""
    if isinstance(back, dict) and isinstance(value, dict):
        return {k: without_added_nulls(v, value[k]) for k, v in back.items()
                if k in value or v is not None}
    if isinstance(back, list) and isinstance(value, list) and len(back) == len(value):
        return [without_added_nulls(b, v) for b, v in zip(back, value, strict=True)]
    return back


@pytest.mark.parametrize("case", sorted(STRICTABLE))
def test_strict_schemas_follow_the_rules_and_round_trip_every_valid_input(case: str) -> None:
    original = DEFINITIONS[case].input_schema
    strict = strict_schema(original)
    assert_strict(strict)
    jsonschema.Draft202012Validator.check_schema(strict)
    for value in VALID_INPUTS[case]:
        sent = as_strict_call(strict, strict, value)
        jsonschema.validate(sent, strict)
        back = input_from_strict(original, sent)
        jsonschema.validate(back, original)
        assert without_added_nulls(back, value) == value


def test_freeform_schemas_are_not_strict_and_say_why() -> None:
    with pytest.raises(NotStrictable, match=r"\$\.headers: a map with free-form keys"):
        strict_schema(DEFINITIONS["freeform"].input_schema)
    (chat,) = definitions_for("openai", [DEFINITIONS["freeform"]], strict=True)
    assert chat["function"]["strict"] is False
    assert chat["function"]["parameters"] == dict(DEFINITIONS["freeform"].input_schema)
    (responses,) = definitions_for("openai-responses", [DEFINITIONS["freeform"]], strict=True)
    assert responses["strict"] is False


@pytest.mark.parametrize(("schema", "reason"), [
    ({"type": "object", "anyOf": [{"properties": {}}]}, "plain object"),
    ({"type": "object", "properties": {"a": {}}}, "free-form value"),
    ({"type": "object", "properties": {"a": {"type": "object"}}}, "without properties"),
    ({"type": "object", "properties": {"a": {"type": "array"}}}, "one item schema"),
    ({"type": "object", "properties": {"a": {"type": "string", "not": {"const": ""}}}}, "not"),
    ({"type": "object", "properties": {"a": {"allOf": [{"type": "string"}, {"minLength": 1}]}}},
     "allOf"),
    ({"type": "object", "properties": {"a": {"$ref": "other.json#/x"}}}, "cannot be resolved"),
    ({"type": "object", "properties": {"a": {"type": "array", "prefixItems": [{}]}}},
     "prefixItems"),
    ({"type": "object", "required": ["b"], "properties": {"a": {"type": "string"}}}, "no schema"),
])
def test_unstrictable_schemas(schema: dict[str, Any], reason: str) -> None:
    with pytest.raises(NotStrictable, match=reason):
        strict_schema(schema)


def test_strict_limits() -> None:
    deep: dict[str, Any] = {"type": "string"}
    for _ in range(11):
        deep = {"type": "object", "properties": {"x": deep}, "required": ["x"]}
    with pytest.raises(NotStrictable, match="levels"):
        strict_schema(deep)
    wide = {"type": "object", "properties": {"e": {"enum": list(range(1001))}}}
    with pytest.raises(NotStrictable, match="enum values"):
        strict_schema(wide)


def test_strict_nulls_are_kept_where_the_original_accepts_them() -> None:
    original = DEFINITIONS["nullable"].input_schema
    sent = {"id": 1, "title": None, "tags": None, "limit": None, "color": None, "owner": None,
            "pinned": None, "score": None}
    assert input_from_strict(original, sent) == {
        "id": 1, "title": None, "tags": None, "limit": None, "color": None, "owner": None
    }


def test_strict_is_ignored_by_formats_without_a_strict_mode() -> None:
    for fmt in ("mcp", "anthropic", "gemini"):
        strict = definitions_for(fmt, [DEFINITIONS["simple"]], strict=True)
        assert strict == definitions_for(fmt, [DEFINITIONS["simple"]])


# --- results: media, errors ------------------------------------------------------------------


def media_of(outcome: Outcome) -> list[tuple[str, str]]:
    """(base64 data, what a note about it must name) for every media item of an outcome."""
    found = []
    for item in outcome.content:
        if isinstance(item, ImageContent | AudioContent):
            found.append((item.data, item.mime_type))
        elif isinstance(item, ResourceContent) and item.blob is not None:
            found.append((item.blob, item.uri))
        elif isinstance(item, ResourceLink):
            found.append(("\x00never", item.uri))
    return found


@pytest.mark.parametrize("fmt", ["openai", "openai-responses", "anthropic", "gemini"])
@pytest.mark.parametrize("case", MEDIA_CASES)
def test_media_is_sent_or_noted_never_dropped(fmt: str, case: str) -> None:
    wire = json.dumps(result_for(fmt, OUTCOMES[case], tool_call_id=CALL_ID),  # type: ignore[arg-type]
                      ensure_ascii=False)
    for data, name in media_of(OUTCOMES[case]):
        assert data in wire or name in wire, f"{name} vanished from {fmt}"
        if data not in wire:
            assert "omitted" in wire or "resource link" in wire


def test_media_notes_read_well() -> None:
    chat = result_for("openai", OUTCOMES["image-text"], tool_call_id=CALL_ID)
    assert chat["content"] == (
        "Here is the chart\n[image omitted: image/png, 64 bytes; OpenAI Chat Completions "
        "cannot take images in a tool result]"
    )
    claude = result_for("anthropic", OUTCOMES["audio"], tool_call_id=CALL_ID)
    assert claude["content"][1] == {
        "type": "text",
        "text": "[audio omitted: audio/wav, 44 bytes; Anthropic Messages cannot take audio "
        "in a tool result]",
    }
    svg = result_for("anthropic", OUTCOMES["image-svg"], tool_call_id=CALL_ID)
    assert "takes only image/gif, image/jpeg, image/png, image/webp images" in json.dumps(svg)


def test_responses_output_is_a_string_unless_it_carries_media() -> None:
    text = result_for("openai-responses", OUTCOMES["two-texts"], tool_call_id=CALL_ID)
    assert text["output"] == "first\nsecond"
    image = result_for("openai-responses", OUTCOMES["image-text"], tool_call_id=CALL_ID)
    assert image["output"] == [
        {"type": "input_text", "text": "Here is the chart"},
        {"type": "input_image", "image_url": f"data:image/png;base64,{PNG}", "detail": "auto"},
    ]
    pdf = result_for("openai-responses", OUTCOMES["resource-pdf"], tool_call_id=CALL_ID)
    assert pdf["output"][1] == {"type": "input_file", "filename": "report q3.pdf",
                                "file_data": f"data:application/pdf;base64,{PDF}"}


ERROR_CASES = [c for c in OUTCOMES if c.startswith("error-")]


@pytest.mark.parametrize("case", ERROR_CASES)
def test_every_error_kind_is_an_error_in_every_format(case: str) -> None:
    outcome = OUTCOMES[case]
    assert outcome.error is not None
    kind = outcome.error.kind.value
    assert result_for("mcp", outcome, tool_call_id=CALL_ID)["isError"] is True
    assert result_for("anthropic", outcome, tool_call_id=CALL_ID)["is_error"] is True
    gemini = result_for("gemini", outcome, tool_call_id=CALL_ID)
    assert gemini["functionResponse"]["response"]["error"]["kind"] == kind
    chat = result_for("openai", outcome, tool_call_id=CALL_ID)
    assert chat["content"].startswith(f"Error ({kind}): ")
    responses = result_for("openai-responses", outcome, tool_call_id=CALL_ID)
    assert responses["output"] == chat["content"]


@pytest.mark.parametrize("fmt", FORMATS)
def test_operational_errors_show_only_the_error_id(fmt: str) -> None:
    wire = json.dumps(result_for(fmt, OUTCOMES["error-operational"], tool_call_id=CALL_ID))  # type: ignore[arg-type]
    assert "op_3f9a0c1b2d4e" in wire
    for secret in ("Traceback", "KeyError", "/srv/app", "secret"):
        assert secret not in wire


def test_error_text_adds_the_path_and_the_last_progress() -> None:
    chat = result_for("openai", OUTCOMES["error-invalid-output"], tool_call_id=CALL_ID)
    assert chat["content"].endswith("'x' is not of type 'number' (at $.days[1])")
    mcp_result = result_for("mcp", OUTCOMES["error-timeout"], tool_call_id=CALL_ID)
    assert mcp_result["content"][0]["text"] == (
        "weather_current did not finish within 30 s and was cancelled.\n"
        'Last progress reported before the failure: {"fetched":2,"of":5}'
    )
    named = failed(ErrorKind.INVALID_INPUT, "$.days: -1 is less than 1", path="$.days")
    text = result_for("anthropic", named, tool_call_id=CALL_ID)["content"][0]["text"]
    assert text == "$.days: -1 is less than 1"  # the message names the path already


def test_gemini_response_uses_the_output_only_when_it_is_what_the_model_would_read() -> None:
    def response(case: str) -> Any:
        return result_for("gemini", OUTCOMES[case], tool_call_id=CALL_ID)[
            "functionResponse"]["response"]

    assert response("json-output") == {"output": {"city": "Paris", "days": [21.5, 19.0]}}
    assert response("json-output-summary") == {"output": "3-day forecast for Paris: mild."}
    assert response("text") == {"output": "Sunny, 21 °C in Paris"}
    replayed = Outcome.from_json(OUTCOMES["json-output"].to_json(include_output=False))
    assert result_for("gemini", replayed, tool_call_id=CALL_ID)["functionResponse"][
        "response"] == {"output": '{"city":"Paris","days":[21.5,19.0]}'}
    anonymous = result_for("gemini", OUTCOMES["text"], tool_call_id="")
    assert "id" not in anonymous["functionResponse"]


def test_anthropic_never_sends_an_empty_text_block() -> None:
    result = result_for("anthropic", OUTCOMES["empty-text"], tool_call_id=CALL_ID)
    assert result["content"] == [{"type": "text", "text": "(the tool returned empty text)"}]


def test_an_error_outcome_without_its_error_is_refused() -> None:
    broken = Outcome(call_id="c1", tool="t", status="error")
    with pytest.raises(ValueError, match="without its error"):
        result_for("openai", broken, tool_call_id=CALL_ID)


# --- schemas as pydantic writes them ----------------------------------------------------------


def pydantic_schemas() -> dict[str, dict[str, Any]]:
    """Input schemas generated by the installed pydantic (how most tools get theirs)."""
    from enum import Enum
    from typing import Literal

    from pydantic import BaseModel, Field

    class Color(Enum):
        RED = "red"
        BLUE = "blue"

    class Tag(BaseModel):
        name: str
        weight: float | None = None

    class Tree(BaseModel):
        label: str
        kids: list[Tree] = Field(default_factory=list, description="Sub-trees")

    class Cat(BaseModel):
        kind: Literal["cat"]
        lives: int = 9

    class Dog(BaseModel):
        kind: Literal["dog"]
        good: bool = True

    class Everything(BaseModel):
        title: str = Field(description="A title", max_length=80)
        color: Color = Color.RED
        tags: list[Tag] = []
        best: Tag | None = Field(default=None, description="The best tag")
        tree: Tree | None = None
        pet: Cat | Dog = Field(discriminator="kind")
        mode: Literal["fast", "safe"] | None = None
        when: str | int | None = None

    class WithMap(BaseModel):
        counts: dict[str, int]

    return {
        "everything": Everything.model_json_schema(),
        "map": WithMap.model_json_schema(),
    }


@pytest.mark.parametrize("fmt", list(TOOL_SHAPES))
@pytest.mark.parametrize("strict", [False, True])
def test_pydantic_schemas_fit_every_provider(fmt: str, strict: bool) -> None:
    schemas = pydantic_schemas()
    defs = [ToolDefinition(name=f"py_{name}", description=name, input_schema=schema)
            for name, schema in schemas.items()]
    tools = definitions_for(fmt, defs, strict=strict)  # type: ignore[arg-type]
    for tool in tools:
        jsonschema.validate(tool, TOOL_SHAPES[fmt])
    if fmt == "gemini":
        for declaration in tools[0]["functionDeclarations"]:
            assert_gemini_subset(declaration["parameters"])
    if fmt == "openai" and strict:
        everything, mapping = (tool["function"] for tool in tools)
        assert everything["strict"] is True
        assert_strict(everything["parameters"])
        assert mapping["strict"] is False  # dict[str, int] is a free-form map


def test_pydantic_strict_round_trip() -> None:
    original = pydantic_schemas()["everything"]
    strict = strict_schema(original)
    value = {"title": "t", "pet": {"kind": "dog"},
             "tree": {"label": "a", "kids": [{"label": "b"}]}, "when": 3}
    sent = as_strict_call(strict, strict, value)
    jsonschema.validate(sent, strict)
    back = input_from_strict(original, sent)
    jsonschema.validate(back, original)
    assert without_added_nulls(back, value) == value

"""Provider replay: tool definitions and call outcomes in provider wire formats.

Wire values are derived here, at this one boundary, from the canonical definitions
(`ToolDefinition`) and outcomes (`Outcome`): they are never stored. Formats (`FORMATS`):
`mcp`, `openai` (Chat Completions), `openai-responses`, `anthropic` (Messages), `gemini`.

    definitions_for("anthropic", snapshot.definitions)       # the request's `tools` value
    result_for("openai", outcome, tool_call_id="call_abc")   # the message that answers a call

Modules: `definitions` and `results` (one function per format each), `gemini_schema` (Gemini's
OpenAPI subset), `openai_strict` (OpenAI strict mode and its inverse for call arguments),
`schema_refs` (local `$ref` resolution shared by both). May import: the core only.
"""

from sidecar.formats.definitions import (
    ANTHROPIC_TOOL_SEARCH,
    definitions_for,
    mcp_output_schema,
)
from sidecar.formats.formats import FORMATS, LABELS, Format, UnknownFormat, parse_format
from sidecar.formats.gemini_schema import gemini_parameters
from sidecar.formats.openai_strict import NotStrictable, input_from_strict, strict_schema
from sidecar.formats.results import error_text, result_for

__all__ = [
    "ANTHROPIC_TOOL_SEARCH",
    "FORMATS",
    "LABELS",
    "Format",
    "NotStrictable",
    "UnknownFormat",
    "definitions_for",
    "error_text",
    "gemini_parameters",
    "input_from_strict",
    "mcp_output_schema",
    "parse_format",
    "result_for",
    "strict_schema",
]

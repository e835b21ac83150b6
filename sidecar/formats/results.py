"""Call outcomes in each provider's wire form, derived from the stored outcome, never stored.
Imports its `sidecar.formats` siblings and `sidecar.model`. Exports `result_for` (the forms,
content item by item, errors and Gemini's `response`: its docstring), `error_text` (the text
of a failed call), `mcp_content` and `META_PREFIX`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import unquote, urlparse

from sidecar.formats.definitions import RESULT_KEY, wraps_output
from sidecar.formats.formats import LABELS, Format, parse_format
from sidecar.model.content import (
    AudioContent,
    Content,
    ContentItem,
    ImageContent,
    ResourceContent,
    ResourceLink,
    TextContent,
    content_from_output,
)
from sidecar.model.errors import CallError, ErrorKind
from sidecar.model.outcome import Outcome

META_PREFIX: Final = "sidecar/"
"""Prefix of the `_meta` keys of MCP results (metadata, managed references, error kind)."""

EMPTY_TEXT: Final = "(the tool returned empty text)"
"""What Anthropic gets instead of empty content: it refuses empty text blocks."""

_WEB_IMAGES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_PDF: Final = "application/pdf"


@dataclass(frozen=True, slots=True)
class _Caps:
    """What a provider takes inside a tool result besides text."""

    label: str
    images: frozenset[str] = frozenset()
    pdf: bool = False


_CAPS: Final[dict[str, _Caps]] = {
    "openai": _Caps(LABELS["openai"]),
    "openai-responses": _Caps(LABELS["openai-responses"], _WEB_IMAGES, pdf=True),
    "anthropic": _Caps(LABELS["anthropic"], _WEB_IMAGES, pdf=True),
    "gemini": _Caps(LABELS["gemini"]),
}


@dataclass(frozen=True, slots=True)
class _Text:
    text: str


@dataclass(frozen=True, slots=True)
class _Media:
    """An image or a PDF the provider takes as is."""

    mime_type: str
    data: str
    filename: str | None = None


_Part = _Text | _Media


def result_for(
    format: Format,
    outcome: Outcome,
    *,
    tool_call_id: str,
    wrap_structured: bool = True,
    output_schema: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """`outcome` in `format`'s wire form (`UnknownFormat` for any other name).

    `tool_call_id` is the provider's id of the call being answered (Gemini: sent as the
    response `id` when not empty). `wrap_structured` and `output_schema` apply to MCP only:
    with `wrap_structured`, an output is sent as `{"result": output}` when the tool's output
    schema does not describe an object (`output_schema` given; the rule of
    `mcp_output_schema`), or else when the output is not an object.

    format              value
    `mcp`               `CallToolResult`: content (camelCase items), structuredContent?,
                        isError, _meta? (`sidecar/metadata`, `sidecar/managed`, `sidecar/error`)
    `openai`            Chat Completions message `{"role": "tool", "tool_call_id", "content"}`
    `openai-responses`  `{"type": "function_call_output", "call_id", "output"}`
    `anthropic`         a `{"type": "tool_result", "tool_use_id", "content": [...], "is_error"}`
                        block (it goes in the next user message)
    `gemini`            a `{"functionResponse": {"id"?, "name", "response"}}` part

    Content, item by item:

    - text is text; a provider that takes one string gets the items joined by newlines;
    - images go as images where a provider takes them in a tool result (Responses `input_image`
      data URL, Anthropic base64 `image` block; png, jpeg, gif and webp only), else as a note;
    - audio goes only to MCP; every other provider gets a note;
    - an embedded text resource becomes a `[resource: <uri>, <mime>]` header line and its text;
      a binary one is sent as media where the provider takes that type (an image as above, a PDF as
      a Responses `input_file` or an Anthropic `document`), else noted;
    - a resource link becomes a note with its uri, name, type and description.

    A note is one bracketed line such as `[image omitted: image/png, 1,024 bytes; OpenAI Chat
    Completions cannot take images in a tool result]`: media is never dropped silently.

    Errors: every error kind, `declined` included, is the provider's error form (the runner
    decides what a `declined` call means for the turn). The text is the error's message, its JSON
    path when the message does not name it, and the last progress reported before the failure.
    `operational` errors show a fixed message with the error id only: their stored message is never
    shown. Providers with an error flag (MCP `isError`, Anthropic `is_error`, Gemini's `error` key)
    get the text as it is; OpenAI has no flag, so its text starts with `Error (<kind>): `.

    Gemini's `response`: `{"output": <output>}` when the call has an output and its content is
    exactly that output serialized (so the model sees the same thing, structured), else
    `{"output": <content text>}`; a failure is `{"error": {kind, message, path?, partial?,
    error_id?}}`. These are the `output`/`error` keys Gemini documents for `FunctionResponse`,
    and an output that itself has an `error` key cannot be mistaken for a failure. The content
    text is used otherwise because the output is unbounded and not stored: content is the
    bounded model representation (`output` is absent on an outcome read back from the log).
    """
    fmt = parse_format(format)
    if outcome.status == "error" and outcome.error is None:
        raise ValueError(f"outcome {outcome.call_id}: an error outcome without its error")
    if fmt == "mcp":
        return _mcp(outcome, wrap_structured, output_schema)
    if fmt == "openai":
        return {"role": "tool", "tool_call_id": tool_call_id, "content": _openai_text(outcome)}
    if fmt == "openai-responses":
        return {
            "type": "function_call_output",
            "call_id": tool_call_id,
            "output": _responses_output(outcome),
        }
    if fmt == "anthropic":
        return _anthropic(outcome, tool_call_id)
    return _gemini(outcome, tool_call_id)


def error_text(error: CallError, partial: Mapping[str, Any] | None = None) -> str:
    """The model-visible text of a failure (the rules are in `result_for`)."""
    if error.kind is ErrorKind.OPERATIONAL:
        ref = f" (error id {error.error_id})" if error.error_id else ""
        return f"The call failed with an internal error in the sidecar{ref}."
    text = error.message
    if error.path and error.path not in text:
        text += f" (at {error.path})"
    if partial:
        text += f"\nLast progress reported before the failure: {_compact(partial)}"
    return text


# --- MCP --------------------------------------------------------------------------------


def _mcp(
    outcome: Outcome, wrap: bool, output_schema: Mapping[str, Any] | None
) -> dict[str, Any]:
    meta: dict[str, Any] = {}
    if outcome.error is not None:
        result: dict[str, Any] = {
            "content": [{"type": "text", "text": error_text(outcome.error, outcome.partial)}],
            "isError": True,
        }
        meta["error"] = {"kind": outcome.error.kind.value}
        if outcome.error.error_id is not None:
            meta["error"]["error_id"] = outcome.error.error_id
    else:
        result = {"content": [_mcp_item(item) for item in outcome.content]}
        if outcome.output is not None:
            output = outcome.output
            if wrap and wraps_output(output_schema, output):
                output = {RESULT_KEY: output}
            result["structuredContent"] = output
        result["isError"] = False
        if outcome.metadata is not None:
            meta["metadata"] = outcome.metadata
    if outcome.managed:
        meta["managed"] = [m.to_json() for m in outcome.managed]
    if meta:
        result["_meta"] = {f"{META_PREFIX}{key}": value for key, value in meta.items()}
    return result


def mcp_content(content: Content) -> list[dict[str, Any]]:
    """Content items in MCP wire form (camelCase keys)."""
    return [_mcp_item(item) for item in content]


def _mcp_item(item: ContentItem) -> dict[str, Any]:
    if isinstance(item, TextContent):
        return {"type": "text", "text": item.text}
    if isinstance(item, ImageContent | AudioContent):
        return {"type": item.type, "data": item.data, "mimeType": item.mime_type}
    if isinstance(item, ResourceContent):
        resource: dict[str, Any] = {"uri": item.uri}
        if item.mime_type is not None:
            resource["mimeType"] = item.mime_type
        if item.text is not None:
            resource["text"] = item.text
        else:
            resource["blob"] = item.blob
        return {"type": "resource", "resource": resource}
    link: dict[str, Any] = {"type": "resource_link", "uri": item.uri, "name": _link_name(item)}
    if item.description is not None:
        link["description"] = item.description
    if item.mime_type is not None:
        link["mimeType"] = item.mime_type
    return link


# --- OpenAI -----------------------------------------------------------------------------


def _openai_text(outcome: Outcome) -> str:
    if outcome.error is not None:
        return _flagless_error(outcome.error, outcome.partial)
    return _joined(_parts(outcome.content, _CAPS["openai"]))


def _responses_output(outcome: Outcome) -> str | list[dict[str, Any]]:
    if outcome.error is not None:
        return _flagless_error(outcome.error, outcome.partial)
    parts = _parts(outcome.content, _CAPS["openai-responses"])
    if all(isinstance(p, _Text) for p in parts):
        return _joined(parts)
    return [_responses_part(p) for p in parts]


def _responses_part(part: _Part) -> dict[str, Any]:
    if isinstance(part, _Text):
        return {"type": "input_text", "text": part.text}
    url = f"data:{part.mime_type};base64,{part.data}"
    if part.filename is None:
        return {"type": "input_image", "image_url": url, "detail": "auto"}
    return {"type": "input_file", "filename": part.filename, "file_data": url}


def _flagless_error(error: CallError, partial: Mapping[str, Any] | None) -> str:
    return f"Error ({error.kind.value}): {error_text(error, partial)}"


# --- Anthropic --------------------------------------------------------------------------


def _anthropic(outcome: Outcome, tool_use_id: str) -> dict[str, Any]:
    if outcome.error is not None:
        blocks = [{"type": "text", "text": error_text(outcome.error, outcome.partial)}]
    else:
        blocks = [
            _anthropic_block(p)
            for p in _parts(outcome.content, _CAPS["anthropic"])
            if not (isinstance(p, _Text) and p.text == "")
        ]
        if not blocks:
            blocks = [{"type": "text", "text": EMPTY_TEXT}]
    return {
        "type": "tool_result",
        "tool_use_id": tool_use_id,
        "content": blocks,
        "is_error": outcome.error is not None,
    }


def _anthropic_block(part: _Part) -> dict[str, Any]:
    if isinstance(part, _Text):
        return {"type": "text", "text": part.text}
    source = {"type": "base64", "media_type": part.mime_type, "data": part.data}
    return {"type": "image" if part.filename is None else "document", "source": source}


# --- Gemini -----------------------------------------------------------------------------


def _gemini(outcome: Outcome, call_id: str) -> dict[str, Any]:
    response: dict[str, Any]
    if outcome.error is not None:
        error = outcome.error
        if error.kind is ErrorKind.OPERATIONAL:
            detail: dict[str, Any] = {"kind": error.kind.value, "message": error_text(error)}
        else:
            detail = {"kind": error.kind.value, "message": error.message}
            if error.path is not None:
                detail["path"] = error.path
            if outcome.partial:
                detail["partial"] = outcome.partial
        if error.error_id is not None:
            detail["error_id"] = error.error_id
        response = {"error": detail}
    elif outcome.output is not None and outcome.content == content_from_output(outcome.output):
        response = {"output": outcome.output}
    else:
        response = {"output": _joined(_parts(outcome.content, _CAPS["gemini"]))}
    function_response: dict[str, Any] = {"id": call_id} if call_id else {}
    function_response["name"] = outcome.tool
    function_response["response"] = response
    return {"functionResponse": function_response}


# --- content rendering for providers that are not MCP ------------------------------------


def _parts(content: Content, caps: _Caps) -> list[_Part]:
    parts: list[_Part] = []
    for item in content:
        if isinstance(item, TextContent):
            parts.append(_Text(item.text))
        elif isinstance(item, ImageContent):
            parts.append(_image(item.mime_type, item.data, caps))
        elif isinstance(item, AudioContent):
            parts.append(_Text(
                f"[audio omitted: {_size(item.mime_type, item.data)}; "
                f"{caps.label} cannot take audio in a tool result]"
            ))
        elif isinstance(item, ResourceContent):
            parts.extend(_resource(item, caps))
        else:
            parts.append(_Text(_link_note(item)))
    return parts


def _image(mime_type: str, data: str, caps: _Caps) -> _Part:
    if mime_type in caps.images:
        return _Media(mime_type, data)
    if caps.images:
        why = f"{caps.label} takes only {', '.join(sorted(caps.images))} images"
    else:
        why = f"{caps.label} cannot take images in a tool result"
    return _Text(f"[image omitted: {_size(mime_type, data)}; {why}]")


def _resource(item: ResourceContent, caps: _Caps) -> list[_Part]:
    header = f"[resource: {item.uri}, {item.mime_type}]" if item.mime_type else (
        f"[resource: {item.uri}]"
    )
    if item.text is not None:
        return [_Text(f"{header}\n{item.text}")]
    blob = item.blob or ""
    mime_type = item.mime_type or "application/octet-stream"
    if mime_type in caps.images:
        return [_Text(header), _Media(mime_type, blob)]
    if mime_type == _PDF and caps.pdf:
        return [_Text(header), _Media(mime_type, blob, _filename(item.uri, "document.pdf"))]
    return [_Text(
        f"[resource omitted: {item.uri}, {_size(mime_type, blob)}; "
        f"{caps.label} cannot take {mime_type} in a tool result]"
    )]


def _link_note(link: ResourceLink) -> str:
    fields = [link.uri]
    if link.name:
        fields.append(f"name: {link.name}")
    if link.mime_type:
        fields.append(f"type: {link.mime_type}")
    if link.description:
        fields.append(f"description: {link.description}")
    return f"[resource link: {'; '.join(fields)}]"


def _joined(parts: list[_Part]) -> str:
    return "\n".join(p.text for p in parts if isinstance(p, _Text))


def _size(mime_type: str, data: str) -> str:
    """`mime, N bytes` of base64 `data` without decoding it."""
    length = len(data) - data.count("\n") - data.count("\r") - data.count(" ")
    padding = len(data.rstrip()) - len(data.rstrip().rstrip("="))
    return f"{mime_type}, {max(length * 3 // 4 - padding, 0):,} bytes"


def _link_name(link: ResourceLink) -> str:
    """MCP requires a name on a resource link; ours may lack one: the uri's last segment."""
    return link.name or _filename(link.uri, link.uri)


def _filename(uri: str, default: str) -> str:
    segment = unquote(urlparse(uri).path.rstrip("/").rsplit("/", 1)[-1])
    return segment or default


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))

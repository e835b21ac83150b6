"""The model-facing content of a call: a non-empty list of items.

Items are immutable values. Their JSON form (used for durable storage and the native API) is
our own, close to MCP's but snake_case: `{"type": "text", "text": ...}`,
`{"type": "image", "data": <base64>, "mime_type": ...}`, and so on. Provider and MCP wire forms
are derived from it at the frontends.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import pydantic_core

from sidecar.model.errors import CodecError
from sidecar.model.frozen import quick_init


@quick_init  # built for every call
@dataclass(frozen=True, slots=True)
class TextContent:
    text: str
    type: Literal["text"] = "text"


@dataclass(frozen=True, slots=True)
class ImageContent:
    data: str  # base64
    mime_type: str
    type: Literal["image"] = "image"


@dataclass(frozen=True, slots=True)
class AudioContent:
    data: str  # base64
    mime_type: str
    type: Literal["audio"] = "audio"


@dataclass(frozen=True, slots=True)
class ResourceContent:
    """An embedded resource: exactly one of `text` or `blob` (base64)."""

    uri: str
    mime_type: str | None = None
    text: str | None = None
    blob: str | None = None
    type: Literal["resource"] = "resource"

    def __post_init__(self) -> None:
        if (self.text is None) == (self.blob is None):
            raise CodecError("an embedded resource needs exactly one of text or blob")


@dataclass(frozen=True, slots=True)
class ResourceLink:
    uri: str
    name: str | None = None
    description: str | None = None
    mime_type: str | None = None
    type: Literal["resource_link"] = "resource_link"


ContentItem = TextContent | ImageContent | AudioContent | ResourceContent | ResourceLink
Content = tuple[ContentItem, ...]

_ITEM_TYPES: dict[str, type[ContentItem]] = {
    "text": TextContent,
    "image": ImageContent,
    "audio": AudioContent,
    "resource": ResourceContent,
    "resource_link": ResourceLink,
}
_FIELDS: dict[str, frozenset[str]] = {
    name: frozenset(cls.__dataclass_fields__) for name, cls in _ITEM_TYPES.items()
}
_REQUIRED: dict[str, tuple[str, ...]] = {
    "text": ("text",),
    "image": ("data", "mime_type"),
    "audio": ("data", "mime_type"),
    "resource": ("uri",),
    "resource_link": ("uri",),
}


def item_to_json(item: ContentItem) -> dict[str, Any]:
    """JSON form of one item; absent optional fields are left out."""
    data: dict[str, Any] = {"type": item.type}
    for field in item.__dataclass_fields__:
        if field != "type":
            value = getattr(item, field)
            if value is not None:
                data[field] = value
    return data


def item_from_json(data: Any, path: str = "$") -> ContentItem:
    """Parse one item from its JSON form; `CodecError` names the path of what is wrong."""
    if isinstance(data, _ITEM_CLASSES):
        return data
    if not isinstance(data, dict):
        raise CodecError(f"a content item must be an object, got {type(data).__name__}", path)
    kind = data.get("type")
    cls = _ITEM_TYPES.get(kind) if isinstance(kind, str) else None
    if cls is None:
        raise CodecError(
            f"unknown content type {kind!r}; expected one of {', '.join(_ITEM_TYPES)}",
            f"{path}.type",
        )
    assert isinstance(kind, str)
    unknown = set(data) - _FIELDS[kind]
    if unknown:
        raise CodecError(f"unknown field(s) {sorted(unknown)} for {kind} content", path)
    for field in _REQUIRED[kind]:
        if not isinstance(data.get(field), str):
            raise CodecError(f"{kind} content needs a string {field!r}", f"{path}.{field}")
    for field, value in data.items():
        if field != "type" and value is not None and not isinstance(value, str):
            raise CodecError(f"{field!r} must be a string", f"{path}.{field}")
    fields = {k: v for k, v in data.items() if k != "type"}
    try:
        return cls(**fields)
    except CodecError as exc:
        raise CodecError(exc.message, path) from None


_ITEM_CLASSES = tuple(_ITEM_TYPES.values())


def content_to_json(content: Iterable[ContentItem]) -> list[dict[str, Any]]:
    return [item_to_json(item) for item in content]


def content_from_json(data: Any, path: str = "$.content") -> Content:
    if isinstance(data, str):
        return (TextContent(data),)
    if isinstance(data, _ITEM_CLASSES):
        return (data,)
    if not isinstance(data, Sequence):
        raise CodecError("content must be a list of items or a string", path)
    return tuple(item_from_json(item, f"{path}[{i}]") for i, item in enumerate(data))


def content_from_output(encoded: Any) -> Content:
    """DESIGN step 6: a string becomes one text item; other JSON is serialized once
    (compact, non-ASCII kept as is)."""
    return (TextContent(text_from_output(encoded)),)


def text_from_output(encoded: Any) -> str:
    """The text of `content_from_output`'s one item."""
    return encoded if isinstance(encoded, str) else pydantic_core.to_json(encoded).decode()


def text_of(content: Iterable[ContentItem]) -> str:
    """The text items joined by newlines (what Code Mode and CLIs show as plain text)."""
    return "\n".join(item.text for item in content if isinstance(item, TextContent))

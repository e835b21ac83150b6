"""Tool overrides: the model sees a reshaped tool, the upstream gets the original call. Imports
model and `sidecar.registry.registry`; exports `Override`, `Overrides`, `OverrideError`,
`apply_override`, `reshaped_schema`, `reshape_all` (a manifest reload: a collision fails it,
naming both tools) and `checked_wrap` (a snapshot: a later collision leaves the tool out).

An `Override` matches tools by a glob over effective names (or, with `server`, over that MCP
server's upstream names) and may change the name, title, description (replace or append) and
annotations; hide arguments with fixed values (removed from the advertised schema, put into
every call; an input key that differs from a hidden name only by case, whitespace or
look-alike characters is refused, `sidecar.model.key_skeleton`); give arguments defaults
(filled in when the model leaves them out); or leave the tool out (`enabled = False`).
Location-wide overrides apply first, then the profile's; later fields win. The seam validates
the model's input against the reshaped schema; the original tool's codec validates the filled
call again, so the original call is what the upstream receives.
"""

from __future__ import annotations

import fnmatch
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from sidecar.model.codec import JsonSchemaCodec
from sidecar.model.errors import CodecError, ErrorKind, SchemaDefinitionError, ToolFailure
from sidecar.model.key_skeleton import skeleton
from sidecar.model.names import is_valid_name
from sidecar.model.tool import Annotations, CallContext, Tool, tool_with
from sidecar.registry.registry import Entry

log = logging.getLogger("sidecar.registry.overrides")

_HINTS = {"read_only": "read_only_hint", "destructive": "destructive_hint",
          "idempotent": "idempotent_hint", "open_world": "open_world_hint"}


class OverrideError(Exception):
    """An override that cannot apply (a bad name, a collision); the message names both."""


@dataclass(frozen=True, slots=True)
class Override:
    match: str
    server: str | None = None
    name: str | None = None
    title: str | None = None
    description: str | None = None
    description_append: str | None = None
    annotations: Mapping[str, Any] = field(default_factory=dict)
    hidden: Mapping[str, Any] = field(default_factory=dict)
    defaults: Mapping[str, Any] = field(default_factory=dict)
    enabled: bool = True

    def matches(self, entry: Entry) -> bool:
        if self.server is not None:
            return entry.origin == f"mcp:{self.server}" and fnmatch.fnmatchcase(
                entry.key, self.match)
        return fnmatch.fnmatchcase(entry.definition.name, self.match)


def reshaped_schema(
    schema: Mapping[str, Any], hidden: Mapping[str, Any], defaults: Mapping[str, Any]
) -> dict[str, Any]:
    """`schema` without the hidden properties, with the defaults declared (and optional)."""
    result = dict(schema)
    properties = dict(result.get("properties") or {})
    for key in hidden:
        properties.pop(key, None)
    for key, value in defaults.items():
        if key in properties and isinstance(properties[key], Mapping):
            properties[key] = {**properties[key], "default": value}
    result["properties"] = properties
    required = [
        r for r in result.get("required") or () if r not in hidden and r not in defaults
    ]
    if required:
        result["required"] = required
    else:
        result.pop("required", None)
    return result


def _annotations(tool: Tool, changes: Mapping[str, Any]) -> Annotations:
    current = tool.annotations.to_json() if tool.annotations is not None else {}
    for key, value in changes.items():
        if value is not None:
            current[_HINTS.get(key, key)] = value
    return Annotations(**current)


def apply_override(entry: Entry, override: Override) -> Entry:
    """`entry` reshaped by one override (never called for `enabled = False`)."""
    tool, definition = entry.tool, entry.definition
    description = override.description if override.description is not None else (
        definition.description)
    if override.description_append:
        description = f"{description}\n\n{override.description_append}".strip()
    changes: dict[str, Any] = {"description": description}
    if override.title is not None:
        changes["title"] = override.title
    if override.annotations:
        changes["annotations"] = _annotations(tool, override.annotations)
    def_changes: dict[str, Any] = {
        "name": override.name or definition.name, "description": description,
        "title": changes.get("title", definition.title),
    }
    if "annotations" in changes:
        def_changes["annotations"] = changes["annotations"].to_json() or None
    if override.hidden or override.defaults:
        schema = reshaped_schema(definition.input_schema, override.hidden, override.defaults)
        changes["input"] = JsonSchemaCodec(schema)
        changes["execute"] = _filling(tool, override.hidden, override.defaults)
        def_changes["input_schema"] = schema
    return Entry(tool_with(tool, **changes), entry.key, replace(definition, **def_changes),
                 entry.origin)


def _filling(tool: Tool, hidden: Mapping[str, Any], defaults: Mapping[str, Any]) -> Any:
    inner, codec = tool.execute, tool.input
    shadows = frozenset(skeleton(key) for key in hidden)

    async def execute(value: Any, ctx: CallContext) -> Any:
        given = value if isinstance(value, Mapping) else {}
        _refuse_lookalikes(given, hidden, shadows, ctx.tool_name)
        arguments = {**defaults, **given, **hidden}
        try:
            original = codec.decode(arguments)
        except CodecError as exc:
            raise ToolFailure(
                f"the fixed or default arguments of {ctx.tool_name} do not fit the tool: "
                f"{exc.message} (a manifest override needs fixing)", kind=ErrorKind.INVALID_INPUT
            ) from None
        return await inner(original, ctx)

    return execute


def _refuse_lookalikes(given: Mapping[str, Any], hidden: Mapping[str, Any],
                       shadows: frozenset[str], tool_name: str) -> None:
    """`invalid_input` for a key the model sent that is not a hidden argument's name but
    differs from one only by case, whitespace or look-alike characters (`Env`, `env `, `env`
    with a Cyrillic U+0435 when `env` is fixed): an upstream that reads names loosely would
    take it for the fixed argument, and it would reach the upstream next to it. The message
    names the key sent, not the hidden name or its value."""
    if not shadows:
        return
    for key in given:
        if key not in hidden and isinstance(key, str) and skeleton(key) in shadows:
            raise ToolFailure(
                f"input key {key!r} of {tool_name} is refused: it differs only by case, "
                "whitespace or look-alike characters from an argument the manifest fixes",
                kind=ErrorKind.INVALID_INPUT)


class Overrides:
    """The Location's overrides (manifest-wide and per profile). `common` reshapes every
    tool before profiles pick (so profiles see the new names); `for_profile` reshapes a
    profile's picks after (`sidecar.registry.profiles.Profiles` runs both)."""

    def __init__(self) -> None:
        self.common: tuple[Override, ...] = ()
        self.by_profile: Mapping[str, tuple[Override, ...]] = {}

    def set(self, common: Sequence[Override], by_profile: Mapping[str, Sequence[Override]]) -> None:
        self.common = tuple(common)
        self.by_profile = {k: tuple(v) for k, v in by_profile.items() if v}

    def reshape_common(self, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        return checked_wrap(self.common, entries)

    def reshape_profile(self, profile: str, entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
        return checked_wrap(self.by_profile.get(profile, ()), entries)


def _through(chain: Iterable[Override], entry: Entry) -> Entry | None:
    for override in chain:
        if not override.matches(entry):
            continue
        if not override.enabled:
            return None
        entry = apply_override(entry, override)
    return entry


def reshape_all(
    overrides: Iterable[Override], entries: Mapping[str, Entry]
) -> dict[str, Entry]:
    """`entries` through `overrides`; raises `OverrideError` naming both tools when two end
    under one name, or for a name that is not a valid tool name."""
    chain = tuple(overrides)
    result: dict[str, Entry] = {}
    sources: dict[str, str] = {}
    for name, entry in entries.items():
        served = _through(chain, entry)
        if served is None:
            continue
        new = served.definition.name
        if not is_valid_name(new):
            raise OverrideError(f"override renames {name!r} to {new!r}, which is not a valid "
                                "tool name (1-64 of A-Z a-z 0-9 _ -)")
        if new in result:
            raise OverrideError(
                f"after overrides, {sources[new]!r} and {name!r} are both named {new!r}; "
                "rename one of them"
            )
        result[new] = served
        sources[new] = name
    return result


def checked_wrap(chain: Sequence[Override], entries: Mapping[str, Entry]) -> Mapping[str, Entry]:
    """Like `reshape_all` for a snapshot: a later collision leaves the renamed tool out
    (logged) instead of failing."""
    if not chain:
        return entries
    result: dict[str, Entry] = {}
    renamed: list[tuple[str, Entry]] = []
    for name, entry in entries.items():
        try:
            served = _through(chain, entry)
        except (SchemaDefinitionError, ValueError) as exc:
            log.warning("override of %s cannot apply, left as is: %s", name, exc)
            served = entry
        if served is None:
            continue
        if served.definition.name == name:
            result[name] = served
        else:
            renamed.append((name, served))
    for name, served in renamed:
        new = served.definition.name
        if new in result or not is_valid_name(new):
            log.warning("override renames %s to %s, which is taken or invalid: %s left out",
                        name, new, name)
            continue
        result[new] = served
    return result

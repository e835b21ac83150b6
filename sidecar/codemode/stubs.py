"""Typed Python stubs from JSON Schemas (the `describe_tools` built-in).

Each tool becomes one keyword-only `async def` whose parameters are the top-level input
properties (required ones without a default) and whose return type comes from the output
schema; a tool without an output schema returns `str` (its text content). Nested objects
become `TypedDict`s (`NotRequired[...]` for optional keys; the functional form when a key is
not an identifier), arrays `list[...]` (`tuple[...]` for `prefixItems`), `enum`/`const`
`Literal[...]`, `anyOf`/`oneOf`/type lists unions, `$ref`s into `$defs`/`definitions` named
types (recursion allowed), `allOf` of objects one merged `TypedDict`. Anything else is `Any`.
A `TypedDict` is written once per set of fields: a shape the input and output share, or that
several tools repeat, is named where it first appears and reused.
Descriptions are kept short: the tool's own in the docstring, a property's as a comment.
"""

from __future__ import annotations

import json
import keyword
import re
from collections.abc import Iterable, Mapping
from typing import Any

from sidecar.codemode.catalog import CatalogTool, identifier

HEADER = "from typing import Any, Literal, NotRequired, TypedDict"
_MAX_DEPTH = 24
_FIELD_NOTE = 100
_TOOL_NOTE = 600
_SCALARS = {"string": "str", "integer": "int", "number": "float", "boolean": "bool",
            "null": "None"}


def camel(name: str) -> str:
    parts = [p for p in re.split(r"[^A-Za-z0-9]+", name) if p]
    text = "".join(p[0].upper() + p[1:] for p in parts) or "Value"
    return "T" + text if text[0].isdigit() else text


def _is_identifier(key: str) -> bool:
    return key.isidentifier() and not keyword.iskeyword(key)


def _note(text: Any, limit: int) -> str:
    if not isinstance(text, str):
        return ""
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 1].rstrip() + "…"


def _literal(value: Any) -> str | None:
    if value is None or isinstance(value, bool | int | float | str):
        return repr(value)
    return None


def _union(types: Iterable[str]) -> str:
    unique = list(dict.fromkeys(types))
    if not unique or "Any" in unique:
        return "Any"
    if "None" in unique:  # None reads best last
        unique = [t for t in unique if t != "None"] + ["None"]
    return " | ".join(unique)


class StubWriter:
    """Collects the stubs of several tools; shared named types are written once."""

    def __init__(self) -> None:
        self._blocks: list[str] = []
        self._bodies: dict[str, str] = {}  # type name -> its definition
        self._shapes: dict[tuple[tuple[str, str, str], ...], str] = {}  # fields -> type name
        self._refs: dict[tuple[str, str], str] = {}  # ($ref, its target as JSON) -> type name
        self._unpack = False

    def add(self, tool: CatalogTool) -> None:
        definition = tool.definition
        base = camel(tool.name)
        root = definition.input_schema
        top = self._resolve(root, root)  # pydantic puts a recursive model behind a $ref
        top = top if isinstance(top, dict) else {}
        properties = top.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = set(top.get("required") or ())
        params: list[str] = []
        notes: list[str] = []
        if all(_is_identifier(k) for k in properties):
            for key, schema in properties.items():
                kind = self._type(schema, root, f"{base}{camel(key)}", 0)
                params.append(f"{key}: {kind}{self._default(schema, key in required)}")
                note = _note(schema.get("description") if isinstance(schema, dict) else None,
                             _FIELD_NOTE)
                if note:
                    notes.append(f"{key}: {note}")
            signature = "*, " + ", ".join(params) if params else ""
        else:
            kind = self._object(top, root, f"{base}Input", 0)
            signature = f"**kwargs: Unpack[{kind}]"
            self._unpack = True
        output = definition.output_schema
        returns = "str" if output is None else self._type(output, output, f"{base}Output", 0)
        func = identifier(tool.path[-1]) if tool.path else identifier(tool.name)
        doc = [_note(definition.description, _TOOL_NOTE) or (definition.title or tool.name)]
        doc.append(f"Call: await {tool.call_example}  [{tool.name}]")
        if output is None:
            doc.append("Returns the tool's text content.")
        doc.extend(notes)
        body = "\n    ".join(doc)
        self._blocks.append(
            f"async def {func or 'tool'}({signature}) -> {returns}:\n    \"\"\"{body}\n    \"\"\""
        )

    def render(self) -> str:
        header = HEADER + (", Unpack" if self._unpack else "")
        return "\n\n".join([header, *self._blocks])

    # --- schema -> type ------------------------------------------------------------------

    def _default(self, schema: Any, required: bool) -> str:
        if not isinstance(schema, dict) or "default" not in schema:
            return "" if required else " = ..."
        literal = _literal(schema["default"])
        return f" = {literal}" if literal is not None and len(literal) <= 40 else " = ..."

    def _type(self, schema: Any, root: Mapping[str, Any], name: str, depth: int) -> str:
        if not isinstance(schema, dict) or depth > _MAX_DEPTH:
            return "Any"
        if "$ref" in schema:
            return self._ref(schema["$ref"], root, depth)
        if "const" in schema:
            literal = _literal(schema["const"])
            return f"Literal[{literal}]" if literal is not None else "Any"
        if "enum" in schema and isinstance(schema["enum"], list):
            literals = [_literal(v) for v in schema["enum"]]
            if literals and all(v is not None for v in literals):
                return "Literal[" + ", ".join(v for v in literals if v is not None) + "]"
            return "Any"
        for combinator in ("anyOf", "oneOf"):
            options = schema.get(combinator)
            if isinstance(options, list) and options:
                return _union(
                    self._type(o, root, f"{name}{i + 1}" if i else name, depth + 1)
                    for i, o in enumerate(options)
                )
        if isinstance(schema.get("allOf"), list) and schema["allOf"]:
            return self._all_of(schema, root, name, depth)
        kind = schema.get("type")
        if isinstance(kind, list):
            nullable = _union(
                self._type({**schema, "type": k}, root, name, depth + 1) for k in kind
            )
            return nullable
        rendered = self._typed(schema, kind, root, name, depth)
        if schema.get("nullable") is True and rendered != "Any":
            rendered = _union([rendered, "None"])
        return rendered

    def _typed(
        self, schema: dict[str, Any], kind: Any, root: Mapping[str, Any], name: str, depth: int
    ) -> str:
        if kind in _SCALARS:
            return _SCALARS[kind]
        if kind == "array" or (kind is None and ("items" in schema or "prefixItems" in schema)):
            prefix = schema.get("prefixItems")
            if isinstance(prefix, list) and prefix:
                parts = [self._type(p, root, f"{name}{i}", depth + 1) for i, p in enumerate(prefix)]
                return f"tuple[{', '.join(parts)}]"
            items = schema.get("items")
            if isinstance(items, dict) and items:
                return f"list[{self._type(items, root, f'{name}Item', depth + 1)}]"
            return "list[Any]"
        if kind == "object" or (kind is None and "properties" in schema):
            return self._object(schema, root, name, depth)
        return "Any"

    def _object(self, schema: Mapping[str, Any], root: Mapping[str, Any], name: str,
                depth: int, reserved: bool = False) -> str:
        properties = schema.get("properties")
        if not isinstance(properties, dict) or not properties:
            extra = schema.get("additionalProperties")
            if isinstance(extra, dict) and extra:
                return f"dict[str, {self._type(extra, root, f'{name}Value', depth + 1)}]"
            return "dict[str, Any]"
        required = set(schema.get("required") or ())
        fields: list[tuple[str, str, str]] = []
        for key, sub in properties.items():
            kind = self._type(sub, root, f"{name}{camel(key)}", depth + 1)
            if key not in required:
                kind = f"NotRequired[{kind}]"
            note = _note(sub.get("description") if isinstance(sub, dict) else None, _FIELD_NOTE)
            fields.append((key, kind, note))
        return self._claim(name, fields, reserved)

    def _claim(self, name: str, fields: list[tuple[str, str, str]], reserved: bool) -> str:
        """Write a TypedDict under `name` (reserved by a `$ref`), or under a free name; one
        with the same fields already written (by any name: an input's items that an output
        repeats) is reused."""
        shape = tuple(fields)
        if not reserved and shape in self._shapes:
            return self._shapes[shape]
        candidate, n = name, 1
        while True:
            body = self._typed_dict(candidate, fields)
            existing = self._bodies.get(candidate)
            if existing is None or (reserved and candidate == name):
                self._bodies[candidate] = body
                self._blocks.append(body)
                self._shapes.setdefault(shape, candidate)
                return candidate
            if existing == body:
                return candidate
            n += 1
            candidate = f"{name}{n}"

    @staticmethod
    def _typed_dict(name: str, fields: list[tuple[str, str, str]]) -> str:
        if all(_is_identifier(k) for k, _, _ in fields):
            lines = [f"class {name}(TypedDict):"]
            for key, kind, note in fields:
                lines.append(f"    {key}: {kind}" + (f"  # {note}" if note else ""))
            return "\n".join(lines)
        items = ", ".join(f"{key!r}: {kind}" for key, kind, _ in fields)
        return f"{name} = TypedDict({name!r}, {{{items}}})"

    def _all_of(self, schema: dict[str, Any], root: Mapping[str, Any], name: str,
                depth: int) -> str:
        parts = [self._resolve(p, root) for p in schema["allOf"]]
        rest = {k: v for k, v in schema.items() if k != "allOf"}
        if rest:
            parts.append(rest)
        if len(parts) == 1:
            return self._type(parts[0], root, name, depth + 1)
        merged: dict[str, Any] = {"type": "object", "properties": {}, "required": []}
        for part in parts:
            if not isinstance(part, dict) or part.get("type", "object") != "object":
                return "Any"
            merged["properties"].update(part.get("properties") or {})
            merged["required"].extend(part.get("required") or ())
        return self._object(merged, root, name, depth + 1)

    def _resolve(self, schema: Any, root: Mapping[str, Any]) -> Any:
        if isinstance(schema, dict) and isinstance(schema.get("$ref"), str):
            target = _pointer(root, schema["$ref"])
            return target if target is not None else schema
        return schema

    def _ref(self, ref: Any, root: Mapping[str, Any], depth: int) -> str:
        if not isinstance(ref, str):
            return "Any"
        target = _pointer(root, ref)
        if target is None:
            return "Any"
        try:  # the same definition under the same name is one type, whichever schema holds it
            key = (ref, json.dumps(target, sort_keys=True, default=str))
        except ValueError:  # a circular structure (not JSON): identity will do
            key = (ref, str(id(target)))
        if key in self._refs:
            return self._refs[key]
        base = camel(ref.rsplit("/", 1)[-1]) if ref != "#" else "Root"
        name, n = base, 1
        while name in self._bodies:
            n += 1
            name = f"{base}{n}"
        self._refs[key] = name
        self._bodies[name] = ""  # reserved while the body is generated (recursion)
        if _plain_object(target):
            kind = self._object(target, root, name, depth + 1, reserved=True)
        else:
            kind = self._type(target, root, f"{name}Value", depth + 1)
        if kind != name:
            alias = f"{name} = {kind}"
            self._bodies[name] = alias
            self._blocks.append(alias)
        return name


def _plain_object(schema: Any) -> bool:
    return (
        isinstance(schema, dict)
        and isinstance(schema.get("properties"), dict)
        and schema.get("type", "object") == "object"
        and not any(k in schema for k in ("$ref", "anyOf", "oneOf", "allOf", "enum", "const"))
    )


def _pointer(root: Mapping[str, Any], ref: str) -> Any:
    """A local JSON pointer (`#/$defs/Item`); remote refs are never fetched."""
    if ref == "#":
        return root
    if not ref.startswith("#/"):
        return None
    node: Any = root
    for raw in ref[2:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def describe(tools: Iterable[CatalogTool]) -> str:
    writer = StubWriter()
    for tool in tools:
        writer.add(tool)
    return writer.render()

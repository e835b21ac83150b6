"""Input schemas for Gemini function declarations: `gemini_parameters` adapts a full JSON
Schema to the OpenAPI 3.0 subset Gemini takes, loosening only, never tightening (every
adaptation is listed in its docstring). Imports `sidecar.formats.schema_refs` only.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from sidecar.formats.schema_refs import is_null_schema, ref_name, resolve_ref, types_of

_TYPES: Final = frozenset({"string", "number", "integer", "boolean", "array", "object"})
_FORMATS: Final[dict[str, frozenset[str]]] = {
    "string": frozenset({"enum", "date-time"}),
    "number": frozenset({"float", "double"}),
    "integer": frozenset({"int32", "int64"}),
}
_BOUNDS: Final[dict[str, frozenset[str]]] = {
    "string": frozenset({"minLength", "maxLength", "pattern"}),
    "number": frozenset({"minimum", "maximum"}),
    "integer": frozenset({"minimum", "maximum"}),
    "array": frozenset({"minItems", "maxItems"}),
    "object": frozenset({"minProperties", "maxProperties"}),
}
_ORDER: Final = (
    "type", "nullable", "title", "description", "format", "enum", "properties", "required",
    "items", "anyOf", "minimum", "maximum", "minLength", "maxLength", "pattern", "minItems",
    "maxItems", "minProperties", "maxProperties", "default",
)
_ARTICLE: Final = {
    "string": "a string", "number": "a number", "integer": "an integer", "boolean": "a boolean",
    "array": "an array", "object": "an object",
}


def gemini_parameters(schema: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `parameters` of a Gemini function declaration, or None for a tool without
    arguments.

    Gemini takes `parameters` in a subset of OpenAPI 3.0's Schema object: `type` (one name),
    `nullable`, `title`, `description`, `format`, `enum` (strings only), `properties`,
    `required`, `items`, `anyOf`, `default` and the plain numeric/length bounds. A full JSON
    Schema is adapted to it here, loosening only, never tightening: the seam still validates
    every call against the tool's real schema, so a constraint Gemini cannot express is said in
    the description, and a model that ignores it gets the seam's `invalid_input` error naming
    the field.

    What changes, node by node:

    - `$ref` (local: `#`, `#/$defs/...`, `#/definitions/...`) is inlined, its sibling keywords
      winning. A reference already being expanded on the current path is a cycle: it is cut with a
      plain `{"type": "object"}` whose description says the structure repeats the enclosing one.
      An unresolvable (remote) reference becomes an unconstrained schema with a note.
    - `$defs`, `definitions`, `$schema`, `$id`, `$comment`, `examples`, `readOnly`, `writeOnly`,
      `additionalProperties`, `patternProperties`, `not`, `if`/`then`/`else` and every other keyword
      outside the subset are dropped; free-form maps (`additionalProperties: {schema}`) keep a note.
    - `type: ["T", "null"]`, `anyOf: [T, {"type": "null"}]` and `enum`/`const` containing null
      become `T` with `nullable: true`; several non-null types become `anyOf` branches.
    - `oneOf` becomes `anyOf`; `allOf` is merged into its node (properties and required united).
    - `const` becomes a one-value `enum` (a union of string constants, one `enum`); enums of
      anything but strings, which Gemini cannot hold, keep their type and list the allowed values
      in the description.
    - `format` stays only where Gemini defines it (`date-time`/`enum` on strings, `float`/`double`
      on numbers, `int32`/`int64` on integers); any other format moves to the description, as do
      `exclusiveMinimum`/`exclusiveMaximum`, `multipleOf`, `uniqueItems` and `deprecated`.
    - `properties`/`required` stay only on objects, `items` only on arrays; `required` names that
      are not properties are dropped; an array without `items` gets an empty item schema.
    - Tuples (`prefixItems`, or draft-4 `items: [...]`) become one item schema (`anyOf` of the
      positions when they differ) and a note.

    The root: `parameters` must be an OBJECT with properties (Gemini rejects an OBJECT without
    properties there), so a tool that takes no arguments gets no `parameters` at all. A nested
    free-form object stays a bare `{"type": "object"}` (dropping it would orphan its `required`
    entry); some Gemini versions refuse an OBJECT without properties even there.
    """
    converted = _Adapter(schema).convert(schema, ("#",))
    converted.pop("nullable", None)
    converted["type"] = "object"
    if not converted.get("properties"):
        return None
    return _ordered(converted)


class _Adapter:
    __slots__ = ("root",)

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def convert(self, node: Any, expanding: tuple[str, ...]) -> dict[str, Any]:
        """One node in Gemini's subset; `expanding` holds the references on the current path."""
        if not isinstance(node, Mapping):
            return {}  # `true`, `false` or junk: nothing Gemini can say about it
        ref = node.get("$ref")
        if isinstance(ref, str):
            siblings = {k: v for k, v in node.items() if k != "$ref"}
            target = resolve_ref(self.root, ref)
            if target is None or ref in expanding:
                return self._cut(ref, target, siblings, expanding)
            return self.convert({**target, **siblings}, (*expanding, ref))
        return self._node(node, expanding)

    def _cut(
        self,
        ref: str,
        target: Mapping[str, Any] | None,
        siblings: Mapping[str, Any],
        expanding: tuple[str, ...],
    ) -> dict[str, Any]:
        if target is None:
            cut: dict[str, Any] = {}
            note = f"Its structure ({ref}) cannot be shown here."
        else:
            whole = "the whole input" if ref == "#" else f"the enclosing {ref_name(ref)}"
            cut = {"type": "object"}
            note = f"Recursive: an object with the same structure as {whole} (not expanded again)."
        rest = self._node(siblings, expanding) if siblings else {}
        rest.pop("type", None)
        cut.update(rest)
        cut["description"] = _describe(rest.get("description"), [note])
        return _ordered(cut)

    def _node(self, src: Mapping[str, Any], expanding: tuple[str, ...]) -> dict[str, Any]:
        out: dict[str, Any] = {}
        notes: list[str] = []
        inherited: dict[str, Any] = {}  # from a single union branch or allOf parts
        nullable = src.get("nullable") is True

        kinds = types_of(src)
        kind: str | None = None
        if kinds is not None:
            nullable = nullable or "null" in kinds
            known = [k for k in kinds if k in _TYPES]
            if len(known) > 1:
                return self._split(src, known, nullable, expanding)
            kind = known[0] if known else None

        values: list[Any] | None = None
        if "const" in src:
            values = [src["const"]]
        elif isinstance(src.get("enum"), list):
            values = list(src["enum"])
        if values is not None:
            nullable = nullable or None in values
            values = [v for v in values if v is not None]
            if values and all(isinstance(v, str) for v in values) and kind in (None, "string"):
                out["enum"] = values
                kind = "string"
            elif values:
                kind = kind or _kind_of(values)
                shown = ", ".join(json.dumps(v, ensure_ascii=False) for v in values)
                one = len(values) == 1
                notes.append(f"Must be {shown}." if one else f"Allowed values: {shown}.")

        union = src.get("anyOf") if isinstance(src.get("anyOf"), list) else src.get("oneOf")
        if isinstance(union, list):
            branches: list[dict[str, Any]] = []
            for branch in union:
                if is_null_schema(branch):
                    nullable = True
                    continue
                converted = self.convert(branch, expanding)
                if converted not in branches:
                    branches.append(converted)
            if len(branches) > 1 and all(_string_enum(b) for b in branches):
                # `oneOf: [{const: a}, {const: b}]`, how Literal unions often arrive
                values = [v for b in branches for v in b["enum"]]
                branches = [{"type": "string", "enum": list(dict.fromkeys(values))}]
            if len(branches) == 1:
                inherited.update(branches[0])
            elif branches:
                out["anyOf"] = branches

        parts = src.get("allOf")
        if isinstance(parts, list):
            for part in parts:
                _merge_into(inherited, self.convert(part, expanding))

        nullable = nullable or inherited.pop("nullable", False) is True
        kind = kind or inherited.pop("type", None)
        inherited.pop("type", None)

        properties = src.get("properties")
        extra = src.get("additionalProperties")
        if kind is None and (isinstance(properties, Mapping) or isinstance(extra, Mapping)):
            kind = "object"
        if kind == "object":
            self._object(src, out, notes, expanding)

        items, prefix = src.get("items"), src.get("prefixItems")
        if isinstance(items, list):
            items, prefix = None, items
        if kind is None and (isinstance(items, Mapping) or isinstance(prefix, list)):
            kind = "array"
        if kind == "array":
            out["items"] = self._items(items, prefix, notes, expanding)
            if src.get("uniqueItems") is True:
                notes.append("Items must be unique.")

        self._bounds(src, kind, out, notes)
        fmt = src.get("format")
        if isinstance(fmt, str):
            if kind is not None and fmt in _FORMATS.get(kind, ()):
                out["format"] = fmt
            else:
                notes.append(f"Format: {fmt}.")
        if src.get("deprecated") is True:
            notes.append("Deprecated.")

        if kind is not None:
            out["type"] = kind
        if nullable:
            out["nullable"] = True
        if isinstance(src.get("title"), str):
            out["title"] = src["title"]
        description = src.get("description")
        if not isinstance(description, str):
            description = inherited.get("description")
        inherited.pop("description", None)
        if description or notes:
            out["description"] = _describe(description, notes)
        if "default" in src:
            out["default"] = src["default"]
        for key, value in inherited.items():
            if key == "properties" and "properties" in out:
                out["properties"] = {**value, **out["properties"]}
            elif key == "required" and "required" in out:
                out["required"] = list(dict.fromkeys([*out["required"], *value]))
            else:
                out.setdefault(key, value)
        _prune(out)
        return _ordered(out)

    def _split(
        self, src: Mapping[str, Any], kinds: list[str], nullable: bool, expanding: tuple[str, ...]
    ) -> dict[str, Any]:
        """`type: [A, B, ...]`: one `anyOf` branch per type, annotations kept on top."""
        top = ("type", "title", "description", "default", "nullable")
        base = {k: v for k, v in src.items() if k not in top}
        out: dict[str, Any] = {"anyOf": [self._node({**base, "type": k}, expanding) for k in kinds]}
        if nullable:
            out["nullable"] = True
        if isinstance(src.get("title"), str):
            out["title"] = src["title"]
        if isinstance(src.get("description"), str):
            out["description"] = src["description"]
        if "default" in src:
            out["default"] = src["default"]
        return _ordered(out)

    def _object(
        self,
        src: Mapping[str, Any],
        out: dict[str, Any],
        notes: list[str],
        expanding: tuple[str, ...],
    ) -> None:
        properties = src.get("properties")
        if isinstance(properties, Mapping) and properties:
            out["properties"] = {
                str(name): self.convert(sub, expanding) for name, sub in properties.items()
            }
            required = src.get("required")
            if isinstance(required, list):
                kept = [r for r in dict.fromkeys(required) if r in out["properties"]]
                if kept:
                    out["required"] = kept
        extra = src.get("additionalProperties")
        if isinstance(extra, Mapping) and extra:
            value = _summary(self.convert(extra, expanding))
            notes.append(
                f"Other keys are allowed too, each with {value} as its value."
                if "properties" in out
                else f"Keys are free-form; each value is {value}."
            )

    def _items(
        self, items: Any, prefix: Any, notes: list[str], expanding: tuple[str, ...]
    ) -> dict[str, Any]:
        if isinstance(prefix, list) and prefix:
            positions: list[dict[str, Any]] = []
            for position in prefix:
                converted = self.convert(position, expanding)
                if converted not in positions:
                    positions.append(converted)
            notes.append(f"A tuple: {len(prefix)} items in a fixed order.")
            return positions[0] if len(positions) == 1 else {"anyOf": positions}
        if isinstance(items, Mapping):
            return self.convert(items, expanding)
        return {}

    @staticmethod
    def _bounds(
        src: Mapping[str, Any], kind: str | None, out: dict[str, Any], notes: list[str]
    ) -> None:
        for key in _BOUNDS.get(kind or "", ()):
            if key in src:
                out[key] = src[key]
        if kind not in ("number", "integer"):
            return
        for key, bound, word in (
            ("exclusiveMinimum", "minimum", "greater"),
            ("exclusiveMaximum", "maximum", "less"),
        ):
            value = src.get(key)
            if value is True and bound in src:  # draft 4: a flag on minimum/maximum
                notes.append(f"Must be {word} than {src[bound]}.")
            elif isinstance(value, int | float) and not isinstance(value, bool):
                notes.append(f"Must be {word} than {value}.")
        step = src.get("multipleOf")
        if isinstance(step, int | float) and not isinstance(step, bool):
            notes.append(f"Must be a multiple of {step}.")


def _merge_into(target: dict[str, Any], part: Mapping[str, Any]) -> None:
    """`allOf`: the parts' properties and required names united; other keywords first wins."""
    for key, value in part.items():
        if key == "properties" and isinstance(target.get(key), dict):
            target[key] = {**value, **target[key]}
        elif key == "required" and isinstance(target.get(key), list):
            target[key] = list(dict.fromkeys([*target[key], *value]))
        else:
            target.setdefault(key, value)


def _prune(out: dict[str, Any]) -> None:
    """Keywords Gemini allows only on one type go when the node has another type."""
    kind = out.get("type")
    if kind is not None and kind != "object":
        out.pop("properties", None)
        out.pop("required", None)
    if kind is not None and kind != "array":
        out.pop("items", None)


def _string_enum(schema: Mapping[str, Any]) -> bool:
    return schema.get("type") == "string" and "enum" in schema and set(schema) <= {
        "type", "enum"
    }


def _kind_of(values: list[Any]) -> str | None:
    if all(isinstance(v, bool) for v in values):
        return "boolean"
    if all(isinstance(v, int) and not isinstance(v, bool) for v in values):
        return "integer"
    if all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return "number"
    if all(isinstance(v, dict) for v in values):
        return "object"
    if all(isinstance(v, list) for v in values):
        return "array"
    return None


def _summary(schema: Mapping[str, Any]) -> str:
    kind = schema.get("type")
    return _ARTICLE.get(kind, "any JSON value") if isinstance(kind, str) else "any JSON value"


def _describe(description: Any, notes: list[str]) -> str:
    parts = [description.strip()] if isinstance(description, str) and description.strip() else []
    if parts and notes and parts[0][-1] not in ".!?:":
        parts[0] += "."
    return " ".join([*parts, *notes])


def _ordered(node: dict[str, Any]) -> dict[str, Any]:
    """Keys in one fixed order, so goldens and provider prompt caches stay stable."""
    rank = {key: i for i, key in enumerate(_ORDER)}
    return {k: node[k] for k in sorted(node, key=lambda k: rank.get(k, len(rank)))}

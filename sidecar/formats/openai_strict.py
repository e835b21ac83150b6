"""OpenAI strict mode ("Structured Outputs" for function calling) and its inverse. Imports
`sidecar.formats.schema_refs` only. Exports `strict_schema` (a schema in the strict form, or
`NotStrictable` saying why not: both lists are in its docstring) and `input_from_strict` (the
arguments of a call made under a strict definition, made valid for the original schema again:
callers apply it to every such call).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final

from sidecar.formats.schema_refs import accepts_null, follow, plain, resolve_ref, types_of

MAX_DEPTH: Final = 10
MAX_PROPERTIES: Final = 5000
MAX_ENUM_VALUES: Final = 1000

_FORMATS: Final = frozenset(
    {"date-time", "time", "date", "duration", "email", "hostname", "ipv4", "ipv6", "uuid"}
)
_KEPT: Final = frozenset({
    "type", "properties", "required", "additionalProperties", "items", "anyOf", "enum",
    "const", "description", "title", "$ref", "$defs", "definitions", "pattern", "format",
    "minLength", "maxLength", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "minItems", "maxItems",
})
_DROPPED: Final = frozenset({
    "$schema", "$id", "$comment", "examples", "deprecated", "readOnly", "writeOnly",
    "discriminator",
})
_NOTED: Final = frozenset({"default", "minProperties", "maxProperties", "uniqueItems"})
_JSON_TYPES: Final = frozenset(
    {"string", "number", "integer", "boolean", "array", "object", "null"}
)


class NotStrictable(ValueError):
    """A schema OpenAI's strict mode cannot express; `reason` names the place and the cause."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def strict_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """`schema` in OpenAI's strict form, or `NotStrictable`.

    With `strict: true` OpenAI guarantees that arguments match the schema, but it accepts only a
    subset of JSON Schema, and it requires that every object lists **all** its properties in
    `required` and sets `additionalProperties: false`. `strict_schema` rewrites a schema to that
    form:

    - every object gets `additionalProperties: false` and `required` = all its properties; a
      property that was optional becomes nullable (`type: [T, "null"]`, `null` added to an `enum`,
      or `anyOf: [..., {"type": "null"}]`), unless it already accepted null;
    - `oneOf` becomes `anyOf`; a one-part `allOf` is merged into its node; a `$ref` with sibling
      keywords (which OpenAI refuses) is replaced by the schema it points at plus the siblings;
    - `const` becomes a one-value `enum`, and an `enum` without `type` gets the type of its values;
    - annotations OpenAI refuses are dropped (`$schema`, `$id`, `$comment`, `examples`,
      `deprecated`, `readOnly`, `writeOnly`, OpenAPI's `discriminator`), and `default`,
      `minProperties`, `maxProperties`, `uniqueItems` and formats outside OpenAI's list move to
      the description.

    Schemas that **cannot** be made strict (`NotStrictable` says why; the tool is then advertised
    with `strict: false` and its schema unchanged):

    - a root that is not a plain object (e.g. a root `anyOf`);
    - free-form values: an object without properties that does not forbid other keys, maps
      (`additionalProperties: true` or a schema), an array without `items`, an empty schema `{}`;
    - keywords with no strict equivalent: `patternProperties`, `propertyNames`,
      `unevaluatedProperties`, `dependentRequired`, `dependentSchemas`, `if`/`then`/`else`, `not`,
      `allOf` with more than one part, tuples (`prefixItems`, `items: [...]`), `contains`, and any
      keyword this module does not know;
    - a non-local `$ref`; more than 10 levels of object nesting, more than 5,000 properties or
      more than 1,000 enum values in one schema (OpenAI's documented limits).
    """
    root = plain(schema)
    if not isinstance(root, dict) or types_of(root) not in (None, ["object"]):
        raise NotStrictable("$: the root must be an object")
    if any(k in root for k in ("anyOf", "oneOf", "allOf")) or "$ref" in root:
        raise NotStrictable("$: the root must be a plain object, not a union or a reference")
    out = _Strict(root).node({**root, "type": "object"}, "$")
    for key in ("$defs", "definitions"):
        defs = root.get(key)
        if isinstance(defs, Mapping):
            converter = _Strict(root)
            out[key] = {
                name: converter.node(sub, f"$.{key}.{name}") for name, sub in defs.items()
            }
    _check_limits(out)
    return out


def input_from_strict(schema: Mapping[str, Any], arguments: Any) -> Any:
    """Arguments a model sent under a strict definition, made valid for the original `schema`:
    a `null` for a property the original makes optional and not nullable is removed.

    The seam validates calls against the tool's *original* schema, which does not accept the nulls
    strict mode makes the model send for omitted optional properties: `input_from_strict` removes
    them again, and callers apply it to the arguments of every call made under a strict definition.
    """
    return _unstrict(schema, schema, arguments, 0)


class _Strict:
    __slots__ = ("root",)

    def __init__(self, root: Mapping[str, Any]) -> None:
        self.root = root

    def node(self, schema: Any, where: str, hops: int = 0) -> dict[str, Any]:
        if not isinstance(schema, Mapping) or not schema:
            raise NotStrictable(f"{where}: a free-form value (any JSON) cannot be strict")
        src = dict(schema)
        ref = src.get("$ref")
        if isinstance(ref, str):
            target = resolve_ref(self.root, ref)
            if target is None:
                raise NotStrictable(f"{where}: the reference {ref} cannot be resolved")
            siblings = {k: v for k, v in src.items() if k not in _DROPPED and k != "$ref"}
            if not siblings:
                return {"$ref": ref}
            if hops > 16:
                raise NotStrictable(f"{where}: the reference {ref} does not end")
            # OpenAI refuses `$ref` with siblings: use the target, the siblings winning
            return self.node({**target, **siblings}, where, hops + 1)
        unknown = sorted(set(src) - _KEPT - _DROPPED - _NOTED - {"oneOf", "allOf"})
        if unknown:
            raise NotStrictable(f"{where}: {', '.join(unknown)} cannot be expressed strictly")
        for key in _DROPPED:
            src.pop(key, None)
        notes = self._notes(src)
        if "oneOf" in src:
            if "anyOf" in src:
                raise NotStrictable(f"{where}: anyOf together with oneOf cannot be strict")
            src["anyOf"] = src.pop("oneOf")
        parts = src.pop("allOf", None)
        if parts is not None:
            if not isinstance(parts, list) or len(parts) != 1 or not isinstance(parts[0], Mapping):
                raise NotStrictable(f"{where}: allOf with several parts cannot be strict")
            return self.node({**parts[0], **src}, where, hops + 1)

        if "const" in src:  # OpenAI documents `enum`; a constant is a one-value enum
            src["enum"] = [src.pop("const")]
        if "type" not in src and isinstance(src.get("enum"), list) and src["enum"]:
            src = {"type": _value_types(src["enum"]), **src}  # OpenAI wants a type on enums
        kinds = types_of(src)
        if kinds is not None and not set(kinds) <= _JSON_TYPES:
            raise NotStrictable(f"{where}: unknown type {src['type']!r}")
        out: dict[str, Any] = {}
        for key, value in src.items():
            if key in ("properties", "required", "additionalProperties", "items", "anyOf"):
                continue
            out[key] = value
        if notes:
            out["description"] = _describe(src.get("description"), notes)
        is_object = (kinds is not None and "object" in kinds) or "properties" in src
        if is_object:
            self._object(src, out, where)
        elif "additionalProperties" in src or "required" in src:
            raise NotStrictable(f"{where}: object keywords on a node that is not an object")
        if (kinds is not None and "array" in kinds) or "items" in src:
            items = src.get("items")
            if not isinstance(items, Mapping):
                raise NotStrictable(f"{where}: an array needs one item schema to be strict")
            out["items"] = self.node(items, f"{where}[*]")
        if "anyOf" in src:
            branches = src["anyOf"]
            if not isinstance(branches, list) or not branches:
                raise NotStrictable(f"{where}: anyOf must be a non-empty list")
            out["anyOf"] = [self.node(b, f"{where}.anyOf[{i}]") for i, b in enumerate(branches)]
        if kinds is None and not {"anyOf", "$ref", "enum", "const"} & set(out) and not is_object:
            raise NotStrictable(f"{where}: a schema without a type cannot be strict")
        return out

    def _object(self, src: Mapping[str, Any], out: dict[str, Any], where: str) -> None:
        extra = src.get("additionalProperties")
        properties = src.get("properties", {})
        if not isinstance(properties, Mapping):
            raise NotStrictable(f"{where}: properties must be an object")
        if isinstance(extra, Mapping) and extra:
            raise NotStrictable(f"{where}: a map with free-form keys cannot be strict")
        if not properties and extra is not False and where != "$":
            # at the root it is a tool without arguments; inside, a free-form object
            raise NotStrictable(f"{where}: an object without properties cannot be strict")
        required_list = src.get("required", [])
        required = set(required_list) if isinstance(required_list, list) else set()
        missing = sorted(str(r) for r in required - set(properties))
        if missing:
            raise NotStrictable(f"{where}: required {', '.join(missing)} has no schema")
        converted: dict[str, Any] = {}
        for name, sub in properties.items():
            child = self.node(sub, f"{where}.{name}")
            if name not in required and not accepts_null(self.root, sub):
                child = _nullable(child)
            converted[str(name)] = child
        out["properties"] = converted
        out["required"] = list(converted)
        out["additionalProperties"] = False

    @staticmethod
    def _notes(src: dict[str, Any]) -> list[str]:
        notes: list[str] = []
        if "default" in src:
            notes.append(f"Default: {json.dumps(src.pop('default'), ensure_ascii=False)}.")
        fmt = src.get("format")
        if isinstance(fmt, str) and fmt not in _FORMATS:
            notes.append(f"Format: {src.pop('format')}.")
        for key, text in (("minProperties", "At least {} keys."),
                          ("maxProperties", "At most {} keys.")):
            if key in src:
                notes.append(text.format(src.pop(key)))
        if src.pop("uniqueItems", False) is True:
            notes.append("Items must be unique.")
        return notes


def _value_types(values: list[Any]) -> str | list[str]:
    """The JSON type(s) of enum values: `["a", None]` -> `["string", "null"]`."""
    names: dict[str, None] = {}
    for value in values:
        names[_JSON_NAMES.get(type(value), "object")] = None
    if "number" in names:
        names.pop("integer", None)
    kinds = list(names)
    return kinds[0] if len(kinds) == 1 else kinds


_JSON_NAMES: Final[dict[type, str]] = {
    str: "string", bool: "boolean", int: "integer", float: "number", type(None): "null",
    list: "array", dict: "object",
}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """`schema` that also accepts null, in the simplest form OpenAI documents."""
    kinds = types_of(schema)
    if kinds is not None and "const" not in schema and "anyOf" not in schema:
        out = {**schema, "type": [*kinds, "null"]}
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    if kinds is None and isinstance(schema.get("enum"), list) and "anyOf" not in schema:
        return {**schema, "enum": [*schema["enum"], None]}
    if kinds is None and "const" in schema and "anyOf" not in schema:
        rest = {k: v for k, v in schema.items() if k != "const"}
        return {**rest, "enum": [schema["const"], None]}
    if kinds is None and isinstance(schema.get("anyOf"), list):
        return {**schema, "anyOf": [*schema["anyOf"], {"type": "null"}]}
    top: dict[str, Any] = {k: schema[k] for k in ("title", "description") if k in schema}
    inner = {k: v for k, v in schema.items() if k not in top}
    return {"anyOf": [inner, {"type": "null"}], **top}


def _describe(description: Any, notes: list[str]) -> str:
    parts = [description.strip()] if isinstance(description, str) and description.strip() else []
    if parts and parts[0][-1] not in ".!?:":
        parts[0] += "."
    return " ".join([*parts, *notes])


def _check_limits(schema: dict[str, Any]) -> None:
    properties = 0
    enum_values = 0

    def walk(node: Any, depth: int) -> None:
        nonlocal properties, enum_values
        if isinstance(node, list):
            for item in node:
                walk(item, depth)
            return
        if not isinstance(node, dict):
            return
        if isinstance(node.get("enum"), list):
            enum_values += len(node["enum"])
        props = node.get("properties")
        if isinstance(props, dict):
            if depth + 1 > MAX_DEPTH:
                raise NotStrictable(f"more than {MAX_DEPTH} levels of nested objects")
            properties += len(props)
            for sub in props.values():
                walk(sub, depth + 1)
        for key in ("items", "anyOf", "$defs", "definitions"):
            value = node.get(key)
            if key in ("$defs", "definitions") and isinstance(value, dict):
                for sub in value.values():
                    walk(sub, depth)
            elif value is not None:
                walk(value, depth)

    walk(schema, 0)
    if properties > MAX_PROPERTIES:
        raise NotStrictable(f"{properties} properties (OpenAI takes at most {MAX_PROPERTIES})")
    if enum_values > MAX_ENUM_VALUES:
        raise NotStrictable(f"{enum_values} enum values (OpenAI takes at most {MAX_ENUM_VALUES})")


def _unstrict(root: Mapping[str, Any], schema: Any, value: Any, depth: int) -> Any:
    if depth > 64 or not isinstance(schema, Mapping):
        return value
    node = follow(root, schema) or {}
    parts = node.get("allOf")
    if isinstance(parts, list) and len(parts) == 1 and isinstance(parts[0], Mapping):
        node = {**(follow(root, parts[0]) or {}), **node}
    if isinstance(value, dict):
        properties = node.get("properties")
        if not isinstance(properties, Mapping):
            node = _object_branch(root, node, value) or {}
            properties = node.get("properties")
        if not isinstance(properties, Mapping):
            return value
        required = node.get("required", [])
        out: dict[str, Any] = {}
        for key, item in value.items():
            sub = properties.get(key)
            if sub is None:
                out[key] = item
            elif item is None and key not in required and not accepts_null(root, sub):
                continue
            else:
                out[key] = _unstrict(root, sub, item, depth + 1)
        return out
    if isinstance(value, list):
        items = node.get("items")
        if isinstance(items, Mapping):
            return [_unstrict(root, items, item, depth + 1) for item in value]
    return value


def _object_branch(
    root: Mapping[str, Any], node: Mapping[str, Any], value: Mapping[str, Any]
) -> Mapping[str, Any] | None:
    """The branch of an `anyOf`/`oneOf` that `value` (an object) was sent for: among the
    branches with properties, the one that has all of its keys and whose `const`/`enum`
    properties it matches (the first such branch when several do)."""
    branches = node.get("anyOf") or node.get("oneOf")
    if not isinstance(branches, list):
        return None
    for branch in branches:
        target = follow(root, branch) if isinstance(branch, Mapping) else None
        properties = target.get("properties") if target is not None else None
        if target is None or not isinstance(properties, Mapping):
            continue
        if set(value) <= set(properties) and all(
            _fits_constant(root, properties[key], item) for key, item in value.items()
        ):
            return target
    return None


def _fits_constant(root: Mapping[str, Any], schema: Any, value: Any) -> bool:
    target = follow(root, schema) if isinstance(schema, Mapping) else None
    if target is None:
        return True
    if "const" in target:
        return bool(target["const"] == value)
    enum = target.get("enum")
    return not isinstance(enum, list) or value in enum

"""Small read-only helpers over JSON Schemas shared by the provider adaptations.

Only local references (`#`, `#/$defs/Name`, `#/definitions/Name`, any `#/json/pointer`) are
resolved; a remote reference resolves to nothing and each caller says what it does then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import unquote

_MAX_REF_HOPS = 64
"""A `$ref` chain longer than this is treated as unresolvable (it can only be a loop)."""


def plain(value: Any) -> Any:
    """A deep copy of a JSON value as plain dicts and lists (mappings and tuples included),
    so what replay returns never aliases a definition a registry holds."""
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [plain(v) for v in value]
    return value


def resolve_ref(root: Mapping[str, Any], ref: str) -> Mapping[str, Any] | None:
    """The schema a local `$ref` points at inside `root`, or None."""
    if not ref.startswith("#"):
        return None
    pointer = unquote(ref[1:])
    if pointer == "":
        return root
    if not pointer.startswith("/"):
        return None  # a named anchor: not used by the schema generators we meet
    node: Any = root
    for raw in pointer[1:].split("/"):
        part = raw.replace("~1", "/").replace("~0", "~")
        if isinstance(node, Mapping) and part in node:
            node = node[part]
        elif isinstance(node, Sequence) and not isinstance(node, str) and part.isdigit():
            index = int(part)
            if index >= len(node):
                return None
            node = node[index]
        else:
            return None
    return node if isinstance(node, Mapping) else None


def ref_name(ref: str) -> str:
    """A readable name for what a `$ref` points at: `#/$defs/Node` -> `Node`."""
    tail = unquote(ref.rsplit("/", 1)[-1]).replace("~1", "/").replace("~0", "~")
    return tail if tail and tail != "#" else "input"


def follow(root: Mapping[str, Any], schema: Mapping[str, Any]) -> Mapping[str, Any] | None:
    """`schema` with a bare `$ref` chain followed (siblings of a `$ref` are ignored)."""
    node: Mapping[str, Any] | None = schema
    for _ in range(_MAX_REF_HOPS):
        if node is None:
            return None
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return node
        node = resolve_ref(root, ref)
    return None


def types_of(schema: Mapping[str, Any]) -> list[str] | None:
    """The `type` keyword as a list, or None when the schema does not restrict the type."""
    kind = schema.get("type")
    if isinstance(kind, str):
        return [kind]
    if isinstance(kind, list):
        return [k for k in kind if isinstance(k, str)]
    return None


def is_null_schema(schema: Any) -> bool:
    """True for the schemas that accept only `null` (`{"type": "null"}` and the like)."""
    if not isinstance(schema, Mapping):
        return False
    if schema.get("type") == "null" or schema.get("type") == ["null"]:
        return True
    if "const" in schema and schema["const"] is None:
        return True
    enum = schema.get("enum")
    return isinstance(enum, list) and len(enum) > 0 and all(v is None for v in enum)


def accepts_null(root: Mapping[str, Any], schema: Any, _depth: int = 0) -> bool:
    """Whether `null` may be valid for `schema` (a conservative reading: unknown means yes)."""
    if schema is True or not isinstance(schema, Mapping):
        return schema is not False
    if _depth > _MAX_REF_HOPS:
        return True
    if "$ref" in schema:
        target = resolve_ref(root, schema["$ref"]) if isinstance(schema["$ref"], str) else None
        if target is None or not accepts_null(root, target, _depth + 1):
            return target is None
    if "const" in schema and schema["const"] is not None:
        return False
    enum = schema.get("enum")
    if isinstance(enum, list) and None not in enum:
        return False
    kinds = types_of(schema)
    if kinds is not None and "null" not in kinds:
        return False
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and not any(
            accepts_null(root, b, _depth + 1) for b in branches
        ):
            return False
    branches = schema.get("allOf")
    if isinstance(branches, list):
        return all(accepts_null(root, b, _depth + 1) for b in branches)
    return True


def is_object_schema(root: Mapping[str, Any], schema: Mapping[str, Any], _depth: int = 0) -> bool:
    """Whether every value `schema` accepts is a JSON object (the MCP output-schema rule)."""
    if _depth > _MAX_REF_HOPS:
        return False
    if isinstance(schema.get("$ref"), str):
        target = resolve_ref(root, schema["$ref"])
        if target is not None and is_object_schema(root, target, _depth + 1):
            return True
    kinds = types_of(schema)
    if kinds is not None:
        return kinds == ["object"]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list) and branches:
            return all(
                isinstance(b, Mapping) and is_object_schema(root, b, _depth + 1)
                for b in branches
            )
    branches = schema.get("allOf")
    if isinstance(branches, list) and any(
        isinstance(b, Mapping) and is_object_schema(root, b, _depth + 1) for b in branches
    ):
        return True
    # `properties` without `type` is how hand-written schemas often say "an object"
    return isinstance(schema.get("properties"), Mapping)

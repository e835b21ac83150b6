"""OpenAPI schemas as self-contained JSON Schemas (draft 2020-12) for tool codecs. Imports
nothing of ours; exports `SchemaConverter`.

Every `$ref` is resolved with `referencing` (against the document that holds it, so references
inside a second file resolve from that file) and the schema it names is copied once into the
tool's `$defs`, the reference rewritten to `#/$defs/NAME`: recursive schemas stay finite and a
shared schema appears once. OpenAPI 3.0's dialect is translated: `nullable: true` adds
`"null"`, a boolean `exclusiveMinimum`/`exclusiveMaximum` becomes the number form, `example`
becomes `examples`. Keywords no validator reads (`xml`, `externalDocs`, `discriminator`,
`x-*` extensions) are left out.
"""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urldefrag, urljoin

import referencing
import referencing.exceptions

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions",
                          "dependentSchemas"})
_SCHEMA_LISTS = frozenset({"allOf", "anyOf", "oneOf", "prefixItems"})
_SCHEMAS = frozenset({"items", "additionalProperties", "not", "if", "then", "else", "contains",
                      "propertyNames", "unevaluatedItems", "unevaluatedProperties",
                      "additionalItems", "contentSchema"})
_DROPPED = frozenset({"xml", "externalDocs", "discriminator", "nullable", "example", "$schema",
                      "$id", "$anchor", "$dynamicAnchor"})
_NAME = re.compile(r"[^A-Za-z0-9_.-]")


class SchemaConverter:
    """Converts the schemas of one operation; `finish(top)` adds the `$defs` they use."""

    def __init__(self, version: str, registry: referencing.Registry[Any]) -> None:
        self._v30 = version == "3.0"
        self._registry = registry
        self._defs: dict[str, Any] = {}
        self._names: dict[str, str] = {}  # target URI -> name in $defs

    def convert(self, schema: Any, base: str) -> Any:
        """`schema` (found in the document at URI `base`) as JSON Schema; raises
        `referencing.exceptions.Unresolvable`."""
        if isinstance(schema, bool):
            return schema
        if not isinstance(schema, dict):
            return {}
        if isinstance(schema.get("$ref"), str):
            return self._ref(schema, base)
        out: dict[str, Any] = {}
        for key, value in schema.items():
            if key in _DROPPED or key.startswith("x-"):
                continue
            if key in _SCHEMA_MAPS and isinstance(value, dict):
                out[key] = {k: self.convert(v, base) for k, v in value.items()}
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [self.convert(v, base) for v in value]
            elif key in _SCHEMAS or (key == "items" and isinstance(value, list)):
                out[key] = ([self.convert(v, base) for v in value]
                            if isinstance(value, list) else self.convert(value, base))
            else:
                out[key] = value
        if "example" in schema and "examples" not in schema:
            out["examples"] = [schema["example"]]
        if self._v30:
            _exclusive(out, "exclusiveMinimum", "minimum")
            _exclusive(out, "exclusiveMaximum", "maximum")
        if schema.get("nullable") is True:
            out = _nullable(out)
        return out

    def _ref(self, schema: dict[str, Any], base: str) -> Any:
        target = urljoin(base, schema["$ref"])
        name = self._names.get(target)
        if name is None:
            resolved = self._registry.resolver(base).lookup(schema["$ref"])
            name = self._name_for(target)
            self._names[target] = name
            self._defs[name] = True  # a placeholder while converting (recursion)
            self._defs[name] = self.convert(resolved.contents, urldefrag(target).url)
        out: dict[str, Any] = {"$ref": f"#/$defs/{name}"}
        siblings = {k: v for k, v in schema.items() if k not in ("$ref", "nullable")}
        if siblings:
            out.update(self.convert(siblings, base))
        if schema.get("nullable") is True:
            out = {"anyOf": [out, {"type": "null"}]}
        return out

    def _name_for(self, target: str) -> str:
        fragment = target.partition("#")[2]
        last = fragment.rstrip("/").rpartition("/")[2] or "schema"
        base = _NAME.sub("_", last.replace("~1", "/").replace("~0", "~")) or "schema"
        name, n = base, 2
        while name in self._defs:
            name, n = f"{base}_{n}", n + 1
        return name

    def finish(self, schema: Any) -> dict[str, Any]:
        """`schema` as a whole schema: a bare reference at the top replaced by what it names,
        and the `$defs` it reaches (directly or through each other) added."""
        top: dict[str, Any] = (dict(schema) if isinstance(schema, dict)
                               else {} if schema is True else {"not": {}})
        seen: set[str] = set()
        while set(top) == {"$ref"} and top["$ref"].startswith("#/$defs/"):
            name = top["$ref"].removeprefix("#/$defs/")
            if name in seen or not isinstance(self._defs.get(name), dict):
                break
            seen.add(name)
            top = {**self._defs[name]}
        used = _reached(top, self._defs)
        if used:
            top = {**top, "$defs": {**top.get("$defs", {}),
                                    **{n: self._defs[n] for n in sorted(used)}}}
        return top


def _exclusive(schema: dict[str, Any], exclusive: str, bound: str) -> None:
    flag = schema.get(exclusive)
    if flag is True and bound in schema:
        schema[exclusive] = schema.pop(bound)
    elif isinstance(flag, bool):
        del schema[exclusive]


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    kind = schema.get("type")
    if isinstance(kind, str):
        out = {**schema, "type": [kind, "null"]}
        if isinstance(out.get("enum"), list) and None not in out["enum"]:
            out["enum"] = [*out["enum"], None]
        return out
    if isinstance(kind, list):
        return {**schema, "type": [*kind, *(["null"] if "null" not in kind else [])]}
    return {"anyOf": [schema, {"type": "null"}]}


def _reached(top: Any, defs: dict[str, Any]) -> set[str]:
    found: set[str] = set()
    stack = [top]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            ref = node.get("$ref")
            if isinstance(ref, str) and ref.startswith("#/$defs/"):
                name = ref.removeprefix("#/$defs/")
                if name not in found and name in defs:
                    found.add(name)
                    stack.append(defs[name])
            stack.extend(v for k, v in node.items() if k != "$defs")
        elif isinstance(node, list):
            stack.extend(node)
    return found

"""The operations of an OpenAPI description, as what a tool needs: a name, a description, an
input schema (path, query, header and cookie parameters and the request body), an output schema
and how to put the input back into a request. Imports `bridges.openapi.document`, `.schemas`
and `sidecar.model.names`; exports `Operation`, `Parameter`, `Body`, `Skipped`, `read_operations`,
`operation_key`.

Names: the operationId; without one, the method and the path (`GET /pet/{petId}` ->
`get_pet_petId`). A name taken twice (after the name rules replace characters outside
`[A-Za-z0-9_-]` with `_`) gets `_2`, `_3`, in document order. Input: each parameter
is a property under its own name (one that two locations share gets `_<in>` after the first);
a request body is the property `body` (`request_body` when a parameter is called `body`).
Output: the schema of the JSON 2xx response, when that is the operation's only 2xx response and
describes an object (a tool's output is a JSON object); other responses come back as text.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal
from urllib.parse import urldefrag, urljoin

import referencing.exceptions

from bridges.openapi.document import Spec
from bridges.openapi.schemas import SchemaConverter
from sidecar.model.names import sanitize

METHODS = ("get", "put", "post", "delete", "options", "head", "patch")
"""The methods an operation may have (OpenAPI's `trace` is left out: no tool needs it)."""
Location = Literal["path", "query", "header", "cookie"]
_LOCATIONS: tuple[Location, ...] = ("path", "query", "header", "cookie")
_IGNORED_HEADERS = frozenset({"accept", "content-type", "authorization"})
_JSON = re.compile(r"^application/(?:[\w.+-]+\+)?json$|^\*/\*$")


@dataclass(frozen=True, slots=True)
class Parameter:
    name: str
    location: Location
    prop: str
    """The input property that carries it."""
    style: str
    explode: bool
    json_content: bool = False
    """Declared with `content` (a JSON media type): sent as JSON text."""


@dataclass(frozen=True, slots=True)
class Body:
    prop: str
    media_type: str
    kind: Literal["json", "form", "text"]
    required: bool


@dataclass(frozen=True, slots=True)
class Operation:
    key: str
    method: str
    path: str
    description: str
    parameters: tuple[Parameter, ...]
    body: Body | None
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None
    accept: str
    deprecated: bool


@dataclass(frozen=True, slots=True)
class Skipped:
    """An operation left out, and why (shown in the log and in health)."""

    what: str
    reason: str


def operation_key(method: str, path: str) -> str:
    """The name of an operation without an operationId: `GET /pet/{petId}` -> `get_pet_petId`."""
    words = re.sub(r"[^A-Za-z0-9]+", "_", path).strip("_")
    return f"{method.lower()}_{words}" if words else method.lower()


def read_operations(
    spec: Spec, allow: list[str] | None, deny: Iterable[str]
) -> tuple[list[Operation], list[Skipped]]:
    """Every operation of `spec` that `allow`/`deny` (globs over the name or `METHOD /path`)
    let through, in document order."""
    deny = list(deny)
    found: list[Operation] = []
    skipped: list[Skipped] = []
    taken: set[str] = set()
    paths = spec.data.get("paths") or {}
    for path, item in paths.items():
        if not isinstance(item, dict):
            continue
        item, base = _deref(spec, item, spec.uri)
        for method in METHODS:
            raw = item.get(method)
            if not isinstance(raw, dict):
                continue
            what = f"{method.upper()} {path}"
            key = raw.get("operationId") if isinstance(raw.get("operationId"), str) else None
            key = key or operation_key(method, path)
            if not _wanted((key, what), allow, deny):
                continue
            name, n = key, 2
            while sanitize(name) in taken:
                name, n = f"{key}_{n}", n + 1
            try:
                operation = _operation(spec, name, method, path, item, raw, base)
            except _Unusable as exc:
                skipped.append(Skipped(f"{name} ({what})", str(exc)))
                continue
            except referencing.exceptions.Unresolvable as exc:
                cause = f": {exc.__cause__}" if exc.__cause__ else ""
                skipped.append(Skipped(f"{name} ({what})", f"unresolvable {exc}{cause}"))
                continue
            taken.add(sanitize(name))
            found.append(operation)
    return found, skipped


def _wanted(names: tuple[str, str], allow: list[str] | None, deny: list[str]) -> bool:
    def hit(globs: Iterable[str]) -> bool:
        return any(fnmatch.fnmatchcase(n, g) for g in globs for n in names)

    return (allow is None or hit(allow)) and not hit(deny)


class _Unusable(Exception):
    """An operation no tool can call (said in the message)."""


def _deref(spec: Spec, node: Any, base: str) -> tuple[dict[str, Any], str]:
    """`node`, or what its `$ref` names (and the URI it lives at)."""
    seen = 0
    while isinstance(node, dict) and isinstance(node.get("$ref"), str):
        seen += 1
        if seen > 32:
            raise _Unusable("a chain of more than 32 $refs")
        target = urljoin(base, node["$ref"])
        node = spec.registry.resolver(base).lookup(node["$ref"]).contents
        base = urldefrag(target).url
    return (node if isinstance(node, dict) else {}), base


def _operation(
    spec: Spec, key: str, method: str, path: str, item: dict[str, Any], raw: dict[str, Any],
    base: str,
) -> Operation:
    schemas = SchemaConverter(spec.version, spec.registry)
    merged: dict[tuple[str, Location], tuple[dict[str, Any], str]] = {}
    for node in [*(item.get("parameters") or []), *(raw.get("parameters") or [])]:
        param, where = _deref(spec, node, base)
        name, location = param.get("name"), param.get("in")
        if isinstance(name, str) and location in _LOCATIONS:
            merged[(name, location)] = (param, where)
    properties: dict[str, Any] = {}
    required: list[str] = []
    parameters: list[Parameter] = []
    for (name, location), (param, where) in merged.items():
        if location == "header" and name.lower() in _IGNORED_HEADERS:
            continue
        prop = name if name not in properties else f"{name}_{location}"
        schema, json_content = _parameter_schema(param)
        converted = schemas.convert(schema, where)
        if isinstance(converted, dict) and param.get("description") \
                and "description" not in converted:
            converted = {**converted, "description": param["description"]}
        properties[prop] = converted
        if location == "path" or param.get("required") is True:
            required.append(prop)
        style = param.get("style") or ("form" if location in ("query", "cookie") else "simple")
        explode = param.get("explode")
        parameters.append(Parameter(
            name, location, prop, style,
            explode if isinstance(explode, bool) else style == "form", json_content))
    for segment in re.findall(r"\{([^}]+)\}", path):
        if (segment, "path") not in merged:
            raise _Unusable(f"the path names {{{segment}}}, which no parameter declares")
    body = _body(spec, raw, base, schemas, properties, required)
    description = _description(raw, method, path)
    output, accept = _output(spec, raw, base, schemas)
    input_schema = schemas.finish({"type": "object", "properties": properties,
                                   **({"required": required} if required else {}),
                                   "additionalProperties": False})
    return Operation(key, method.upper(), path, description, tuple(parameters), body,
                     input_schema, output, accept, raw.get("deprecated") is True)


def _parameter_schema(param: dict[str, Any]) -> tuple[Any, bool]:
    if "schema" in param:
        return param["schema"], False
    content = param.get("content")
    if isinstance(content, dict) and content:
        media, entry = next(iter(content.items()))
        schema = entry.get("schema", {}) if isinstance(entry, dict) else {}
        return schema, bool(_JSON.match(media.split(";")[0].strip().lower()))
    return {}, False


def _body(
    spec: Spec, raw: dict[str, Any], base: str, schemas: SchemaConverter,
    properties: dict[str, Any], required: list[str],
) -> Body | None:
    if "requestBody" not in raw:
        return None
    body, where = _deref(spec, raw["requestBody"], base)
    content = _object(body.get("content"))
    chosen: tuple[str, Literal["json", "form", "text"]] | None = None
    for media in content:
        plain = media.split(";")[0].strip().lower()
        if _JSON.match(plain):
            chosen = (media, "json")
            break
        if plain == "application/x-www-form-urlencoded" and chosen is None:
            chosen = (media, "form")
        elif plain.startswith("text/") and chosen is None:
            chosen = (media, "text")
    is_required = body.get("required") is True
    if chosen is None:
        if is_required:
            kinds = ", ".join(content) or "none"
            raise _Unusable(f"its request body has no JSON, form or text media type ({kinds})")
        return None
    media, kind = chosen
    entry = _object(content[media])
    schema = schemas.convert(entry.get("schema", {}), where) if kind != "text" else {
        "type": "string"}
    if isinstance(schema, dict) and body.get("description") and "description" not in schema:
        schema = {**schema, "description": body["description"]}
    prop = next(p for p in ("body", "request_body", "body_") if p not in properties)
    properties[prop] = schema
    if is_required:
        required.append(prop)
    return Body(prop, media.split(";")[0].strip(), kind, is_required)


def _description(raw: dict[str, Any], method: str, path: str) -> str:
    parts = [str(raw[k]).strip() for k in ("summary", "description")
             if isinstance(raw.get(k), str) and raw[k].strip()]
    if len(parts) == 2 and parts[1].startswith(parts[0].rstrip(".")):
        parts = parts[1:]
    text = "\n\n".join(dict.fromkeys(parts)) or f"{method.upper()} {path}"
    return f"(deprecated) {text}" if raw.get("deprecated") is True else text


def _output(
    spec: Spec, raw: dict[str, Any], base: str, schemas: SchemaConverter
) -> tuple[dict[str, Any] | None, str]:
    responses = _object(raw.get("responses"))
    success = [code for code in responses if str(code).startswith("2") or code == "2XX"]
    media_types: list[str] = []
    output: dict[str, Any] | None = None
    for code in success:
        response, where = _deref(spec, responses[code], base)
        content = _object(response.get("content"))
        for media in content:
            plain = media.split(";")[0].strip().lower()
            if _JSON.match(plain):
                media_types.insert(0, media)
                entry = _object(content[media])
                if len(success) == 1 and "schema" in entry:
                    schema = schemas.finish(schemas.convert(entry["schema"], where))
                    output = schema if schema.get("type") == "object" else None
            elif media not in media_types:
                media_types.append(media)
    json_types = [m for m in media_types if _JSON.match(m.split(";")[0].strip().lower())]
    accept = ", ".join(dict.fromkeys(json_types or media_types))
    return output, accept


def _object(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}

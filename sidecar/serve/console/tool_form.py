"""A tool's input form, generated from its input JSON Schema, and the input a submitted form
means: `schema_fields(schema, values)` (HTML) and `form_input(schema, form)` (JSON).

A property becomes: a text field (string), a number field (number, integer), a true/false
choice (boolean), a choice of its values (enum, const), one value per line (an array of
those), nested fields (an object with properties, three levels deep), or a JSON text area
(anything else: arrays of objects, unions, free-form objects). Required properties are
marked; defaults fill the fields. A non-empty raw JSON input replaces the fields.

Imports nothing of ours. Exports `schema_fields`, `form_input`, `FormProblem`, `RAW`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from html import escape
from typing import Any

RAW = "raw"
PREFIX = "f:"
MAX_DEPTH = 3
_SCALARS = ("string", "number", "integer", "boolean")


class FormProblem(Exception):
    """A field whose text is not a value of its type (the message names the field)."""


def _type(schema: Mapping[str, Any]) -> str | None:
    kind = schema.get("type")
    if isinstance(kind, list):
        kinds = [k for k in kind if k != "null"]
        return kinds[0] if len(kinds) == 1 else None
    return kind if isinstance(kind, str) else None


def _choices(schema: Mapping[str, Any]) -> list[Any] | None:
    if isinstance(schema.get("enum"), list):
        return list(schema["enum"])
    if "const" in schema:
        return [schema["const"]]
    return None


def _kind(schema: Mapping[str, Any], depth: int) -> str:
    if _choices(schema) is not None:
        return "choice"
    kind = _type(schema)
    if kind in _SCALARS:
        return kind or ""
    items = schema.get("items")
    if kind == "array" and isinstance(items, dict) and (
            _type(items) in ("string", "number", "integer") or _choices(items) is not None):
        return "lines"
    if kind == "object" and isinstance(schema.get("properties"), dict) and depth < MAX_DEPTH:
        return "object"
    return "json"


def _pointer(path: tuple[str, ...]) -> str:
    return "".join("/" + p.replace("~", "~0").replace("/", "~1") for p in path)


def _shown(value: Any, kind: str) -> str:
    if value is None:
        return ""
    if kind == "choice":
        return json.dumps(value)
    if kind == "lines" and isinstance(value, list):
        return "\n".join(v if isinstance(v, str) else json.dumps(v) for v in value)
    if kind == "boolean":
        return "true" if value is True else "false" if value is False else ""
    if kind == "json":
        return json.dumps(value, indent=2)
    return value if isinstance(value, str) else json.dumps(value)


def schema_fields(schema: Mapping[str, Any], values: Mapping[str, str] | None = None) -> str:
    """The form's fields for `schema` (an object schema), filled with the submitted `values`
    (by field name) or else the schema's defaults. Empty when the schema has no properties."""
    properties = schema.get("properties")
    if _type(schema) not in ("object", None) or not isinstance(properties, dict):
        return ""
    return _fields(schema, (), values or {}, 0)


def _fields(schema: Mapping[str, Any], path: tuple[str, ...], values: Mapping[str, str],
            depth: int) -> str:
    required = set(schema.get("required") or ())
    return "".join(_field(name, sub if isinstance(sub, dict) else {}, (*path, name),
                          name in required, values, depth)
                   for name, sub in schema.get("properties", {}).items())


def _field(name: str, schema: Mapping[str, Any], path: tuple[str, ...], required: bool,
           values: Mapping[str, str], depth: int) -> str:
    e = escape
    kind = _kind(schema, depth)
    key = PREFIX + _pointer(path)
    ident = "f" + "".join(f"-{ord(c):x}" if not c.isalnum() else c for c in _pointer(path))
    mark = ' <abbr class=req title="required">*</abbr>' if required else ""
    description = schema.get("description") or schema.get("title") or ""
    hint_id = ident + "-hint"
    default = schema.get("default")
    hint_text = " ".join(filter(None, [
        str(description), f"default: {json.dumps(default)}" if "default" in schema else "",
        "one value per line" if kind == "lines" else "",
        "JSON" if kind == "json" else ""]))
    hint = f'<small id="{hint_id}" class=muted>{e(hint_text)}</small>' if hint_text else ""
    described = f' aria-describedby="{hint_id}"' if hint_text else ""
    aria = f'{described} aria-required="{"true" if required else "false"}"'
    if kind == "object":
        inner = _fields(schema, path, values, depth + 1)
        return (f'<fieldset class=nested><legend>{e(name)}{mark}</legend>{hint}{inner}'
                "</fieldset>")
    value = values[key] if key in values else _shown(default, kind)
    label = f'<label for="{ident}">{e(name)}{mark}</label>'
    if kind == "choice":
        unset = not (required and default is not None)
        options = ['<option value="">(unset)</option>'] if unset else []
        for v in _choices(schema) or ():
            encoded = json.dumps(v)
            chosen = " selected" if encoded == value else ""
            options.append(f'<option value="{e(encoded)}"{chosen}>'
                           f"{e(v if isinstance(v, str) else encoded)}</option>")
        control = f'<select id="{ident}" name="{e(key)}"{aria}>{"".join(options)}</select>'
    elif kind == "boolean":
        choices = "".join(f'<option value="{v}"{" selected" if v == value else ""}>{shown}'
                          "</option>"
                          for v, shown in (("", "(unset)"), ("true", "true"), ("false", "false")))
        control = f'<select id="{ident}" name="{e(key)}"{aria}>{choices}</select>'
    elif kind in ("lines", "json"):
        control = (f'<textarea id="{ident}" name="{e(key)}" rows=3 cols=60{aria}>'
                   f"{e(value)}</textarea>")
    else:
        step = ' step="1"' if kind == "integer" else ' step="any"' if kind == "number" else ""
        kind_attr = "number" if kind in ("number", "integer") else "text"
        control = (f'<input id="{ident}" type={kind_attr}{step} name="{e(key)}" '
                   f'value="{e(value)}" size=40{aria}>')
    return f"<div class=field>{label} {control} {hint}</div>"


def form_input(schema: Mapping[str, Any], form: Mapping[str, str]) -> Any:
    """The input a submitted form means: its raw JSON when given, else the fields'
    values (empty optional fields left out). `FormProblem` names a field that is not a
    value of its type."""
    raw = form.get(RAW, "").strip()
    if raw:
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise FormProblem(f"raw JSON input: {exc}") from None
    if not isinstance(schema.get("properties"), dict):
        return {}
    return _object(schema, (), form, 0) or {}


def _object(schema: Mapping[str, Any], path: tuple[str, ...], form: Mapping[str, str],
            depth: int) -> dict[str, Any]:
    required = set(schema.get("required") or ())
    found: dict[str, Any] = {}
    for name, sub in schema.get("properties", {}).items():
        sub = sub if isinstance(sub, dict) else {}
        here = (*path, name)
        kind = _kind(sub, depth)
        if kind == "object":
            inner = _object(sub, here, form, depth + 1)
            if inner or name in required:
                found[name] = inner
            continue
        text = form.get(PREFIX + _pointer(here))
        if text is None or (text == "" and name not in required) or (
                kind != "string" and not text.strip()):
            continue
        found[name] = _value(sub, kind, text, "/".join(here))
    return found


def _value(schema: Mapping[str, Any], kind: str, text: str, where: str) -> Any:
    try:
        if kind == "string":
            return text
        if kind == "number":
            number = float(text)
            return int(number) if number.is_integer() and "." not in text and "e" not in (
                text.lower()) else number
        if kind == "integer":
            return int(text.strip())
        if kind == "boolean":
            return {"true": True, "false": False}[text]
        if kind in ("choice", "json"):
            return json.loads(text)
        items = schema.get("items") or {}
        item_kind = _kind(items, MAX_DEPTH)
        if item_kind == "choice":
            item_kind = "string" if _type(items) == "string" else "json"
        return [_value(items, item_kind, line.strip(), where)
                for line in text.splitlines() if line.strip()]
    except (ValueError, KeyError):
        raise FormProblem(f"{where}: {text.strip()[:80]!r} is not {_article(kind)}") from None


def _article(kind: str) -> str:
    return {"integer": "a whole number", "number": "a number", "boolean": "true or false",
            "json": "JSON", "choice": "one of the choices"}.get(kind, f"a valid {kind}")

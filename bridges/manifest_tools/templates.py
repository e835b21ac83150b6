"""`{field}` placeholders in manifest templates: URLs, header values, argv elements, shell commands.
Imports nothing of ours; exports `Template`, `RenderError`, `value_text`, `render_*`, checks.

Syntax: `{name}` (a name is `[A-Za-z_][A-Za-z0-9_-]*`) is a placeholder for the input field
`name`; `{{` and `}}` are literal braces; any other brace text (`{'a': 1}`, `{print $1}`) is
literal. A value becomes text (`value_text`): a string as is; `true`/`false`; numbers, arrays
and objects as compact JSON. Each target then applies its own safety rule:

- URL: percent-encoded with nothing kept (`/ ? & # %`); a value made only of dots is encoded
  too, so `..` can never become a path segment.
- argv: one element stays one argument (no shell, no splitting); an element that is exactly
  `{name}` with an array value becomes one argument per item; an absent (or null) field's
  element is left out.
- shell: the value is never part of the script (a positional parameter, `shell_slots`).
- header: the text as is; CR, LF and NUL are refused; a header whose field is absent is left out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

Encoder = Callable[[str, Any], str]
"""(field name, value) -> the text that replaces the placeholder"""

_TOKEN = re.compile(r"\{\{|\}\}|\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_CONTROL = re.compile(r"[\r\n\x00]")


class RenderError(Exception):
    """An input value cannot be placed into a template; the message says which and why."""


@dataclass(frozen=True, slots=True)
class Slot:
    """One `{name}` placeholder."""

    name: str


@dataclass(frozen=True, slots=True)
class Template:
    """A parsed template: literal text and slots, in order."""

    source: str
    parts: tuple[str | Slot, ...]

    @classmethod
    def parse(cls, source: str) -> Template:
        parts: list[str | Slot] = []
        literal: list[str] = []
        pos = 0
        for match in _TOKEN.finditer(source):
            literal.append(source[pos : match.start()])
            token = match.group(0)
            if token == "{{":
                literal.append("{")
            elif token == "}}":
                literal.append("}")
            else:
                parts.append("".join(literal))
                literal = []
                parts.append(Slot(match.group(1)))
            pos = match.end()
        literal.append(source[pos:])
        parts.append("".join(literal))
        return cls(source, tuple(p for p in parts if p != ""))

    @property
    def fields(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.name for p in self.parts if isinstance(p, Slot)))

    @property
    def single_slot(self) -> Slot | None:
        """The slot when the template is exactly one placeholder, else None."""
        if len(self.parts) == 1 and isinstance(self.parts[0], Slot):
            return self.parts[0]
        return None

    def literal_prefix(self) -> str:
        """The literal text before the first slot."""
        prefix = []
        for part in self.parts:
            if isinstance(part, Slot):
                break
            prefix.append(part)
        return "".join(prefix)

    def render(self, values: Mapping[str, Any], encode: Encoder) -> str:
        out = []
        for part in self.parts:
            if isinstance(part, Slot):
                out.append(encode(part.name, values[part.name]))
            else:
                out.append(part)
        return "".join(out)


def value_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _present(values: Mapping[str, Any], name: str) -> bool:
    return values.get(name) is not None


# --- URLs -----------------------------------------------------------------------------------


def url_component(name: str, value: Any) -> str:
    if value is None:
        raise RenderError(f"input field {name!r} is null; the URL needs a value")
    text = value_text(value)
    if text and text.strip(".") == "":
        return "%2E" * len(text)
    return quote(text, safe="")


def authority_end(source: str) -> int:
    """Index where the scheme and authority of a URL template end (-1 if there is no `://`)."""
    start = source.find("://")
    if start == -1:
        return -1
    ends = [i for i in (source.find(c, start + 3) for c in "/?#") if i != -1]
    return min(ends) if ends else len(source)


def render_url(template: Template, values: Mapping[str, Any]) -> str:
    return template.render(values, url_component)


# --- argv -----------------------------------------------------------------------------------


def argv_text(name: str, value: Any) -> str:
    if isinstance(value, list | dict):
        raise RenderError(
            f"input field {name!r} is an array or object; only an argv element that is exactly "
            f"{{{name}}} can take an array"
        )
    return no_nul(name, value_text(value))


def no_nul(name: str, text: str) -> str:
    if "\x00" in text:
        raise RenderError(f"input field {name!r} contains a NUL character, which no argument "
                          "can carry")
    return text


def render_argv(templates: tuple[Template, ...], values: Mapping[str, Any]) -> list[str]:
    argv: list[str] = []
    for template in templates:
        if not all(_present(values, name) for name in template.fields):
            continue
        slot = template.single_slot
        if slot is not None and isinstance(values[slot.name], list):
            argv.extend(argv_text(slot.name, item) for item in values[slot.name])
            continue
        argv.append(template.render(values, argv_text))
    return argv


# --- shell ----------------------------------------------------------------------------------


def quoted_slots(template: Template) -> list[str]:
    """Names of slots that stand inside single or double quotes (or after a backslash)."""
    inside: list[str] = []
    state = ""  # "", "'" or '"'
    escaped = False
    for part in template.parts:
        if isinstance(part, Slot):
            if state or escaped:
                inside.append(part.name)
            escaped = False
            continue
        for char in part:
            if escaped:
                escaped = False
            elif state == "'":
                state = "" if char == "'" else state
            elif char == "\\":
                escaped = True
            elif state == '"':
                state = "" if char == '"' else state
            elif char in "'\"":
                state = char
    return inside


# --- headers --------------------------------------------------------------------------------


def _header_text(name: str, value: Any) -> str:
    text = value_text(value)
    if _CONTROL.search(text):
        raise RenderError(f"input field {name!r} contains CR, LF or NUL, which a header value "
                          "cannot carry")
    return text


def render_headers(
    templates: Mapping[str, Template], values: Mapping[str, Any]
) -> Iterator[tuple[str, str]]:
    for header, template in templates.items():
        if all(_present(values, name) for name in template.fields):
            yield header, template.render(values, _header_text)

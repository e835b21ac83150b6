"""Where each `{name}` of a `shell = true` command stands, as `/bin/sh` will parse the script.
Imports `bridges.manifest_tools.templates`; exports `place_slots` (each slot's context, or why
a manifest may not put one there: its docstring), `render_shell` and `SlotPlacement`.

Values never become shell source: each slot is replaced by a positional parameter (`"${1}"`,
`"${2}"`, ...) and the values are passed as the arguments after the script
(`/bin/sh -c SCRIPT sh VALUE...`). The shell expands a parameter once and never re-parses the
result, so `$(...)`, backquotes, `;` or a line `EOF` inside a value are only text, in a
heredoc as anywhere else. Contexts that run a value by design (`eval {x}`, `sh -c {x}`) are
the manifest author's choice and are not detected.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from bridges.manifest_tools.templates import (
    RenderError,
    Slot,
    Template,
    argv_text,
    no_nul,
    value_text,
)

SlotContext = Literal["word", "heredoc"]

_WORD_END = " \t\n;|&<>()"


@dataclass(frozen=True, slots=True)
class SlotPlacement:
    """The slots of a template in order: each one's context, or the reason it is refused."""

    contexts: tuple[SlotContext, ...]
    problems: tuple[str, ...]


@dataclass(slots=True)
class _Heredoc:
    delimiter: str
    quoted: bool
    strip_tabs: bool


def _items(template: Template) -> Iterator[str | Slot]:
    for part in template.parts:
        if isinstance(part, Slot):
            yield part
        else:
            yield from part


def place_slots(template: Template) -> SlotPlacement:
    """Classify every slot of a shell command template: how it is written, by context,

        word        unquoted shell text (also inside `$(...)`, backquotes, `${...}`)  ->  "${N}"
        heredoc     a line of a heredoc whose delimiter is unquoted (`<<EOF`), where double
                    quotes would be literal text                                        ->  ${N}

    and which contexts a manifest may not use (reported by `sidecar check` and at load):

    - inside single or double quotes, or after a backslash (`quoted_slots`: the value already
      arrives as one word);
    - in a heredoc whose delimiter is quoted (`<<'EOF'`): nothing is expanded there;
    - in a heredoc delimiter, right after `$` (`${name}` is a placeholder, not a variable), or
      inside arithmetic (`$((...))`, `((...))`), where shells such as bash evaluate the value
      of a parameter as an expression, subscripts and command substitutions included.
    """
    items = list(_items(template))
    contexts: list[SlotContext] = []
    problems: list[str] = []
    frames: list[str] = []  # "'", '"', "$(", "`", "${", "$((": the innermost last
    pending: list[_Heredoc] = []  # heredocs whose bodies start after the next newline
    body: _Heredoc | None = None
    line: list[str | Slot] = []
    word_start = True
    i = 0

    def refuse(slot: Slot, why: str) -> None:
        problems.append(f"placeholder {{{slot.name}}} {why}")
        contexts.append("word")

    while i < len(items):
        item = items[i]
        top = frames[-1] if frames else ""
        if isinstance(item, Slot) and i > 0 and items[i - 1] in ("$", "\\") and top != "'":
            after = "'$': write ${...} for a shell variable, or leave a space"
            if items[i - 1] == "\\":
                after = "a backslash"
            if items[i - 1] == "$" and _escaped(items, i - 1):
                after = ""
            if after and not (items[i - 1] == "\\" and body is None):
                refuse(item, f"follows {after}")
                line.append(item)
                i += 1
                continue
        if body is not None and top not in ("$(", "`"):  # a line of a heredoc
            if isinstance(item, Slot):
                if body.quoted:
                    refuse(item, f"stands in a heredoc with a quoted delimiter "
                                 f"(<<'{body.delimiter}'), where nothing is expanded")
                else:
                    contexts.append("heredoc")
                line.append(item)
            elif item == "\n":
                text = "".join(c for c in line if isinstance(c, str))
                done = all(isinstance(c, str) for c in line) and (
                    (text.lstrip("\t") if body.strip_tabs else text) == body.delimiter)
                line = []
                if done:
                    body = pending.pop(0) if pending else None
                    word_start = True
            elif not body.quoted and item == "$" and _next(items, i) == "(":
                frames.append("$(")
                line.append(item)
                i += 1
            elif not body.quoted and item == "`":
                frames.append("`")
                line.append(item)
            else:
                line.append(item)
            i += 1
            continue
        if isinstance(item, Slot):
            if top in ("'", '"'):
                contexts.append("word")  # refused by `quoted_slots`, with its own message
            elif top == "$((":
                refuse(item, "stands inside arithmetic, where a shell may evaluate its value "
                             "as an expression; compute it in the command instead")
            else:
                contexts.append("word")
            word_start = False
            i += 1
            continue
        char = item
        if top == "'":
            if char == "'":
                frames.pop()
        elif char == "\\":
            i += 1  # the next item is escaped (a slot after it is refused by quoted_slots)
            if i < len(items) and isinstance(items[i], Slot):
                contexts.append("word")
            word_start = False
        elif top == '"' and char == '"':
            frames.pop()
        elif top == "`" and char == "`":
            frames.pop()
        elif char == "$" and _next(items, i) == "(":
            if _next(items, i + 1) == "(":
                frames.append("$((")
                i += 2
            else:
                frames.append("$(")
                i += 1
        elif char == "$" and _next(items, i) == "{":
            frames.append("${")
            i += 1
        elif top == "${" and char == "}":
            frames.pop()
        elif top == "$((" and char == ")" and _next(items, i) == ")":
            frames.pop()
            i += 1
        elif top == "$(" and char == ")":
            frames.pop()
        elif top == '"':
            pass
        elif char in "'\"`":
            frames.append(char)
        elif char == "(" and _next(items, i) == "(" and word_start:
            frames.append("$((")  # `((...))`: arithmetic too
            i += 1
        elif char == "#" and word_start:  # a comment: its slots are never expanded
            while i + 1 < len(items) and items[i + 1] != "\n":
                i += 1
                if isinstance(items[i], Slot):
                    contexts.append("word")
        elif char == "<" and _next(items, i) == "<" and _next(items, i + 1) != "<":
            i, heredoc = _heredoc_operator(items, i + 2, problems, contexts)
            if heredoc is not None:
                pending.append(heredoc)
            word_start = False
            continue
        elif char == "\n" and pending and not frames:
            body = pending.pop(0)
        word_start = char in _WORD_END
        i += 1
    return SlotPlacement(tuple(contexts), tuple(problems))


def _next(items: list[str | Slot], i: int) -> str | Slot | None:
    return items[i + 1] if i + 1 < len(items) else None


def _escaped(items: list[str | Slot], i: int) -> bool:
    backslashes = 0
    while i - 1 - backslashes >= 0 and items[i - 1 - backslashes] == "\\":
        backslashes += 1
    return backslashes % 2 == 1


def _heredoc_operator(
    items: list[str | Slot], i: int, problems: list[str], contexts: list[SlotContext]
) -> tuple[int, _Heredoc | None]:
    """Read `[-] [blanks] WORD` after `<<`; (index after it, the heredoc or None)."""
    strip_tabs = i < len(items) and items[i] == "-"
    i += strip_tabs
    while i < len(items) and items[i] in (" ", "\t"):
        i += 1
    word: list[str] = []
    quoted = False
    while i < len(items):
        item = items[i]
        if isinstance(item, Slot):
            problems.append(f"placeholder {{{item.name}}} stands in a heredoc delimiter")
            contexts.append("word")
            quoted = True
        elif item in _WORD_END:
            break
        elif item in "'\"\\":
            quoted = True
        else:
            word.append(item)
        i += 1
    if not word and not quoted:
        return i, None
    return i, _Heredoc("".join(word), quoted, strip_tabs)


def render_shell(
    template: Template, values: Mapping[str, Any], placement: SlotPlacement | None = None
) -> tuple[str, list[str]]:
    """(script, arguments) for `/bin/sh -c script sh arguments...`: each slot becomes a
    reference to its value's positional parameter, written for its context; an array value
    becomes one parameter per item. A null or absent value is one empty parameter."""
    placement = placement if placement is not None else place_slots(template)
    if placement.problems:
        raise RenderError(placement.problems[0])
    script: list[str] = []
    arguments: list[str] = []
    contexts = iter(placement.contexts)
    for part in template.parts:
        if not isinstance(part, Slot):
            script.append(part)
            continue
        context = next(contexts)
        value = values.get(part.name)
        if isinstance(value, list):
            texts = [argv_text(part.name, item) for item in value]
        else:
            texts = ["" if value is None else no_nul(part.name, value_text(value))]
        references = []
        for text in texts:
            arguments.append(text)
            number = len(arguments)
            references.append(f'"${{{number}}}"' if context == "word" else f"${{{number}}}")
        script.append(" ".join(references))
    return "".join(script), arguments

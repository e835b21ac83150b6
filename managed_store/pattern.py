"""Grep patterns: RE2 syntax, matched in time linear in the text.

Python's `re` backtracks: `(a+)+$` on a 28-character line, or `^(\\w+\\s?)*$` on an ordinary
sentence, runs for tens of seconds while holding the interpreter lock, so every other request
of the daemon waits. RE2 (the `google-re2` package) never backtracks: a search costs
O(pattern size x line length) at worst, whatever the pattern. The price is syntax RE2 does not
have: backreferences (`\\1`), lookaround (`(?=`, `(?!`, `(?<=`, `(?<!`) and possessive or
atomic groups (`a++`, `(?>`). Those are refused with a `ValueError` naming the construct.

Patterns are compiled from UTF-8 and matched against the stored bytes of each line, so a line
is decoded only when it is shown.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import re2

MAX_PATTERN_CHARS = 4096
# RE2's own memory budget for one compiled pattern (its default is 8 MiB); a pattern whose
# automaton needs more is refused as too large instead of being compiled.
_MAX_PROGRAM_BYTES = 8 * 1024 * 1024


class InvalidPattern(ValueError):
    """The pattern is too long, not valid, or uses syntax RE2 does not support."""


@dataclass(frozen=True, slots=True)
class LinePattern:
    """A compiled pattern; `matches(line)` searches one line's UTF-8 bytes anywhere."""

    source: str
    _regexp: Any

    def matches(self, line: bytes) -> bool:
        return self._regexp.search(line) is not None


def check_pattern(pattern: object) -> str:
    """Cheap checks that may run on the event loop: type and length."""
    if not isinstance(pattern, str):
        raise TypeError(f"grep pattern must be str, not {type(pattern).__name__}")
    if len(pattern) > MAX_PATTERN_CHARS:
        raise InvalidPattern(
            f"invalid grep pattern: {len(pattern):,} characters, the limit is "
            f"{MAX_PATTERN_CHARS:,}"
        )
    return pattern


def compile_pattern(pattern: str) -> LinePattern:
    """Compile `pattern` (after `check_pattern`). Costs up to milliseconds for long patterns:
    call it off the event loop."""
    options = re2.Options()
    options.log_errors = False  # RE2 would print every refused pattern to stderr
    options.never_capture = True  # only "does it match" is asked: the fastest engine
    options.max_mem = _MAX_PROGRAM_BYTES
    try:
        encoded = pattern.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidPattern("invalid grep pattern: it is not valid Unicode") from None
    try:
        regexp = re2.compile(encoded, options)
    except re2.error as exc:
        raise InvalidPattern(f"invalid grep pattern {_shown(pattern)}: {_reason(exc)}") from None
    return LinePattern(pattern, regexp)


def _reason(exc: Exception) -> str:
    raw = exc.args[0] if exc.args else ""
    reason = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else str(raw)
    for construct, name in _UNSUPPORTED:
        if construct in reason:
            return (f"{reason} ({name} is not supported: patterns use RE2 syntax, which "
                    "matches in linear time)")
    return reason


# RE2's messages for syntax it leaves out on purpose, and what to call that syntax.
_UNSUPPORTED: tuple[tuple[str, str], ...] = (
    *((f"invalid escape sequence: \\{digit}", "a backreference") for digit in range(1, 10)),
    ("invalid perl operator: (?P", "a named backreference"),
    ("invalid perl operator: (?=", "lookahead"),
    ("invalid perl operator: (?!", "negative lookahead"),
    ("invalid perl operator: (?<", "lookbehind"),
    ("invalid perl operator: (?>", "an atomic group"),
    ("bad repetition operator: ++", "a possessive quantifier"),
    ("bad repetition operator: *+", "a possessive quantifier"),
    ("bad repetition operator: ?+", "a possessive quantifier"),
)


def _shown(pattern: str) -> str:
    shown = repr(pattern)
    return shown if len(shown) <= 80 else shown[:77] + "..."

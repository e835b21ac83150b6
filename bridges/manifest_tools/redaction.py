"""Keep manifest secrets out of the error messages and excerpts manifest tools produce.

The secrets of a tool are the literal parts of its header values and its `env` values (after
`${env:VAR}` interpolation), plus the values of the variables it takes from the daemon
(`env_allow`). A header value such as `Bearer abc...` is also redacted word by word, so the
token alone is caught. Short values are left alone: masking `cat` or `1` everywhere protects
nothing and garbles text. Successful content is never rewritten: it is the tool's result.
"""

from __future__ import annotations

from collections.abc import Iterable

from bridges.manifest_tools.templates import Slot, Template

MIN_SECRET_CHARS = 6
MIN_WORD_CHARS = 8
MASK = "***"


class Redactor:
    __slots__ = ("_secrets",)

    def __init__(self, values: Iterable[str] = (), words_of: Iterable[str] = ()) -> None:
        found = {v for v in values if len(v) >= MIN_SECRET_CHARS}
        for value in words_of:
            found.update(w for w in value.split() if len(w) >= MIN_WORD_CHARS)
        self._secrets = tuple(sorted(found, key=len, reverse=True))

    @classmethod
    def for_headers(cls, headers: Iterable[str]) -> Redactor:
        literals = [
            part
            for value in headers
            for part in Template.parse(value).parts
            if not isinstance(part, Slot)
        ]
        return cls(literals, literals)

    def __call__(self, text: str) -> str:
        for secret in self._secrets:
            if secret in text:
                text = text.replace(secret, MASK)
        return text

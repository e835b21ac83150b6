"""The `redacted` audit copy of a call's input: secret-looking and configured keys masked, JSON
text parsed before it is redacted, long strings cut. Imports only `sidecar.model.json_depth`;
exports `redact`, `Redaction`, `key_words`, `is_secret_key` and the word lists.

Which keys are secrets: `is_secret_key`; how JSON text and long strings are treated: `redact`.
Masking errs on the side of too much (`max_tokens` is masked too). Where the word lists come
from: sidecar/model/README.md.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable, Mapping
from typing import Any

from sidecar.model import json_depth

SECRET_SUBSTRINGS = (
    "password", "passwd", "passphrase", "passcode", "secret", "token", "credential",
    "authorization", "cookie", "apikey", "privatekey", "privkey", "accesskey", "sessionkey",
    "authkey", "clientkey", "servicekey", "accountkey", "signingkey", "encryptionkey",
    "masterkey", "databasekey", "dbkey", "dbpass", "databasepass", "keypass", "contrasena",
    "contraseña",
)
"""Masked wherever they occur in a key's joined words."""
SECRET_WORDS = frozenset({"auth", "pass", "pwd", "pw", "bearer", "jwt", "otp"})
"""Masked when they are one of a key's words."""
MASK = "***"
MAX_STRING = 256
"""A longer string is cut to this many characters and says how long it was."""
MAX_PARSED = 64 * 1024
"""JSON text up to this many characters is parsed and redacted; longer text is not kept."""
_MAX_VERDICTS = 4096

_HUMPS = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+|[^\W\d_]+")
"""camelCase, PascalCase and acronyms (`APIKey` -> API, Key); letters of any script."""
_JSON_START = re.compile(r"\s*[\[{]")
"""Text that may hold a JSON object or array (only its leading blanks are read)."""


def key_words(key: str) -> tuple[str, ...]:
    """The words of a key name, case folded: `X-Api-Key` -> ('x', 'api', 'key')."""
    text = unicodedata.normalize("NFKC", key)
    return tuple(word.casefold() for word in _HUMPS.findall(text))


def is_secret_key(key: str, mask: Iterable[str] = ()) -> bool:
    """Whether `key` looks like it names a secret, or is one of `mask` once both are normalised
    (`customer_id` matches `customerId`).

    A key is read as words (`key_words`): NFKC and case folded, split at `-`, `_`, `.`, spaces,
    camelCase humps and digits, so `X-Api-Key`, `x_api_key` and `xApiKey` all read `x api key`
    (`XAPIKey` reads `xapi key`: an acronym run cannot be split; joined, it matches). It is a
    secret when its words joined (`xapikey`) contain one of `SECRET_SUBSTRINGS`: words long and
    distinctive enough to match inside another word (`password`, `apikey`, `privatekey`, ...),
    or when one of its words is one of `SECRET_WORDS`: short words that only mean a secret on
    their own (`auth`, `pass`, `pwd`, `bearer`; `author` and `passage` are kept).
    """
    return Redaction(mask).secret(key)


def redact(value: Any, mask: Iterable[str] = ()) -> Any:
    """`value` with secret-looking and `mask` keys masked, JSON text redacted and long strings
    cut: a copy where something changed, else `value` itself (and its unchanged parts).

    A string holding a JSON object or array (the OpenAI `arguments` form, or a field that
    carries a JSON document) is parsed and redacted: at the top level the copy is the parsed
    value (the seam parses it the same way before the tool sees it); inside a value, the text
    is re-encoded when something in it was masked. JSON text longer than `MAX_PARSED` is not
    parsed and not kept (a note says how long it was), since its first 256 characters may hold
    a secret. Other strings longer than `MAX_STRING` are cut.
    """
    return Redaction(mask).copy(value)


class Redaction:
    """One setting's redaction: the normalised mask and a bounded cache of key verdicts (keys
    repeat from call to call)."""

    __slots__ = ("_mask", "_verdicts")

    def __init__(self, mask: Iterable[str] = ()) -> None:
        self._mask = frozenset("".join(key_words(field)) for field in mask)
        self._verdicts: dict[str, bool] = {}

    def copy(self, value: Any) -> Any:
        """The redacted copy of a call's input (a top-level JSON text becomes its value)."""
        if isinstance(value, str) and _JSON_START.match(value):
            parsed = self._parsed(value)
            return self._value(parsed) if isinstance(parsed, dict | list) else _cut(parsed)
        return self._value(value)

    def secret(self, key: Any) -> bool:
        """Whether `key` is masked: it looks like a secret or is a `mask` field."""
        text = key if type(key) is str else str(key)
        verdict = self._verdicts.get(text)
        if verdict is None:
            words = key_words(text)
            joined = "".join(words)
            verdict = joined in self._mask or any(w in SECRET_WORDS for w in words) or any(
                part in joined for part in SECRET_SUBSTRINGS)
            if len(self._verdicts) >= _MAX_VERDICTS:
                self._verdicts.clear()
            self._verdicts[text] = verdict
        return verdict

    def _parsed(self, text: str) -> Any:
        """The value of JSON text (`text` itself when it is not JSON), or a note when it is
        too long to parse here."""
        if len(text) > MAX_PARSED:
            return f"(JSON text of {len(text)} characters, not kept)"
        try:
            return json_depth.loads(text)
        except ValueError:
            return text

    def _value(self, value: Any) -> Any:
        if isinstance(value, str):
            return self._string(value)
        if isinstance(value, Mapping):
            return self._mapping(value)
        if isinstance(value, list):
            items = [self._value(item) for item in value]
            if type(value) is list and all(a is b for a, b in zip(items, value, strict=True)):
                return value
            return items
        return value

    def _mapping(self, value: Mapping[Any, Any]) -> Any:
        out: dict[str, Any] = {}
        same = type(value) is dict
        for key, item in value.items():
            if self.secret(key):
                out[str(key)] = MASK
                same = False
                continue
            kept = self._value(item)
            out[str(key)] = kept
            same = same and kept is item and type(key) is str
        return value if same else out

    def _string(self, value: str) -> str:
        if _JSON_START.match(value):
            parsed = self._parsed(value)
            if isinstance(parsed, str):
                value = parsed
            elif isinstance(parsed, dict | list):
                redacted = self._value(parsed)
                if redacted is not parsed:
                    value = json.dumps(redacted, ensure_ascii=False, separators=(",", ":"))
        return _cut(value)


def _cut(value: str) -> str:
    if len(value) > MAX_STRING:
        return value[:MAX_STRING] + f"... ({len(value)} characters)"
    return value

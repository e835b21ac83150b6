"""Managed references: the only handle a caller ever gets to a stored text.

An id is `m_` followed by 26 characters from `[0-9a-z]` (about 134 random bits). It is neither
a path nor a hash of the content, so it reveals nothing and cannot be forged into a path.
"""

from __future__ import annotations

import re
import secrets
from dataclasses import dataclass

from managed_store.errors import InvalidRef

REF_ID_PATTERN = re.compile(r"m_[0-9a-z]{26}", re.ASCII)
_ALPHABET = "0123456789abcdefghijklmnopqrstuvwxyz"
_ID_LENGTH = 26
# Long junk is cut in error messages so a hostile id cannot flood a log or a model context.
_SHOWN_CHARS = 60


@dataclass(frozen=True, slots=True)
class ManagedRef:
    """One stored text.

    `size_bytes` is its UTF-8 length; `lines` counts lines as an editor does (`"a\\nb"` and
    `"a\\nb\\n"` both have 2, `""` has 0; only `\\n` separates lines); `created_at` is a Unix
    timestamp taken when the object became visible.
    """

    id: str
    size_bytes: int
    lines: int
    created_at: float
    namespace: str


def new_ref_id() -> str:
    """A fresh random id matching `REF_ID_PATTERN`."""
    return "m_" + "".join(secrets.choice(_ALPHABET) for _ in range(_ID_LENGTH))


def validate_ref_id(value: object) -> str:
    """Return `value` if it is a well-formed id, else raise `InvalidRef`.

    Checked with `fullmatch` on ASCII classes, so trailing newlines, NUL, `/`, `..` and Unicode
    look-alike digits or letters are all refused.
    """
    if isinstance(value, str) and REF_ID_PATTERN.fullmatch(value):
        return value
    shown = repr(value)
    if len(shown) > _SHOWN_CHARS:
        shown = shown[:_SHOWN_CHARS] + "…"
    raise InvalidRef(f"invalid managed ref {shown}: expected 'm_' followed by 26 of [0-9a-z]")

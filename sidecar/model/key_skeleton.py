"""What an argument name looks like, for telling a near-copy of a name from the name itself.

`skeleton(name)` folds away what a reader (or an upstream that matches names loosely) does
not tell apart: compatibility forms (NFKC: full-width letters, ligatures), case, whitespace
and invisible format characters (zero-width spaces), and characters of other scripts that
look like Latin ones (Cyrillic U+0435 for `e`, Greek U+03BF for `o`). The look-alikes come
from Unicode's confusables table as the `confusable-homoglyphs` package keeps it: thousands of
pairs that Unicode revises, better taken from a maintained package than copied here. It is
loaded on the first name that is not ASCII. Imports nothing of the daemon.
"""

from __future__ import annotations

import functools
import unicodedata


def skeleton(name: str) -> str:
    """`name` folded as the module docstring says; two names with one skeleton differ only
    by case, whitespace, invisible characters or look-alikes."""
    folded = unicodedata.normalize("NFKC", name).casefold()
    return "".join(_latin(ch) for ch in folded
                   if not ch.isspace() and unicodedata.category(ch) != "Cf")


@functools.lru_cache(maxsize=4096)
def _latin(ch: str) -> str:
    if ch.isascii():
        return ch
    from confusable_homoglyphs import confusables

    found = confusables.is_confusable(ch, preferred_aliases=["latin"])
    for match in found or ():
        for glyph in match["homoglyphs"]:
            if glyph["c"].isascii():
                return str(glyph["c"]).casefold()
    return ch

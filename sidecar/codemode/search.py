"""Ranked search over the Code Mode catalog (the `search_tools` built-in).

Scoring, simple on purpose so a model can predict it:

1. Text is split into lowercase word tokens (on anything not a letter or digit, and between
   camelCase humps): `readFile_v2` -> `read`, `file`, `v2`.
2. Each tool has four fields, weighted: name and Python path 3, title 2, parameter names
   (top-level input properties) 1.5, description 1.
3. Each query token scores the weight of the best field holding it: an equal token counts
   fully; when one is a prefix of the other and the shorter has at least 4 characters
   (`issue` ~ `issues`, `read` ~ `reading`) it counts half. A tool's score is the sum over
   the query's distinct tokens.
4. A query found whole inside a tool's name or path adds 2.
5. Tools scoring above 0 are ranked by score, then name. An empty query or `*` lists every
   tool by name.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from sidecar.codemode.catalog import Catalog, CatalogTool

NAME_WEIGHT = 3.0
TITLE_WEIGHT = 2.0
PARAMETER_WEIGHT = 1.5
DESCRIPTION_WEIGHT = 1.0
WHOLE_QUERY_BONUS = 2.0
_PREFIX = 4

_WORD = re.compile(r"[A-Za-z0-9]+")
_HUMP = re.compile(r"[A-Z]?[a-z0-9]+|[A-Z]+(?![a-z])")


def tokens(text: str) -> list[str]:
    found: list[str] = []
    for word in _WORD.findall(text):
        found.extend(h.lower() for h in _HUMP.findall(word) or [word])
    return found


@dataclass(frozen=True, slots=True)
class SearchHit:
    tool: CatalogTool
    score: float


def _fields(tool: CatalogTool) -> list[tuple[float, frozenset[str]]]:
    definition = tool.definition
    properties = definition.input_schema.get("properties")
    parameters = " ".join(properties) if isinstance(properties, dict) else ""
    return [
        (NAME_WEIGHT, frozenset(tokens(f"{tool.name} {'.'.join(tool.path or ())}"))),
        (TITLE_WEIGHT, frozenset(tokens(definition.title or ""))),
        (PARAMETER_WEIGHT, frozenset(tokens(parameters))),
        (DESCRIPTION_WEIGHT, frozenset(tokens(definition.description))),
    ]


def _token_score(token: str, fields: list[tuple[float, frozenset[str]]]) -> float:
    best = 0.0
    for weight, words in fields:
        if token in words:
            best = max(best, weight)
        elif any(
            min(len(w), len(token)) >= _PREFIX and (w.startswith(token) or token.startswith(w))
            for w in words
        ):
            best = max(best, weight / 2)
    return best


def _score(tool: CatalogTool, fields: list[tuple[float, frozenset[str]]], query: str) -> float:
    wanted = list(dict.fromkeys(tokens(query)))
    total = sum(_token_score(t, fields) for t in wanted)
    whole = query.strip().lower()
    path = ".".join(tool.path or ()).lower()
    if total > 0 and whole and (whole in tool.name.lower() or whole in path):
        total += WHOLE_QUERY_BONUS
    return total


class SearchIndex:
    """The tokenized fields of a catalog, built once, searched many times."""

    __slots__ = ("_catalog", "_fields")

    def __init__(self, catalog: Catalog) -> None:
        self._catalog = catalog
        self._fields = [(tool, _fields(tool)) for tool in catalog.tools]

    def search(self, query: str, limit: int) -> tuple[list[SearchHit], int]:
        """The best `limit` hits and how many tools matched at all."""
        if query.strip() in ("", "*"):
            every = [SearchHit(t, 0.0) for t in self._catalog.tools]
            return every[:limit], len(every)
        hits = [SearchHit(t, s) for t, f in self._fields if (s := _score(t, f, query)) > 0]
        hits.sort(key=lambda h: (-h.score, h.tool.name))
        return hits[:limit], len(hits)


def search(catalog: Catalog, query: str, limit: int) -> tuple[list[SearchHit], int]:
    """One-off search (builds an index each time; keep a `SearchIndex` to search often)."""
    return SearchIndex(catalog).search(query, limit)

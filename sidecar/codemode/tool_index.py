"""The BM25 index behind tool search (`expose = "search"`): `ToolIndex` ranks the tools of one
set of entries, `ToolIndexes` keeps the recent ones and builds new ones off the event loop.

A tool is one BM25F-style document in one `bm25s` index: its fields' terms, each field repeated
`FIELD_WEIGHTS` times (name 3, title 2, parameters, description, its first sentence, server 1),
so term frequency saturates and lengths normalise over the whole tool. Text is split into words and
identifier parts (`sidecar.codemode.search.tokens`: snake_case, kebab-case, camelCase),
lowercased, English stop words dropped (NLTK's list as bm25s ships it, plus ours) and stemmed by
Snowball's English stemmer (PyStemmer); a query also searches, at half weight, the words of a
small developer glossary (`SYNONYMS`).

A registry change (a server's `list_changed`, a reload) gives new entries; the next index
tokenizes only the definitions it has not seen, then recomputes the BM25 statistics, in a worker
thread. Imports `sidecar.registry`, its `sidecar.codemode` siblings, `bm25s` and `Stemmer`.
Exports `ToolIndex`, `ToolIndexes`, `FIELD_WEIGHTS`, `stem`, `query_terms`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN_PLUS

from sidecar.codemode.search import tokens
from sidecar.registry.registry import Entry, ToolDefinition

log = logging.getLogger("sidecar.codemode.tool_index")

FIELDS = ("name", "title", "parameters", "description", "summary", "server")
FIELD_WEIGHTS: Mapping[str, int] = {
    "name": 3, "title": 2, "parameters": 1, "description": 1, "summary": 1, "server": 1,
}
"""How many times each field's terms stand in a tool's document. `summary` is the description's
first sentence (what the tool does; the rest is usually how to call it): counted twice."""
STOP_WORDS = frozenset(STOPWORDS_EN_PLUS) | frozenset(
    "could get let like please use used using want would".split()
)
"""Dropped from queries and documents (`get` too: nearly every tool gets something)."""
SYNONYMS: Mapping[str, tuple[str, ...]] = {
    "pr": ("pull", "request"), "mr": ("merge", "request"), "repo": ("repository",),
    "folder": ("directory",), "dir": ("directory",), "rename": ("move",),
    "bug": ("issue",), "ticket": ("issue",), "history": ("log",), "stage": ("add",),
    "remember": ("memory", "observation", "entity"), "forget": ("delete",),
    "drive": ("direction",), "route": ("direction",), "altitude": ("elevation",),
    "high": ("elevation",), "visit": ("navigate",), "go": ("navigate",),
    "alert": ("watch",), "notify": ("watch",), "replace": ("edit",), "change": ("edit",),
    "find": ("search",), "look": ("search",), "make": ("create",), "new": ("create",),
    "inside": ("read", "content"), "show": ("get", "read"), "check": ("status",),
    "ci": ("status",), "webpage": ("fetch", "url"), "page": ("url",), "add": ("sum",),
    "progress": ("transition",), "status": ("transition",),
}
"""A developer's glossary, applied to queries only (each term keeps its own weight, a
synonym half of it): what users say for what tools call it. Keyed by a query's word or its
stem. Written against the tuning tasks of bench/data/tool_search_tasks.json (not the
held-out ones): its figures there flatter it."""
SYNONYM_WEIGHT = 0.5
KEPT_INDEXES = 8
"""Indexes kept at once (one per profile and set of hidden tools in use)."""


_SNOWBALL = Stemmer.Stemmer("english")


def stem(word: str) -> str:
    """Snowball's English stem of `word` (`issues` -> `issu`, `listing` -> `list`), applied to
    queries and tools alike."""
    return str(_SNOWBALL.stemWord(word))


def query_terms(text: str) -> list[str]:
    """The index terms of `text`: tokens, stop words dropped, stemmed."""
    return [stem(t) for t in tokens(text) if t not in STOP_WORDS]


def _parameter_text(schema: Mapping[str, Any]) -> str:
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return ""
    parts: list[str] = []
    for key, value in properties.items():
        parts.append(str(key))
        if isinstance(value, Mapping) and isinstance(value.get("description"), str):
            parts.append(value["description"])
    return " ".join(parts)


def _server_of(entry: Entry) -> str:
    origin = entry.origin
    _, _, rest = origin.partition(":")
    return f"{rest or origin} {entry.tool.namespace or ''}"


_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _document(name: str, entry: Entry) -> tuple[list[str], ...]:
    d = entry.definition
    return (
        query_terms(name), query_terms(d.title or ""),
        query_terms(_parameter_text(d.input_schema)), query_terms(d.description),
        query_terms(_SENTENCE_END.split(d.description.strip(), maxsplit=1)[0]),
        query_terms(_server_of(entry)),
    )


@dataclass(frozen=True, slots=True)
class _Tokenized:
    definition: ToolDefinition
    origin: str
    fields: tuple[list[str], ...]


Signature = tuple[int, int, int]


def _signature(entries: Mapping[str, Entry]) -> Signature:
    """Names and definitions by identity: an index holds its definitions, so while it is kept
    no other definition can take one of their ids."""
    return len(entries), hash(tuple(entries)), hash(tuple(id(e.definition)
                                                           for e in entries.values()))


class ToolIndex:
    """The BM25 fields of one set of entries, built once (in a worker thread: `build`),
    searched many times. Immutable after `build`."""

    __slots__ = ("_retriever", "definitions", "names", "signature", "tokenized")

    def __init__(self, entries: Mapping[str, Entry], seen: Mapping[str, _Tokenized]) -> None:
        self.names = tuple(entries)
        self.definitions = tuple(e.definition for e in entries.values())
        self.signature = _signature(entries)
        tokenized: dict[str, _Tokenized] = {}
        for name, entry in entries.items():
            known = seen.get(name)
            if known is None or known.definition is not entry.definition or (
                known.origin != entry.origin
            ):
                known = _Tokenized(entry.definition, entry.origin, _document(name, entry))
            tokenized[name] = known
        self.tokenized: Mapping[str, _Tokenized] = tokenized
        self._retriever: bm25s.BM25 | None = None
        repeats = [FIELD_WEIGHTS[field] for field in FIELDS]
        corpus = [[term for times, words in zip(repeats, t.fields, strict=True)
                   for _ in range(times) for term in words] for t in tokenized.values()]
        if any(corpus):  # bm25s needs one term at least
            self._retriever = bm25s.BM25()
            self._retriever.index(corpus, show_progress=False)

    def search(
        self, query: str, limit: int, *, glossary: Mapping[str, tuple[str, ...]] = SYNONYMS,
    ) -> list[tuple[str, float]]:
        """The best `limit` (name, score) pairs for `query`, best first; ties by name.
        `glossary` is the query's synonyms (`SYNONYMS`; the benchmark also ranks without)."""
        words = [t for t in tokens(query) if t not in STOP_WORDS]
        terms = list(dict.fromkeys(stem(t) for t in words))
        retriever = self._retriever
        if not terms or retriever is None or limit <= 0:
            return []
        extra = [stem(s) for t in words for s in glossary.get(t, glossary.get(stem(t), ()))]
        synonyms = [s for s in dict.fromkeys(extra) if s not in terms]
        total = np.zeros(len(self.names), dtype=np.float32)
        for chosen, share in ((terms, 1.0), (synonyms, SYNONYM_WEIGHT)):
            known = [t for t in chosen if t in retriever.vocab_dict]
            if known:
                total += share * retriever.get_scores(known)
        found = np.flatnonzero(total > 0)
        if found.size > limit:
            found = found[np.argpartition(-total[found], limit - 1)[:limit]]
        ranked = sorted(found.tolist(), key=lambda i: (-float(total[i]), self.names[i]))
        return [(self.names[i], float(total[i])) for i in ranked[:limit]]


class ToolIndexes:
    """The recent indexes of one Location (the last `KEPT_INDEXES`), by the entries they
    cover; a missing one is built in a worker thread, once however many searches wait."""

    def __init__(self) -> None:
        self._kept: OrderedDict[Signature, ToolIndex] = OrderedDict()
        self._building: dict[Signature, asyncio.Task[ToolIndex]] = {}
        self._seen: Mapping[str, _Tokenized] = {}

    def ready(self, entries: Mapping[str, Entry]) -> ToolIndex | None:
        """The index of exactly `entries`, if built."""
        return self._kept.get(_signature(entries))

    async def index(self, entries: Mapping[str, Entry]) -> ToolIndex:
        """The index of `entries`, built off the event loop when it is not kept yet."""
        kept = self.ready(entries)
        if kept is not None:
            self._kept.move_to_end(kept.signature)
            return kept
        return await asyncio.shield(self._start(entries))

    def warm(self, entries: Mapping[str, Entry]) -> None:
        """Start building the index of `entries` now (a search-mode listing: the model's first
        search should not wait), when an event loop runs and it is not kept yet."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        if self.ready(entries) is None:
            self._start(entries)

    def _start(self, entries: Mapping[str, Entry]) -> asyncio.Task[ToolIndex]:
        key = _signature(entries)
        building = self._building.get(key)
        if building is not None:
            return building
        task = asyncio.get_running_loop().create_task(self._build(key, dict(entries)))
        self._building[key] = task
        return task

    async def _build(self, key: Signature, entries: Mapping[str, Entry]) -> ToolIndex:
        try:
            built = await asyncio.to_thread(ToolIndex, entries, self._seen)
        finally:
            self._building.pop(key, None)
        self._seen = {**self._seen, **built.tokenized} if len(self._seen) < 50_000 else dict(
            built.tokenized)
        self._kept[key] = built
        while len(self._kept) > KEPT_INDEXES:
            self._kept.popitem(last=False)
        log.debug("tool search index of %d tools built", len(built.names))
        return built


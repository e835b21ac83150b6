"""The index behind tool search (`expose = "search"`): `ToolIndex` ranks the tools of one set
of entries by words (BM25) and by meaning (embeddings), `ToolIndexes` keeps the recent ones and
builds new ones off the event loop.

Words: a tool is one BM25F-style document in one `bm25s` index, its fields' terms each repeated
`FIELD_WEIGHTS` times (name 3, title 2, parameters, description, its first sentence, server 1).
Text is split into words and identifier parts (`sidecar.codemode.search.tokens`), lowercased,
stop words dropped, stemmed by Snowball's English stemmer (PyStemmer); a query also searches, at
half weight, the words of a small developer glossary (`SYNONYMS`). Meaning: a tool's vector is
the sum of the embeddings (`sidecar.codemode.embedding`) of its name's words with its first
sentence and with its whole description. A tool scores a convex mix of the two, each scaled to
[0, 1] over the tools searched (`EMBEDDING_SHARE`); without the model, BM25 alone.

A registry change gives new entries; the next index tokenizes and embeds only the definitions it
has not seen, then recomputes the BM25 statistics, in a worker thread. Imports `sidecar.registry`,
its `sidecar.codemode` siblings, `bm25s`, `Stemmer` and `numpy`. Exports `ToolIndex`,
`ToolIndexes`, `FIELD_WEIGHTS`, `EMBEDDING_SHARE`, `stem`, `query_terms`.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import bm25s
import numpy as np
import Stemmer
from bm25s.stopwords import STOPWORDS_EN_PLUS
from numpy.typing import NDArray

from sidecar.codemode.embedding import TextEmbedder, load_embedder, unit_rows
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
EMBEDDING_SHARE = 0.6
"""The embedding's share of a tool's score, BM25's the rest: BM25 divided by the best tool's
(its floor, 0, is a tool that matches no word), the cosine min-max scaled over the tools; a
convex combination of normalised scores (Bruch et al., "An Analysis of Fusion Functions for
Hybrid Retrieval", 2023). Chosen on the tuning tasks alone (0.5-0.7 did about as well there)."""
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


def _summary(description: str) -> str:
    return _SENTENCE_END.split(description.strip(), maxsplit=1)[0]


def _document(name: str, entry: Entry) -> tuple[list[str], ...]:
    d = entry.definition
    return (
        query_terms(name), query_terms(d.title or ""),
        query_terms(_parameter_text(d.input_schema)), query_terms(d.description),
        query_terms(_summary(d.description)), query_terms(_server_of(entry)),
    )


def _embedded_texts(name: str, entry: Entry) -> tuple[str, str]:
    """What a tool's vector sums: its name's words with its first sentence, and with its whole
    description. (Its parameters, added as a third text, ranked the tuning tasks worse; they
    count in the BM25 part.)"""
    words = " ".join(tokens(name))
    description = entry.definition.description
    return f"{words}. {_summary(description)}", f"{words}. {description}"


Vector = NDArray[np.float32]


@dataclass(frozen=True, slots=True)
class _Tokenized:
    definition: ToolDefinition
    origin: str
    fields: tuple[list[str], ...]
    vector: Vector | None = None


Signature = tuple[int, int, int]


def _signature(entries: Mapping[str, Entry]) -> Signature:
    """Names and definitions by identity: an index holds its definitions, so while it is kept
    no other definition can take one of their ids."""
    return len(entries), hash(tuple(entries)), hash(tuple(id(e.definition)
                                                           for e in entries.values()))


def _unit_sum(pairs: Vector) -> Vector:
    """Each tool's texts' vectors (rows `2i`, `2i + 1`) summed and scaled to length 1."""
    return unit_rows(pairs[0::2] + pairs[1::2])


def _fused(bm25: Vector, cosine: Vector) -> Vector:
    """`EMBEDDING_SHARE` of the cosine scaled to [0, 1], the rest of BM25 over the best."""
    peak = float(bm25.max())
    low, high = float(cosine.min()), float(cosine.max())
    words = bm25 / peak if peak > 0 else bm25
    meaning = (cosine - low) / (high - low) if high > low else np.zeros_like(cosine)
    return (1 - EMBEDDING_SHARE) * words + EMBEDDING_SHARE * meaning


class ToolIndex:
    """The BM25 fields and the vectors of one set of entries, built once (in a worker thread),
    searched many times. Immutable once built. `embedder`: the model (`"shared"`: the one
    `load_embedder` gives; None: BM25 alone)."""

    __slots__ = ("_embedder", "_retriever", "_vectors", "definitions", "names", "signature",
                 "tokenized")

    def __init__(
        self, entries: Mapping[str, Entry], seen: Mapping[str, _Tokenized], *,
        embedder: TextEmbedder | Literal["shared"] | None = "shared",
    ) -> None:
        self.names = tuple(entries)
        self.definitions = tuple(e.definition for e in entries.values())
        self.signature = _signature(entries)
        model = load_embedder() if embedder == "shared" else embedder
        self._embedder = model
        tokenized: dict[str, _Tokenized] = {}
        unembedded: list[str] = []
        for name, entry in entries.items():
            known = seen.get(name)
            if known is None or known.definition is not entry.definition or (
                known.origin != entry.origin
            ):
                known = _Tokenized(entry.definition, entry.origin, _document(name, entry))
            if model is not None and known.vector is None:
                unembedded.append(name)
            tokenized[name] = known
        if model is not None and unembedded:
            texts = [text for name in unembedded for text in _embedded_texts(name, entries[name])]
            for name, vector in zip(unembedded, _unit_sum(model.embed(texts)), strict=True):
                old = tokenized[name]
                tokenized[name] = _Tokenized(old.definition, old.origin, old.fields, vector)
        self.tokenized: Mapping[str, _Tokenized] = tokenized
        self._vectors: Vector | None = None
        if model is not None and tokenized:
            self._vectors = np.stack([t.vector for t in tokenized.values()
                                      if t.vector is not None])
        self._retriever: bm25s.BM25 | None = None
        repeats = [FIELD_WEIGHTS[field] for field in FIELDS]
        corpus = [[term for times, words in zip(repeats, t.fields, strict=True)
                   for _ in range(times) for term in words] for t in tokenized.values()]
        if any(corpus):  # bm25s needs one term at least
            self._retriever = bm25s.BM25()
            self._retriever.index(corpus, show_progress=False)

    def search(
        self, query: str, limit: int, *, glossary: Mapping[str, tuple[str, ...]] = SYNONYMS,
        embedding: bool = True,
    ) -> list[tuple[str, float]]:
        """The best `limit` (name, score) pairs for `query`, best first; ties by name. A query
        of stop words alone finds nothing. `glossary` is the query's synonyms (`SYNONYMS`;
        the benchmark also ranks without), `embedding=False` ranks by BM25 alone."""
        words = [t for t in tokens(query) if t not in STOP_WORDS]
        terms = list(dict.fromkeys(stem(t) for t in words))
        if not terms or not self.names or limit <= 0:
            return []
        total = self._bm25(words, terms, glossary)
        if embedding and self._vectors is not None and self._embedder is not None:
            total = _fused(total, self._vectors @ self._embedder.embed([query])[0])
        found = np.flatnonzero(total > 0)
        if found.size > limit:
            found = found[np.argpartition(-total[found], limit - 1)[:limit]]
        ranked = sorted(found.tolist(), key=lambda i: (-float(total[i]), self.names[i]))
        return [(self.names[i], float(total[i])) for i in ranked[:limit]]

    def _bm25(self, words: list[str], terms: list[str],
              glossary: Mapping[str, tuple[str, ...]]) -> Vector:
        total = np.zeros(len(self.names), dtype=np.float32)
        retriever = self._retriever
        if retriever is None:
            return total
        extra = [stem(s) for t in words for s in glossary.get(t, glossary.get(stem(t), ()))]
        synonyms = [s for s in dict.fromkeys(extra) if s not in terms]
        for chosen, share in ((terms, 1.0), (synonyms, SYNONYM_WEIGHT)):
            known = [t for t in chosen if t in retriever.vocab_dict]
            if known:
                total += share * retriever.get_scores(known)
        return total


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


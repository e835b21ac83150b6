"""Token counts of tool definitions, counted in a thread and kept per definition value.

A `ToolDefinition` is immutable and shared by every snapshot taken while the registry is
unchanged, so its count is computed once: a listing of 5,000 tools counts only the
definitions it has not seen (~0.3 s of a worker thread for all 5,000, while the event loop
serves requests), then answers from the cache. Counting is serialized, so two listings at
once never count the same definitions twice.

Imports `sidecar.model` and this package. Exports `DefinitionTokens` and `definition_tokens`
(the process's cache).
"""

from __future__ import annotations

import asyncio
import threading
from collections import OrderedDict
from collections.abc import Sequence

from sidecar.model.token_count import count_tokens, definition_text
from sidecar.registry.registry import ToolDefinition

DEFAULT_SIZE = 20_000
"""Definitions whose counts are kept (least recently used go first)."""


class DefinitionTokens:
    """Tokens of each definition as the model is shown it (`definition_text`)."""

    def __init__(self, size: int = DEFAULT_SIZE) -> None:
        self._size = size
        # id(definition) -> (the definition, kept alive so its id is not reused; its tokens)
        self._counts: OrderedDict[int, tuple[ToolDefinition, int]] = OrderedDict()
        self._lock = threading.Lock()  # held briefly, by the loop or the counting thread
        self._counting = threading.Lock()  # one counting thread at a time

    async def count(self, definitions: Sequence[ToolDefinition]) -> list[int]:
        """The tokens of each of `definitions`, in order (counted in a thread when new)."""
        while True:
            with self._lock:
                found = [self._counts.get(id(d)) for d in definitions]
                if all(entry is not None for entry in found):
                    for definition in definitions:
                        self._counts.move_to_end(id(definition))
                    while len(self._counts) > max(self._size, len(definitions)):
                        self._counts.popitem(last=False)
                    return [entry[1] for entry in found if entry is not None]
            await asyncio.to_thread(self._fill, definitions)

    def _fill(self, definitions: Sequence[ToolDefinition]) -> None:
        with self._counting:
            with self._lock:
                missing = list({id(d): d for d in definitions
                                if id(d) not in self._counts}.values())
            counted = _count_all(missing)
            with self._lock:
                for definition, tokens in zip(missing, counted, strict=True):
                    self._counts[id(definition)] = (definition, tokens)

    def __len__(self) -> int:
        return len(self._counts)


def _count_all(definitions: Sequence[ToolDefinition]) -> list[int]:
    return [count_tokens(definition_text(d.name, d.description, d.input_schema))
            for d in definitions]


definition_tokens = DefinitionTokens()
"""The process's cache: definitions are values, so every Location and frontend shares it."""

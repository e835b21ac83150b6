"""Values derived from a snapshot's tool definitions, reused while the registry is unchanged
(`ListingCache`): provider listings for `/v1`, the MCP facade's `tools/list`.
`ToolDefinition` values are immutable and shared by every snapshot taken while the registry is
unchanged, so the identities of a snapshot's definitions (kept alive in the entry) key anything
computed from them.

    cache = ListingCache[list[dict]]()
    wire = cache.get(("openai", False), snapshot.definitions, lambda: convert(...))

Imports nothing of ours. Exports `ListingCache`.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Generic, TypeVar

T = TypeVar("T")


class ListingCache(Generic[T]):
    """The last `size` values, each keyed by a tag and its definitions' identities. Cached
    values are shared: callers only serialize them, never change them."""

    def __init__(self, size: int = 32) -> None:
        self._size = size
        self._entries: OrderedDict[tuple[Any, ...], tuple[Sequence[Any], T]] = OrderedDict()

    def get(self, tag: Any, definitions: Sequence[Any], build: Callable[[], T]) -> T:
        key = (tag, *map(id, definitions))
        hit = self._entries.get(key)
        if hit is not None:
            self._entries.move_to_end(key)
            return hit[1]
        value = build()
        self._entries[key] = (definitions, value)
        while len(self._entries) > self._size:
            self._entries.popitem(last=False)
        return value

    def __len__(self) -> int:
        return len(self._entries)

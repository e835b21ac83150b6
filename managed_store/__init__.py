"""managed_store: complete texts too big for a model's context, kept on disk by opaque id.

A standalone library: it knows nothing of tools, MCP or the seam, and imports nothing of this
project (`tests/test_architecture.py`); the core codes against `TextStore` (`protocol`). See
`docs/managed-store-contract.md` for the contract the core codes against.

    store = await ManagedStore.open(root)
    async with store:
        ref = await store.put(text)
        page = await store.read_lines(ref.id, offset=1, limit=2000)
"""

from managed_store.errors import (
    InvalidRef,
    ManagedNotFound,
    ManagedStoreError,
    OwnerLimitExceeded,
    OwnerShareExceeded,
    RetentionError,
    SearchTimeout,
    StoreClosed,
    StoreInUse,
)
from managed_store.index import StagedStats, StoreStats
from managed_store.line_chars import LineChars
from managed_store.pattern import MAX_PATTERN_CHARS, InvalidPattern
from managed_store.protocol import FdSpool, TextSpool, TextStore
from managed_store.reading import GrepMatch, GrepResult, TextSlice
from managed_store.refs import ManagedRef
from managed_store.retention import OwnerLimits
from managed_store.search import SearchLimits, TooManySearches
from managed_store.spool import Drained, SpoolWriter
from managed_store.store import ManagedStore

__all__ = [
    "MAX_PATTERN_CHARS",
    "Drained",
    "FdSpool",
    "GrepMatch",
    "GrepResult",
    "InvalidPattern",
    "InvalidRef",
    "LineChars",
    "ManagedNotFound",
    "ManagedRef",
    "ManagedStore",
    "ManagedStoreError",
    "OwnerLimitExceeded",
    "OwnerLimits",
    "OwnerShareExceeded",
    "RetentionError",
    "SearchLimits",
    "SearchTimeout",
    "SpoolWriter",
    "StagedStats",
    "StoreClosed",
    "StoreInUse",
    "StoreStats",
    "TextSlice",
    "TextSpool",
    "TextStore",
    "TooManySearches",
]

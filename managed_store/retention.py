"""Retention policy: how long objects live and how many bytes they may take together.

Eviction is oldest first (by `created_at`) for both rules. The policy only chooses victims;
the store deletes their rows and files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from managed_store.errors import RetentionError
from managed_store.index import Index
from managed_store.refs import ManagedRef


@dataclass(frozen=True, slots=True)
class RetentionPolicy:
    """`ttl_seconds` may be `math.inf` (never expire); `quota_bytes` is a hard upper bound."""

    ttl_seconds: float
    quota_bytes: int

    def __post_init__(self) -> None:
        if not self.ttl_seconds > 0:
            raise ValueError(f"ttl_seconds must be > 0, got {self.ttl_seconds!r}")
        if isinstance(self.quota_bytes, bool) or not isinstance(self.quota_bytes, int):
            raise TypeError(f"quota_bytes must be an int, got {self.quota_bytes!r}")
        if self.quota_bytes < 0:
            raise ValueError(f"quota_bytes must be >= 0, got {self.quota_bytes!r}")

    def check_fits(self, size_bytes: int) -> None:
        """Raise `RetentionError` if an object of this size could never be stored."""
        if size_bytes > self.quota_bytes:
            raise RetentionError(
                f"object needs at least {size_bytes} bytes but the store quota is "
                f"{self.quota_bytes} bytes"
            )

    def expired(self, index: Index, now: float) -> list[ManagedRef]:
        if math.isinf(self.ttl_seconds):
            return []
        return index.created_before(now - self.ttl_seconds)

    def over_quota(self, index: Index, incoming_bytes: int) -> list[ManagedRef]:
        """Oldest objects to evict so that `incoming_bytes` more fit under the quota."""
        excess = index.totals().bytes + incoming_bytes - self.quota_bytes
        return index.oldest_covering(excess) if excess > 0 else []

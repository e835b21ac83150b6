"""`MemorySnapshotRecords`: `SnapshotRecords` (`sidecar.stores.snapshot_records`) in this
process's memory (tests; Locations in one process), with the same expiry and caps as the
fleet's.

Imports `sidecar.stores`. Exports `MemorySnapshotRecords`.
"""

from __future__ import annotations

import time

from sidecar.stores.snapshot_records import SnapshotLimits, SnapshotRecipe, StoredSnapshot

__all__ = ["MemorySnapshotRecords"]


class MemorySnapshotRecords:
    """`SnapshotRecords` in this process's memory (tests; Locations in one process)."""

    def __init__(self) -> None:
        self._rows: dict[tuple[str, str], tuple[float, StoredSnapshot]] = {}

    async def put(self, location: str, snapshot_id: str, recipe: SnapshotRecipe, digest: str,
                  limits: SnapshotLimits) -> None:
        now = time.monotonic()
        self._rows = {k: v for k, v in self._rows.items() if v[0] > now}
        self._rows[(location, snapshot_id)] = (
            now + limits.ttl_seconds, StoredSnapshot(snapshot_id, recipe, digest, 0.0))
        mine = [k for k in self._rows if k[0] == location]  # insertion order: oldest first
        own = [k for k in mine if self._rows[k][1].recipe.session_id == recipe.session_id]
        for key in own[: max(0, len(own) - limits.max_per_session)]:
            del self._rows[key]
            mine.remove(key)
        if recipe.owner is not None:
            owned = [k for k in mine if self._rows[k][1].recipe.owner == recipe.owner]
            for key in owned[: max(0, len(owned) - limits.max_per_owner)]:
                del self._rows[key]
                mine.remove(key)
        while len(mine) > limits.max_count:
            counts: dict[str | None, int] = {}
            for key in mine:
                session = self._rows[key][1].recipe.session_id
                counts[session] = counts.get(session, 0) + 1
            largest = max(counts, key=lambda s: counts[s])
            oldest = next(k for k in mine if self._rows[k][1].recipe.session_id == largest)
            del self._rows[oldest]
            mine.remove(oldest)

    async def get(self, location: str, snapshot_id: str) -> StoredSnapshot | None:
        row = self._rows.get((location, snapshot_id))
        if row is None or row[0] <= time.monotonic():
            return None
        expires, stored = row
        return StoredSnapshot(stored.id, stored.recipe, stored.digest,
                              expires - time.monotonic())

    async def aclose(self) -> None:
        self._rows.clear()

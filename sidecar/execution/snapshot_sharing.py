"""A Location's snapshots by id across the replicas of a fleet: its local `SnapshotStore`
first, then the shared `SnapshotRecords` (`sidecar.stores.snapshot_records`). A snapshot made
on another replica is rebuilt here from its recipe and refused (never silently substituted)
when this replica's definitions of its tools differ from the ones it advertised.

Imports `sidecar.execution.snapshot`, `sidecar.registry`, `sidecar.stores`. Exports
`SnapshotSharing`, `Rebuild`, `definitions_digest` and `limits_of`.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from sidecar.execution.snapshot import Snapshot, SnapshotExpired, SnapshotStore
from sidecar.registry.registry import ToolDefinition
from sidecar.stores.snapshot_records import SnapshotLimits, SnapshotRecipe, SnapshotRecords

__all__ = ["Rebuild", "SnapshotSharing", "definitions_digest", "limits_of"]


def limits_of(store: SnapshotStore) -> SnapshotLimits:
    """The shared records' limits: the same as the local `SnapshotStore`'s."""
    return SnapshotLimits(store.ttl_seconds, store.max_count, store.max_per_session,
                          store.max_per_owner)


def _canonical(definitions: Sequence[ToolDefinition]) -> bytes:
    ordered = sorted((d.to_json() for d in definitions), key=lambda d: str(d["name"]))
    return json.dumps(ordered, sort_keys=True, separators=(",", ":"),
                      ensure_ascii=False).encode("utf-8", "surrogatepass")


def definitions_digest(definitions: Sequence[ToolDefinition]) -> str:
    """A digest of what a model was shown for these tools (order does not matter)."""
    return hashlib.sha256(_canonical(definitions)).hexdigest()


class _DigestCache:
    """Digests of recent definition tuples, keyed by identity: definitions are immutable and
    shared while the registry is unchanged, so 5,000 schemas are serialized once per registry
    state (in a thread), not once per snapshot."""

    def __init__(self, size: int = 16) -> None:
        self._size = size
        self._items: OrderedDict[tuple[int, ...], tuple[Sequence[ToolDefinition], str]] = (
            OrderedDict())

    async def digest(self, definitions: Sequence[ToolDefinition]) -> str:
        key = tuple(map(id, definitions))
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
            return hit[1]
        value = await asyncio.to_thread(definitions_digest, definitions)
        self._items[key] = (definitions, value)  # keeps them alive: ids stay theirs
        while len(self._items) > self._size:
            self._items.popitem(last=False)
        return value


Rebuild = Callable[[SnapshotRecipe], tuple[Snapshot, tuple[ToolDefinition, ...]]]
"""Makes a snapshot from a recipe on this replica; returns it and the definitions it captured
(raises `SnapshotExpired` when a captured tool is gone)."""


class SnapshotSharing:
    """A Location's snapshots by id: its local `SnapshotStore` first (what this replica made
    or rebuilt), then the shared records. A rebuilt snapshot is kept locally under the same id
    for the time the record has left, within the local caps."""

    def __init__(self, local: SnapshotStore, records: SnapshotRecords | None, location: str,
                 rebuild: Rebuild) -> None:
        self.local = local
        self.records = records
        self.location = location
        self._rebuild = rebuild
        self._digests = _DigestCache()

    async def share(self, snapshot: Snapshot) -> None:
        """Make a kept snapshot usable on every replica (nothing without records)."""
        recipe = snapshot.recipe
        if self.records is None or recipe is None:
            return
        digest = await self._digests.digest(recipe.definitions)
        await self.records.put(self.location, snapshot.id, recipe, digest,
                               limits_of(self.local))

    async def find(self, snapshot_id: str) -> Snapshot:
        """The snapshot with this id, made here or on another replica; `SnapshotExpired`
        when no replica keeps it, or when this replica's tools differ from the ones it
        advertised."""
        try:
            return self.local.get(snapshot_id)
        except SnapshotExpired:
            if self.records is None:
                raise
            stored = await self.records.get(self.location, snapshot_id)
            if stored is None:
                raise
        snapshot, definitions = self._rebuild(stored.recipe)
        if await self._digests.digest(definitions) != stored.digest:
            raise SnapshotExpired(
                f"snapshot {snapshot_id!r} was made on another replica whose definitions of "
                f"its tools differ from this replica's (an upstream server changed, or the "
                f"replicas load different manifests); create a new snapshot")
        snapshot.id = stored.id
        snapshot.created_at = time.monotonic() - max(
            0.0, self.local.ttl_seconds - stored.expires_in)
        return self.local.add(snapshot)

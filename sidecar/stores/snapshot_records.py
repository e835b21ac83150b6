"""Snapshots any replica can use: what a snapshot was made of (its recipe), stored by id.

A snapshot holds live tool values, so it cannot travel; what travels is its recipe: the
profile, Code Mode setting, final-step and strict flags, session and owner it was taken for,
the names it captured and removed, and a digest of the captured definitions. A replica that
is asked for a snapshot another replica made rebuilds it from the recipe against its own
registry and refuses (never silently substitutes) when its definitions of those tools differ
from the advertised ones.

    SnapshotRecords   where recipes are kept, by (Location, id), with expiry and caps
    SnapshotSharing   a Location's local `SnapshotStore` in front of its `SnapshotRecords`

Without records (the embedded default) snapshots live in the process's memory only.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from sidecar.execution.snapshot import Snapshot, SnapshotExpired, SnapshotStore
from sidecar.model.errors import SidecarError
from sidecar.registry.registry import ToolDefinition

__all__ = [
    "MemorySnapshotRecords",
    "SnapshotLimits",
    "SnapshotRecipe",
    "SnapshotRecords",
    "SnapshotRecordsError",
    "SnapshotSharing",
    "StoredSnapshot",
    "definitions_digest",
]


class SnapshotRecordsError(SidecarError):
    """The shared records cannot be reached or written (the fleet database is down)."""


@dataclass(frozen=True, slots=True)
class SnapshotRecipe:
    """How a snapshot was made: enough for any replica to make it again."""

    session_id: str | None
    profile: str | None
    mode: str
    """The Code Mode setting it was taken with ("direct", "codemode", "both")."""
    final_step: bool
    strict: bool
    """Its definitions were advertised in OpenAI strict mode (calls map nulls back)."""
    names: tuple[str, ...]
    """The captured tools (before Code Mode splits them)."""
    removed: tuple[str, ...]
    """Names taken out of this request (calling them fails `unavailable`)."""
    owner: str | None = None
    """The client it counts against per owner (`Snapshot.owner`: a scoped token)."""
    definitions: tuple[ToolDefinition, ...] = field(default=(), compare=False, repr=False)
    """The captured definitions (for the digest; never stored)."""


@dataclass(frozen=True, slots=True)
class StoredSnapshot:
    """One kept recipe."""

    id: str
    recipe: SnapshotRecipe
    digest: str
    expires_in: float
    """Seconds left to live (by the store's clock)."""


@dataclass(frozen=True, slots=True)
class SnapshotLimits:
    """The same limits as the local `SnapshotStore`: a TTL, a cap per session, per owner
    (over all its sessions) and in all (past the total cap, the session holding the most loses
    its oldest)."""

    ttl_seconds: float
    max_count: int
    max_per_session: int
    max_per_owner: int = 512

    @classmethod
    def of(cls, store: SnapshotStore) -> SnapshotLimits:
        return cls(store.ttl_seconds, store.max_count, store.max_per_session,
                   store.max_per_owner)


class SnapshotRecords(Protocol):
    """Recipes by (Location, snapshot id), shared by every replica on one backend."""

    async def put(self, location: str, snapshot_id: str, recipe: SnapshotRecipe, digest: str,
                  limits: SnapshotLimits) -> None:
        """Keep a recipe for `limits.ttl_seconds`, then apply the caps (oldest first: the
        session's, the owner's when `recipe.owner` is set, then the total);
        `SnapshotRecordsError` when the backend fails."""
        ...

    async def get(self, location: str, snapshot_id: str) -> StoredSnapshot | None:
        """The recipe kept under this id, or None (never kept, expired or evicted);
        `SnapshotRecordsError` when the backend fails."""
        ...

    async def aclose(self) -> None: ...


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
                               SnapshotLimits.of(self.local))

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

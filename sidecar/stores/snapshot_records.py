"""The snapshot records' port: what a kept snapshot was made of (its recipe), stored by
(Location, id) so any replica of a fleet can serve any snapshot id.

A snapshot holds live tool values, so it cannot travel; its recipe does: the profile, Code
Mode setting, final-step and strict flags, session and owner it was taken for, the names it
captured and removed, and a digest of the captured definitions. Without records (the embedded
default) snapshots live in the process's memory only (`sidecar.execution.snapshot_sharing`).

Imports `sidecar.model` and `sidecar.registry`. Exports `SnapshotRecords`, `SnapshotRecipe`,
`StoredSnapshot`, `SnapshotLimits` and `SnapshotRecordsError`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

from sidecar.model.errors import SidecarError
from sidecar.registry.registry import ToolDefinition

__all__ = [
    "SnapshotLimits",
    "SnapshotRecipe",
    "SnapshotRecords",
    "SnapshotRecordsError",
    "StoredSnapshot",
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
    expose: str = "all"
    """Which tools it lists ("all", "search": `sidecar.codemode.tool_search`)."""
    always: tuple[str, ...] = ()
    """With "search": the profile's globs of tools listed beside the search built-ins."""


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

"""Snapshots: what one model request advertised, paired with the tools captured for it.

Execution always goes through the snapshot's captured entries; registry changes after the
snapshot was taken affect later snapshots only. On a final step the definitions are kept (so a
provider's prompt cache survives) but `tool_choice` is "none" and every call fails
`unavailable`.

Imports `sidecar.model`, `sidecar.registry` and `sidecar.execution.seam`. Exports `Snapshot`,
`SnapshotStore`, `SnapshotExpired`, `select` and `FINAL_STEP_MESSAGE`.
"""

from __future__ import annotations

import fnmatch
import secrets
import time
from collections import OrderedDict
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Literal

from sidecar.execution.seam import Seam, unknown_tool_error
from sidecar.model.errors import CallError, ErrorKind, SidecarError
from sidecar.model.outcome import Outcome
from sidecar.model.tool import ToolContext
from sidecar.registry.registry import Entry, ToolDefinition, sorted_definitions

if TYPE_CHECKING:
    from sidecar.stores.snapshot_records import SnapshotRecipe

FINAL_STEP_MESSAGE = (
    "Tools are disabled on the final step of this turn; answer without calling tools."
)


def _matches(name: str, patterns: Iterable[str]) -> bool:
    return any(fnmatch.fnmatchcase(name, p) for p in patterns)


def select(
    effective: Mapping[str, Entry],
    allow: Iterable[str] | None = None,
    deny: Iterable[str] | None = None,
) -> dict[str, Entry]:
    """The entries whose effective names pass the allow and deny globs."""
    allow = tuple(allow) if allow is not None else None
    deny = tuple(deny or ())
    return {
        name: entry
        for name, entry in effective.items()
        if (allow is None or _matches(name, allow)) and not _matches(name, deny)
    }


class Snapshot:
    """Captured entries + their definitions. `removed` names were taken out of this request
    (by a definitions hook or a deny rule): calling them fails `unavailable`, not
    `unknown_tool`."""

    __slots__ = (
        "_entries", "created_at", "definitions", "final_step", "id", "owner", "profile",
        "recipe", "removed", "seam", "session_id",
    )

    def __init__(
        self,
        seam: Seam,
        entries: Mapping[str, Entry],
        *,
        final_step: bool = False,
        session_id: str | None = None,
        removed: Iterable[str] = (),
    ) -> None:
        self.id = "snap_" + secrets.token_urlsafe(12)
        self.seam = seam
        self.session_id = session_id
        self._entries: Mapping[str, Entry] = MappingProxyType(dict(entries))
        self.definitions: tuple[ToolDefinition, ...] = sorted_definitions(
            self._entries.values()
        )
        self.final_step = final_step
        self.removed = frozenset(removed).difference(self._entries)
        self.created_at = time.monotonic()
        self.profile: str | None = None
        """The profile it was taken through (set by `Location.snapshot`)."""
        self.owner: str | None = None
        """The client it counts against in `SnapshotStore.max_per_owner` (the HTTP API: its
        scoped token, `"token:<id>"`; None: not counted per owner). Set by `Location.snapshot`."""
        self.recipe: SnapshotRecipe | None = None
        """How `Location.snapshot` made it, so another replica can make it again
        (`sidecar.stores.snapshot_records`)."""

    @property
    def tool_choice(self) -> Literal["auto", "none"]:
        return "none" if self.final_step else "auto"

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(d.name for d in self.definitions)

    def entry(self, name: str) -> Entry | None:
        return self._entries.get(name)

    def resolve(self, name: str) -> Entry | CallError:
        """The captured entry for `name`, or the model-visible error a call on it gets."""
        entry = self._entries.get(name)
        if entry is None:
            if name in self.removed:
                return CallError(
                    ErrorKind.UNAVAILABLE, f"Tool {name} is not available for this request."
                )
            return unknown_tool_error(name, self._entries)
        if self.final_step:
            return CallError(ErrorKind.UNAVAILABLE, FINAL_STEP_MESSAGE)
        return entry

    async def execute(self, name: str, raw_input: Any, context: ToolContext) -> Outcome:
        """Run one call through the seam (DESIGN.md steps 1-10)."""
        return await self.seam.execute(self, name, raw_input, context)


class SnapshotExpired(SidecarError):
    """A snapshot id that is unknown, expired or evicted: never a silent fallback."""


class SnapshotStore:
    """Snapshots addressable by id, with a TTL and bounded counts.

    A session keeps at most `max_per_session` snapshots (its own oldest goes first), an owner
    (a scoped token, over all its sessions) at most `max_per_owner` (its own oldest goes
    first), and the store at most `max_count`: past that, the oldest snapshot *of the session
    holding the most* goes, so one client creating snapshots in a loop expires its own, not
    everyone's. (Sessions are named by clients: a client of the all-access token inventing a
    new session per snapshot still competes with the others once `max_count` is reached.)
    """

    def __init__(
        self, *, ttl_seconds: float = 3600.0, max_count: int = 1024, max_per_session: int = 128,
        max_per_owner: int = 512,
    ) -> None:
        self.ttl_seconds = ttl_seconds
        self.max_count = max_count
        self.max_per_session = max_per_session
        self.max_per_owner = max_per_owner
        self._items: OrderedDict[str, Snapshot] = OrderedDict()
        self._by_session: dict[str | None, OrderedDict[str, None]] = {}
        self._by_owner: dict[str, OrderedDict[str, None]] = {}

    def add(self, snapshot: Snapshot) -> Snapshot:
        self._expire()
        self._items[snapshot.id] = snapshot
        own = self._by_session.setdefault(snapshot.session_id, OrderedDict())
        own[snapshot.id] = None
        while len(own) > self.max_per_session:
            self._drop(next(iter(own)))
        if snapshot.owner is not None and snapshot.id in self._items:
            owned = self._by_owner.setdefault(snapshot.owner, OrderedDict())
            owned[snapshot.id] = None
            while len(owned) > self.max_per_owner:
                self._drop(next(iter(owned)))
        while len(self._items) > self.max_count:
            largest = max(self._by_session.values(), key=len)
            self._drop(next(iter(largest)))
        return snapshot

    def get(self, snapshot_id: str) -> Snapshot:
        self._expire()
        snapshot = self._items.get(snapshot_id)
        if snapshot is None:
            raise SnapshotExpired(
                f"snapshot {snapshot_id!r} is unknown or expired (snapshots live "
                f"{self.ttl_seconds:g} s, at most {self.max_per_session} per session, "
                f"{self.max_per_owner} per scoped token and "
                f"{self.max_count} in all); create a new one"
            )
        return snapshot

    def __len__(self) -> int:
        return len(self._items)

    def _drop(self, snapshot_id: str) -> None:
        snapshot = self._items.pop(snapshot_id)
        own = self._by_session[snapshot.session_id]
        del own[snapshot_id]
        if not own:
            del self._by_session[snapshot.session_id]
        owner = snapshot.owner
        owned = self._by_owner.get(owner) if owner is not None else None
        if owner is not None and owned is not None:
            owned.pop(snapshot_id, None)
            if not owned:
                del self._by_owner[owner]

    def _expire(self) -> None:
        limit = time.monotonic() - self.ttl_seconds
        while self._items:
            first = next(iter(self._items.values()))
            if first.created_at >= limit:
                break
            self._drop(first.id)

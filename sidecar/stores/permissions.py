"""The permission store's port: `always` permission replies, kept across restarts, per
Location.

Imports `sidecar.model`. Exports `PermissionStore` and `StoredRule` (implementations:
`sidecar.backends.sqlite.permissions`, `sidecar.backends.postgres.permissions`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from sidecar.model.permissions import PermissionRule

__all__ = ["PermissionStore", "StoredRule"]


@dataclass(frozen=True, slots=True)
class StoredRule:
    """One persisted `always` reply: a session rule, or a Location rule (`session_id` "")."""

    session_id: str
    rule: PermissionRule


class PermissionStore(Protocol):
    """Where `always` replies outlive the process, per Location."""

    async def rules(self, location: str) -> list[StoredRule]:
        """Every rule stored for `location`, oldest first."""
        ...

    async def add(self, location: str, session_id: str, rule: PermissionRule) -> None:
        """Store one rule; it is returned by every later `rules(location)`, after the older
        ones."""
        ...

    async def aclose(self) -> None: ...
